package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// DefaultProbeTimeout bounds the first try of a probe. A connection that
// policies allow answers in milliseconds; a denied one takes the timeout.
const DefaultProbeTimeout = time.Second

// DefaultRetryTimeout bounds the second try of a probe whose first try timed
// out: on a loaded machine an allowed connection can miss a short timeout,
// while a policy drop misses every timeout.
const DefaultRetryTimeout = 2 * time.Second

// ProbeSpec is one new connection between two namespaces of a lab.
type ProbeSpec struct {
	From, To netlab.Endpoint
	Src, Dst netip.Addr
	Port     uint16
	Proto    compile.Protocol
}

func (p ProbeSpec) String() string {
	return fmt.Sprintf("%v (%v) -> %v (%v) %d/%v", p.From, p.Src, p.To, p.Dst, p.Port, p.Proto)
}

// ProbeResult is what real packets did.
type ProbeResult struct {
	// Allowed: TCP connected and the expected server answered; UDP was
	// echoed by it; SCTP: its INIT reached the server's namespace.
	Allowed bool
	// Detail says how: "connected", "timeout" (a policy drop), ...
	Detail string
	// Tries is 1, or 2 when the first try timed out.
	Tries int
	// Err is a harness problem (refused, unreachable, wrong responder,
	// socket errors), not a verdict.
	Err error
}

// Prober runs probes in a lab: TCP and UDP through netlab, SCTP through raw
// sockets (see sctp.go). Its methods are safe for concurrent use.
type Prober struct {
	Lab *netlab.Lab
	// Timeout of a first try and of the retry of a timed-out one; zero
	// means DefaultProbeTimeout and DefaultRetryTimeout. A negative
	// RetryTimeout disables the retry.
	Timeout, RetryTimeout time.Duration

	mu   sync.Mutex
	sctp map[sctpSockKey]*sctpSocket
}

type sctpSockKey struct {
	ep  netlab.Endpoint
	is4 bool
}

// NewProber returns a Prober for lab; Close it to release its SCTP sockets.
func NewProber(lab *netlab.Lab) *Prober {
	return &Prober{Lab: lab, sctp: map[sctpSockKey]*sctpSocket{}}
}

// Close closes the raw SCTP sockets.
func (p *Prober) Close() {
	p.mu.Lock()
	socks := p.sctp
	p.sctp = map[sctpSockKey]*sctpSocket{}
	p.mu.Unlock()
	for _, s := range socks {
		s.close()
	}
}

// Forget closes the SCTP sockets of an endpoint about to be removed.
func (p *Prober) Forget(ep netlab.Endpoint) {
	p.mu.Lock()
	var socks []*sctpSocket
	for k, s := range p.sctp {
		if k.ep == ep {
			socks = append(socks, s)
			delete(p.sctp, k)
		}
	}
	p.mu.Unlock()
	for _, s := range socks {
		s.close()
	}
}

// ListenSCTP opens the raw SCTP socket of ep for one family now, so that an
// INIT sent right after is not missed.
func (p *Prober) ListenSCTP(ep netlab.Endpoint, is4 bool) error {
	_, err := p.sctpSocket(ep, is4)
	return err
}

func (p *Prober) sctpSocket(ep netlab.Endpoint, is4 bool) (*sctpSocket, error) {
	k := sctpSockKey{ep, is4}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.sctp[k]; s != nil {
		return s, nil
	}
	s, err := openSCTPSocket(p.Lab, ep, is4)
	if err != nil {
		return nil, err
	}
	p.sctp[k] = s
	return s, nil
}

func (p *Prober) timeouts() (time.Duration, time.Duration) {
	first, retry := p.Timeout, p.RetryTimeout
	if first <= 0 {
		first = DefaultProbeTimeout
	}
	if retry == 0 {
		retry = DefaultRetryTimeout
	}
	return first, retry
}

// Run runs every probe at once and returns the results in order. Probes that
// time out are tried once more, all at once, with the retry timeout.
func (p *Prober) Run(ctx context.Context, specs []ProbeSpec) []ProbeResult {
	first, retry := p.timeouts()
	res := p.runOnce(ctx, specs, first)
	if retry < 0 {
		return res
	}
	var again []int
	for i, r := range res {
		if r.Err == nil && !r.Allowed {
			again = append(again, i)
		}
	}
	if len(again) == 0 || ctx.Err() != nil {
		return res
	}
	sub := make([]ProbeSpec, len(again))
	for j, i := range again {
		sub[j] = specs[i]
	}
	for j, r := range p.runOnce(ctx, sub, retry) {
		r.Tries = 2
		res[again[j]] = r
	}
	return res
}

// RunOne runs a single try of one probe with the given timeout.
func (p *Prober) RunOne(ctx context.Context, s ProbeSpec, timeout time.Duration) ProbeResult {
	return p.runOnce(ctx, []ProbeSpec{s}, timeout)[0]
}

// Try runs one try of every probe at once with the given timeout.
func (p *Prober) Try(ctx context.Context, specs []ProbeSpec, timeout time.Duration) []ProbeResult {
	return p.runOnce(ctx, specs, timeout)
}

