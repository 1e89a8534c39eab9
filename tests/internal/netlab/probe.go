package netlab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Proto is a transport protocol for probes.
type Proto string

// Probe protocols.
const (
	TCP Proto = "TCP"
	UDP Proto = "UDP"
)

// DefaultProbeTimeout is used when a probe's timeout is zero.
const DefaultProbeTimeout = 2 * time.Second

// ProbeReq is one connection attempt.
type ProbeReq struct {
	From    Endpoint
	To      netip.Addr
	Port    uint16
	Proto   Proto
	Timeout time.Duration // 0 = DefaultProbeTimeout
}

func (r ProbeReq) String() string {
	return fmt.Sprintf("%v -> %s %s", r.From, netip.AddrPortFrom(r.To, r.Port), r.Proto)
}

// ProbeResult is the outcome of a ProbeReq.
type ProbeResult struct {
	ProbeReq
	// Connected: TCP connected and at least one byte was read; UDP got its
	// datagram echoed back.
	Connected bool
	// Err is set only for harness problems (unknown endpoint, bad request,
	// socket creation failure, cancelled context), never for a blocked flow.
	Err error
	// Reason of a failure: "timeout", "refused", "unreachable", "reset",
	// "denied" (EPERM/EACCES, e.g. a local output drop), "closed" (TCP EOF
	// before any data) or the raw error text.
	Reason string
	// Responder is the name of the pod/external/node whose server answered.
	Responder string
	Duration  time.Duration
	// Sent is when the first packet left: just before connect(2), which
	// sends a TCP SYN (a UDP datagram follows at once). Not when the probe
	// was asked for: creating the socket in the source's namespace hands
	// off to another thread first, which takes a while on a busy machine.
	Sent time.Time
}

// Probe makes one new connection from `from` to to:port and reports whether
// it succeeded. TCP: connect and read one byte; UDP: send one datagram from a
// fresh socket and wait for its echo. err is non-nil only for harness
// problems; a blocked or refused flow is (false, nil). Probe never spawns
// processes and is safe for concurrent use.
func (l *Lab) Probe(ctx context.Context, from Endpoint, to netip.Addr, port uint16, proto Proto, timeout time.Duration) (bool, error) {
	r := l.ProbeOne(ctx, ProbeReq{From: from, To: to, Port: port, Proto: proto, Timeout: timeout})
	return r.Connected, r.Err
}

// ProbeMany runs reqs with at most parallelism probes in flight (<= 0 means
// all at once) and returns the results in request order.
func (l *Lab) ProbeMany(ctx context.Context, reqs []ProbeReq, parallelism int) []ProbeResult {
	res := make([]ProbeResult, len(reqs))
	if parallelism <= 0 || parallelism > len(reqs) {
		parallelism = len(reqs)
	}
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < parallelism; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				res[i] = l.ProbeOne(ctx, reqs[i])
			}
		}()
	}
	for i := range reqs {
		next <- i
	}
	close(next)
	wg.Wait()
	return res
}

// ProbeOne runs a single probe and returns the detailed result.
func (l *Lab) ProbeOne(ctx context.Context, req ProbeReq) (res ProbeResult) {
	res.ProbeReq = req
	start := time.Now()
	defer func() { res.Duration = time.Since(start) }()
	if err := ctx.Err(); err != nil {
		res.Err, res.Reason = err, "cancelled"
		return res
	}
	to := req.To.Unmap()
	if !to.IsValid() || to.Zone() != "" || req.Port == 0 {
		res.Err = fmt.Errorf("netlab: bad probe destination %v port %d", req.To, req.Port)
		return res
	}
	var typ int
	switch Proto(strings.ToUpper(string(req.Proto))) {
	case TCP:
		typ = unix.SOCK_STREAM
	case UDP:
		typ = unix.SOCK_DGRAM
	default:
		res.Err = fmt.Errorf("netlab: bad probe protocol %q", req.Proto)
		return res
	}
	h, err := l.handle(req.From)
	if err != nil {
		res.Err = err
		return res
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	deadline := start.Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}

	var sa unix.Sockaddr
	domain := unix.AF_INET
	if to.Is4() {
		sa = &unix.SockaddrInet4{Port: int(req.Port), Addr: to.As4()}
	} else {
		domain = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(req.Port), Addr: to.As16()}
	}
	fd, err := h.socket(domain, typ)
	if err != nil {
		res.Err = err
		return res
	}
	// connect(2) does not depend on the calling thread's namespace: the
	// socket already belongs to the source namespace.
	res.Sent = time.Now()
	cerr := unix.Connect(fd, sa)
	f := os.NewFile(uintptr(fd), "netlab-probe") // registers with the netpoller
	defer f.Close()
	_ = f.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = f.SetDeadline(time.Now()) })
	defer stop()

	var perr error
	if typ == unix.SOCK_STREAM {
		res.Responder, perr = probeTCP(f, cerr)
	} else {
		res.Responder, perr = probeUDP(f, cerr)
	}
	if perr == nil {
		res.Connected = true
		return res
	}
	if cerr := ctx.Err(); cerr != nil {
		res.Err, res.Reason = cerr, "cancelled"
		return res
	}
	res.Reason = classify(perr)
	return res
}

func probeTCP(f *os.File, cerr error) (string, error) {
	switch {
	case cerr == nil:
	case errors.Is(cerr, unix.EINPROGRESS):
		rc, err := f.SyscallConn()
		if err != nil {
			return "", err
		}
		var soErr error
		werr := rc.Write(func(fd uintptr) bool {
			v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
			if err != nil {
				soErr = err
				return true
			}
			if v != 0 {
				soErr = unix.Errno(v)
				return true
			}
			// Writable without error means connected, but guard against
			// spurious wakeups like the net package does.
			if _, err := unix.Getpeername(int(fd)); err != nil {
				return false
			}
			return true
		})
		if werr != nil {
			return "", werr
		}
		if soErr != nil {
			return "", soErr
		}
	default:
		return "", cerr
	}
	var buf [256]byte
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if bytes.IndexByte(buf[:n], '\n') >= 0 {
			break
		}
		if err != nil {
			if n > 0 && errors.Is(err, io.EOF) {
				break
			}
			if n > 0 {
				break // got data, then reset/timeout: still connected
			}
			if errors.Is(err, io.EOF) {
				return "", io.EOF
			}
			return "", err
		}
	}
	name, _, _ := strings.Cut(string(buf[:n]), "\n")
	return name, nil
}

func probeUDP(f *os.File, cerr error) (string, error) {
	if cerr != nil {
		return "", cerr
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	payload := []byte(udpMagic + hex.EncodeToString(nonce[:]))
	if _, err := f.Write(payload); err != nil {
		return "", err
	}
	want := append(append([]byte(nil), payload...), '\n')
	buf := make([]byte, 512)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return "", err
		}
		if bytes.HasPrefix(buf[:n], want) {
			return string(buf[len(want):n]), nil
		}
		if bytes.Equal(buf[:n], payload) {
			return "", nil // plain echo server
		}
	}
}

func classify(err error) string {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(err, unix.ECONNREFUSED):
		return "refused"
	case errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.ENETUNREACH):
		return "unreachable"
	case errors.Is(err, unix.ECONNRESET):
		return "reset"
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return "denied"
	case errors.Is(err, io.EOF):
		return "closed"
	default:
		return err.Error()
	}
}
