package lab

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// FloodClientEnv, set in a process's environment, makes it the flooder of
// RunShareFlood: a test binary whose TestMain finds it runs
// FloodClientMain instead of its tests. The flood runs in a process of its
// own, as a pod's does: in the lab's process its threads would share a Go
// runtime (processors, scheduler) with the in-process agents' queue
// readers, and starve them in a way no pod can.
const FloodClientEnv = "NFTPOLICY_LAB_FLOOD_CLIENT"

// ShareFloodConfig configures RunShareFlood.
type ShareFloodConfig struct {
	// Exec is a binary that runs FloodClientMain when FloodClientEnv is in
	// its environment (the test binary: os.Args[0]).
	Exec string
	// Workers is the flooder's threads, each opening connections as fast
	// as it can, for Duration.
	Workers  int
	Duration time.Duration
	// Warmup is how long the flood runs before the client's first
	// connection; the client connects until Duration ends, one connection
	// after another, each bounded by ProbeTimeout.
	Warmup       time.Duration
	ProbeTimeout time.Duration
}

// ShareFloodResult is what RunShareFlood saw.
type ShareFloodResult struct {
	// Sent is how many connections the flooder opened, in Elapsed.
	Sent    int
	Elapsed time.Duration
	// Client holds the client's connections (each one allowed).
	Client []netlab.ProbeResult
	// Received is how many packets node-1's queue runtime read during the
	// flood, the flooder's and the client's: what the queue decided.
	Received uint64
	// ShareDropped is what node-1's kernel dropped over a source's share
	// (the userspace-share chain's counters).
	ShareDropped uint64
	// Overflowed is what node-1's kernel could not queue: its queues'
	// queue_dropped (the queue was full) and user_dropped (the socket
	// buffer was).
	Overflowed queueDrops
}

// queueDrops are a kernel queue's drop counters.
type queueDrops struct{ QueueFull, SocketFull uint64 }

// Total is every packet the kernel could not queue.
func (d queueDrops) Total() uint64 { return d.QueueFull + d.SocketFull }

// ClientOK is how many of the client's connections connected.
func (r ShareFloodResult) ClientOK() int {
	n := 0
	for _, p := range r.Client {
		if p.Connected {
			n++
		}
	}
	return n
}

// RunShareFlood plays the flood of queue mode's share (a lab in queue
// mode): x/srv on node-1 admits role=client pods on 80/TCP; new/flooder on
// node-1, a known pod that is no client (its connections are denied),
// opens connections to x/srv:80 from its own address as fast as its
// cfg.Workers threads can, for cfg.Duration, in a process of its own;
// after cfg.Warmup new/client (role=client, on node-1 too) connects to
// x/srv:80, one connection after another, until the flood ends. Every
// connection's first packet passes node-1's queue.
func (l *Lab) RunShareFlood(ctx context.Context, cfg ShareFloodConfig) (ShareFloodResult, error) {
	var res ShareFloodResult
	if l.rcfg.Mode != compile.ModeQueue {
		return res, fmt.Errorf("the share flood needs a lab in queue mode, not %s", l.rcfg.Mode)
	}
	l.NewPodPolicies()
	l.SetPolicy(srvIngressPolicy())
	srv := PodSpec{Namespace: "x", Name: "srv", IP: PodIP(0, 0), Labels: map[string]string{"app": "srv"}, TCPPorts: []uint16{80}}
	flooder := PodSpec{Namespace: "new", Name: "flooder", IP: PodIP(0, 100), Labels: map[string]string{}}
	client := PodSpec{Namespace: "new", Name: "client", IP: PodIP(0, 1), Labels: map[string]string{"role": "client"}}
	for _, p := range []PodSpec{srv, flooder, client} {
		if err := l.StartPod(p); err != nil {
			return res, err
		}
		l.Know(p)
	}
	if err := l.Publish(ctx); err != nil {
		return res, err
	}
	ns, err := l.net.NetnsPath(flooder.Endpoint())
	if err != nil {
		return res, err
	}
	node := DefaultNodes[0]
	before, _ := l.QueueStats(node)
	overBefore, err := l.queueOverflowed(node)
	if err != nil {
		return res, err
	}
	dropBefore := l.chainDropped(compile.ChainQueueShare)
	dst := netip.AddrPortFrom(srv.IP, 80)
	type flood struct {
		sent    int
		elapsed time.Duration
		err     error
	}
	done := make(chan flood, 1)
	go func() {
		var f flood
		f.sent, f.elapsed, f.err = execFlood(ctx, cfg, ns, netip.AddrPortFrom(flooder.IP, 0), dst)
		done <- f
	}()
	select {
	case <-time.After(cfg.Warmup):
	case f := <-done:
		return res, fmt.Errorf("flood ended early after %v: %v", f.elapsed, f.err)
	}
	req := netlab.ProbeReq{From: client.Endpoint(), To: srv.IP, Port: 80, Proto: netlab.TCP, Timeout: cfg.ProbeTimeout}
	var f flood
	for waiting := true; waiting; {
		p := l.net.ProbeOne(ctx, req)
		if p.Err != nil {
			return res, fmt.Errorf("%v: %w", req, p.Err)
		}
		res.Client = append(res.Client, p)
		select {
		case f = <-done:
			waiting = false
		default:
		}
	}
	if f.err != nil {
		return res, fmt.Errorf("flood: %w", f.err)
	}
	after, _ := l.QueueStats(node)
	overAfter, err := l.queueOverflowed(node)
	if err != nil {
		return res, err
	}
	res.Sent, res.Elapsed, res.Received = f.sent, f.elapsed, after.Received-before.Received
	res.Overflowed = queueDrops{overAfter.QueueFull - overBefore.QueueFull, overAfter.SocketFull - overBefore.SocketFull}
	res.ShareDropped = l.chainDropped(compile.ChainQueueShare) - dropBefore
	return res, nil
}