func (p *Prober) runOnce(ctx context.Context, specs []ProbeSpec, timeout time.Duration) []ProbeResult {
	res := make([]ProbeResult, len(specs))
	var reqs []netlab.ProbeReq
	var reqIdx []int
	var wg sync.WaitGroup
	for i, s := range specs {
		res[i].Tries = 1
		switch s.Proto {
		case compile.ProtoTCP, compile.ProtoUDP:
			proto := netlab.TCP
			if s.Proto == compile.ProtoUDP {
				proto = netlab.UDP
			}
			reqs = append(reqs, netlab.ProbeReq{From: s.From, To: s.Dst, Port: s.Port, Proto: proto, Timeout: timeout})
			reqIdx = append(reqIdx, i)
		case compile.ProtoSCTP:
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i] = p.probeSCTP(ctx, s, timeout)
			}()
		default:
			res[i].Err = fmt.Errorf("cannot probe protocol %v", s.Proto)
		}
	}
	if len(reqs) > 0 {
		for j, r := range p.Lab.ProbeMany(ctx, reqs, 0) {
			i := reqIdx[j]
			out := &res[i]
			out.Allowed, out.Detail = r.Connected, r.Reason
			switch {
			case r.Err != nil:
				out.Err = r.Err
			case r.Connected && r.Responder != specs[i].To.Name:
				out.Allowed, out.Err = false, fmt.Errorf("answered by %q, not %q", r.Responder, specs[i].To.Name)
			case !r.Connected && r.Reason != "timeout":
				out.Err = fmt.Errorf("connection failed: %s (policies drop silently; is the port served?)", r.Reason)
			}
			if r.Connected {
				out.Detail = "connected"
			}
		}
	}
	wg.Wait()
	return res
}

func (p *Prober) probeSCTP(ctx context.Context, s ProbeSpec, timeout time.Duration) ProbeResult {
	if err := ctx.Err(); err != nil {
		return ProbeResult{Tries: 1, Err: err}
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	from, err := p.sctpSocket(s.From, s.Src.Is4())
	if err != nil {
		return ProbeResult{Tries: 1, Err: err}
	}
	to, err := p.sctpSocket(s.To, s.Dst.Is4())
	if err != nil {
		return ProbeResult{Tries: 1, Err: err}
	}
	ok, detail, err := sctpProbe(from, to, s.Src, s.Dst, s.Port, timeout)
	if err == nil && !ok && ctx.Err() != nil {
		err = ctx.Err()
	}
	return ProbeResult{Allowed: ok, Detail: detail, Tries: 1, Err: err}
}

// errNotObserved is returned by WatchFlip when the new verdict never shows.
var errNotObserved = errors.New("the new verdict was never observed")

// WatchFlip measures enforcement delay: from now on it starts a probe of s
// every interval (each bounded by timeout) and returns the time from since
// to the start of the first probe that observed want, counting only a
// start after which every probe observed want (so a probe that missed its
// timeout on a loaded machine, or one whose packet was already on its way,
// does not count as the change). It stops once the probes started after the
// first observation have finished and agree, or when ctx ends.
func (p *Prober) WatchFlip(ctx context.Context, s ProbeSpec, want bool, since time.Time, interval, timeout time.Duration) (time.Duration, error) {
	type obs struct {
		seq int
		r   ProbeResult
	}
	var starts []time.Time
	var got []*ProbeResult
	results := make(chan obs, 256)
	var inflight sync.WaitGroup
	defer func() {
		go func() { inflight.Wait(); close(results) }()
		go func() {
			for range results { // let the probes in flight finish
			}
		}()
	}()
	launch := func() {
		seq := len(starts)
		starts = append(starts, time.Now())
		got = append(got, nil)
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			results <- obs{seq, p.RunOne(context.WithoutCancel(ctx), s, timeout)}
		}()
	}
	var lastErr error
	// settled returns the first start of the final run of probes that
	// observed want, once every probe has finished, the last did observe
	// want and at least one started after the first observation.
	settled := func() (time.Time, bool) {
		first := -1
		for i, r := range got {
			if r == nil {
				return time.Time{}, false
			}
			if r.Err == nil && r.Allowed == want {
				if first < 0 {
					first = i
				}
			} else {
				first = -1
			}
		}
		if first < 0 || first == len(got)-1 {
			return time.Time{}, false
		}
		return starts[first], true
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	seen := false // some probe observed want: stop launching, let the rest finish
	launch()
	for {
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return 0, fmt.Errorf("%w within %v (last probe error: %v)", errNotObserved, time.Since(since).Round(time.Millisecond), lastErr)
			}
			return 0, fmt.Errorf("%w within %v", errNotObserved, time.Since(since).Round(time.Millisecond))
		case o := <-results:
			r := o.r
			got[o.seq] = &r
			if r.Err != nil {
				lastErr = r.Err
			}
			if r.Err == nil && r.Allowed == want && !seen {
				seen = true
				launch() // at least one probe after the first observation
			}
			if t, ok := settled(); ok {
				return max(t.Sub(since), 0), nil
			}
			if seen {
				// Every probe has finished or is in flight; if the
				// verdict went back, keep watching.
				done := true
				for _, g := range got {
					done = done && g != nil
				}
				if done {
					seen = false
				}
			}
		case <-tick.C:
			if !seen {
				launch()
			}
		}
	}
}