// queueOverflowed sums the kernel's drop counters of node's connection
// queues, read at once (the runtime's overflow watcher looks once a
// second).
func (l *Lab) queueOverflowed(node string) (queueDrops, error) {
	var d queueDrops
	err := l.net.InNode(node, func() error {
		st, err := queue.ReadKernelQueueStats()
		for _, s := range st {
			if s.QueueNum >= l.rcfg.QueueNum && s.QueueNum < l.rcfg.QueueNum+l.rcfg.Queues {
				d.QueueFull += uint64(s.QueueDropped)
				d.SocketFull += uint64(s.UserDropped)
			}
		}
		return err
	})
	return d, err
}

// execFlood runs the flooder process in the network namespace ns: exe with
// FloodClientEnv set. It returns how many connections it opened and the
// process's run time.
func execFlood(ctx context.Context, cfg ShareFloodConfig, ns string, src, dst netip.AddrPort) (int, time.Duration, error) {
	cmd := exec.CommandContext(ctx, cfg.Exec, "--ns", ns, "--src", src.String(), "--dst", dst.String(),
		"--duration", cfg.Duration.String(), fmt.Sprintf("--workers=%d", cfg.Workers))
	cmd.Env = append(os.Environ(), FloodClientEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)
	if err != nil {
		return 0, elapsed, fmt.Errorf("flooder process: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	n, err := strconv.Atoi(string(bytes.TrimSpace(stdout.Bytes())))
	if err != nil {
		return 0, elapsed, fmt.Errorf("flooder process output %q: %w", stdout.Bytes(), err)
	}
	return n, elapsed, nil
}

// FloodClientMain floods: --workers threads in the network namespace --ns
// open TCP connections to --dst for --duration, each a non-blocking
// connect (the SYN) and a close at once, and it writes how many it opened
// to stdout. It returns the process's exit code.
func FloodClientMain(args []string) int {
	fs := flag.NewFlagSet("flood-client", flag.ContinueOnError)
	ns := fs.String("ns", "", "the flooding pod's network namespace (a path)")
	src := fs.String("src", "", "the flooding pod's address:port (the first source port)")
	dst := fs.String("dst", "", "address:port to connect to")
	duration := fs.Duration("duration", time.Second, "how long to flood")
	workers := fs.Int("workers", 1, "flooding threads")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ap, err := netip.ParseAddrPort(*dst)
	from, err2 := netip.ParseAddrPort(*src)
	if err := errors.Join(err, err2); err != nil || !ap.Addr().Is4() || !from.Addr().Is4() || *ns == "" || *workers < 1 {
		fmt.Fprintf(os.Stderr, "flood-client: need --ns, --src and --dst IPv4 address:port and --workers >= 1 (src %q, dst %q: %v)\n", *src, *dst, err)
		return 2
	}
	deadline := time.Now().Add(*duration)
	counts, errs := make([]int, *workers), make([]error, *workers)
	var wg sync.WaitGroup
	for w := range counts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each thread its own range of source ports.
			start := netip.AddrPortFrom(from.Addr(), from.Port()+uint16(w*(65536-1024) / *workers))
			counts[w], errs[w] = floodThread(*ns, start, ap, deadline)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(os.Stderr, "flood-client: %v\n", err)
		return 1
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	fmt.Println(total)
	return 0
}

// floodThread enters the namespace at nsPath for good
// (netlab.EnterNetnsForGood) and sends TCP SYNs from src to dst through a
// raw socket until deadline, each from the next source port: a new
// connection each, at the cost of one system call (a connect would
// allocate a socket and a port too).
func floodThread(nsPath string, src, dst netip.AddrPort, deadline time.Time) (int, error) {
	if err := netlab.EnterNetnsForGood(nsPath); err != nil {
		return 0, err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return 0, fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	sa := &unix.SockaddrInet4{Addr: dst.Addr().As4()}
	n := 0
	for ; n%64 != 0 || time.Now().Before(deadline); n++ {
		port := uint16(1024 + (int(src.Port())+n)%(65536-1024))
		if err := unix.Sendto(fd, synPacket(netip.AddrPortFrom(src.Addr(), port), dst, uint32(n)), 0, sa); err != nil {
			return n, fmt.Errorf("sendto: %w", err)
		}
	}
	return n, nil
}

// synPacket is an IPv4 packet holding a TCP SYN from src to dst with
// sequence number seq and a correct TCP checksum (the kernel fills the IP
// header's checksum, length and ID).
func synPacket(src, dst netip.AddrPort, seq uint32) []byte {
	var p [40]byte
	p[0], p[8], p[9] = 0x45, 64, unix.IPPROTO_TCP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(p[12:16], s[:])
	copy(p[16:20], d[:])
	tcp := p[20:]
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], seq)
	tcp[12], tcp[13] = 5<<4, 0x02 // data offset 5 words; SYN
	binary.BigEndian.PutUint16(tcp[14:], 64240)
	// Checksum over the pseudo header (addresses, protocol, TCP length)
	// and the TCP header.
	sum := uint32(unix.IPPROTO_TCP) + uint32(len(tcp))
	for _, b := range [][]byte{p[12:20], tcp} {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(tcp[16:], ^uint16(sum))
	return p[:]
}
