package kernel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/tests/internal/podlab"
)

// flowLog records what the server received on one long-lived flow: every
// 8-byte record is a sequence number, sent every flowInterval.
type flowLog struct {
	mu   sync.Mutex
	last time.Time
	seq  uint64
	n    int
	lost int // UDP: sequence numbers skipped
}

func (f *flowLog) got(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n > 0 && seq > f.seq+1 {
		f.lost += int(seq - f.seq - 1)
	}
	f.seq, f.last = seq, time.Now()
	f.n++
}

func (f *flowLog) snapshot() (time.Time, int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last, f.n, f.lost
}

const flowInterval = 10 * time.Millisecond

// flowServer serves TCP 8080 and UDP 9090 in a pod: it logs each record
// per client address and protocol, and echoes UDP datagrams (so that
// conntrack sees the UDP flow established, as it does the TCP one).
type flowServer struct {
	mu   sync.Mutex
	logs map[string]*flowLog
	ln   net.Listener
	pc   net.PacketConn
}

func (s *flowServer) log(proto string, ip netip.Addr) *flowLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := proto + " " + ip.String()
	if s.logs[k] == nil {
		s.logs[k] = &flowLog{}
	}
	return s.logs[k]
}

func startFlowServer(l *podlab.Lab, p podlab.PodSpec) (*flowServer, error) {
	s := &flowServer{logs: map[string]*flowLog{}}
	err := l.Net.InNetns(podlab.PodEndpoint(p), func() error {
		var err error
		if s.ln, err = net.Listen("tcp4", p.IP.String()+":8080"); err != nil {
			return err
		}
		s.pc, err = net.ListenPacket("udp4", p.IP.String()+":9090")
		return err
	})
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			ip := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			go func() {
				defer c.Close()
				buf := make([]byte, 8)
				for {
					if _, err := io.ReadFull(c, buf); err != nil {
						return
					}
					s.log("tcp", ip).got(binary.BigEndian.Uint64(buf))
				}
			}()
		}
	}()
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := s.pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n == 8 {
				s.log("udp", from.(*net.UDPAddr).AddrPort().Addr().Unmap()).got(binary.BigEndian.Uint64(buf))
				_, _ = s.pc.WriteTo(buf[:n], from)
			}
		}
	}()
	return s, nil
}

func (s *flowServer) close() {
	s.ln.Close()
	s.pc.Close()
}

// startFlows opens one TCP and one UDP flow from the client pod to the
// server and sends a record on each every flowInterval until ctx ends.
func startFlows(ctx context.Context, l *podlab.Lab, c podlab.PodSpec, srv netip.Addr) error {
	var tc, uc net.Conn
	err := l.Net.InNetns(podlab.PodEndpoint(c), func() error {
		var err error
		d := net.Dialer{Timeout: 5 * time.Second}
		if tc, err = d.Dial("tcp4", netip.AddrPortFrom(srv, 8080).String()); err != nil {
			return err
		}
		tc.(*net.TCPConn).SetNoDelay(true)
		uc, err = d.Dial("udp4", netip.AddrPortFrom(srv, 9090).String())
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	go func() {
		defer tc.Close()
		defer uc.Close()
		go func() { _, _ = io.Copy(io.Discard, uc) }() // the echoes
		buf := make([]byte, 8)
		t := time.NewTicker(flowInterval)
		defer t.Stop()
		for seq := uint64(1); ; seq++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			binary.BigEndian.PutUint64(buf, seq)
			_ = tc.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = tc.Write(buf) // a revoked flow's writes only fill the buffer
			_, _ = uc.Write(buf)
		}
	}()
	return nil
}

func ingressFrom(name string, peer *metav1.LabelSelector) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *selector("app", "srv"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: peer}}}}}}
}

// TestRevocation runs long-lived TCP and UDP flows from four clients to
// x/srv and changes what admits them three times: a policy edit, a label
// change, a policy delete that re-opens nothing. After each, the flows the
// change denies must stop (their conntrack entries are deleted; the next
// packet is new and dropped) and the others must go on without one lost
// datagram.
func TestRevocation(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	counts := &revokedCounts{}
	l, err := podlab.New(ctx, podlab.Config{Revoke: true, Revoked: counts})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	l.Namespace("x", nil)
	l.Namespace("y", nil)
	srv := podlab.PodSpec{Namespace: "x", Name: "srv", Node: 0, IP: podlab.PodIP(0, 0), Labels: map[string]string{"app": "srv"}}
	client := func(name string, node, n int, labels ...string) podlab.PodSpec {
		return podlab.PodSpec{Namespace: "y", Name: name, Node: node, IP: podlab.PodIP(node, n), Labels: selector(labels...).MatchLabels}
	}
	c1 := client("c1", 1, 1, "role", "client", "tier", "gold") // denied by the label change
	c2 := client("c2", 0, 2, "role", "client")                 // denied by the policy edit
	c3 := client("c3", 1, 3, "role", "client", "tier", "gold", "name", "c3")
	c4 := client("c4", 0, 4, "role", "client", "tier", "gold") // denied by the delete
	for _, p := range []podlab.PodSpec{srv, c1, c2, c3, c4} {
		if err := l.StartPod(p); err != nil {
			t.Fatal(err)
		}
		l.Know(p)
	}
	l.SetPolicy(ingressFrom("allow", selector("role", "client")))
	l.SetPolicy(ingressFrom("allow-c3", selector("name", "c3")))
	// x/srv sends nothing new: a revoked flow cannot come back as a
	// connection from the server.
	l.SetPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "srv-no-egress"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *selector("app", "srv"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}})
	if err := l.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := startFlowServer(l, srv)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	flowCtx, stopFlows := context.WithCancel(ctx)
	defer stopFlows()
	for _, c := range []podlab.PodSpec{c1, c2, c3, c4} {
		if err := startFlows(flowCtx, l, c, srv.IP); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)

	var stops []time.Duration
	alive := map[string]podlab.PodSpec{"c1": c1, "c2": c2, "c3": c3, "c4": c4}
	for _, step := range []struct {
		name   string
		change func()
		denied string
	}{
		{"policy edit", func() { l.SetPolicy(ingressFrom("allow", selector("role", "client", "tier", "gold"))) }, "c2"},
		{"label change", func() { c1.Labels = map[string]string{"role": "client", "tier": "silver"}; l.Know(c1) }, "c1"},
		{"policy delete", func() { l.DeletePolicy("x", "allow") }, "c4"},
	} {
		before := map[string]int{}
		for name, c := range alive {
			_, n, _ := s.log("udp", c.IP).snapshot()
			before[name] = n
		}
		step.change()
		changed := time.Now()
		if err := l.Publish(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		for name, c := range alive {
			for _, proto := range []string{"tcp", "udp"} {
				last, n, lost := s.log(proto, c.IP).snapshot()
				if name == step.denied {
					if last.After(changed.Add(time.Second)) {
						t.Errorf("%s: %s %s still flowing %v after the change", step.name, name, proto, last.Sub(changed))
					}
					stops = append(stops, max(last.Sub(changed), 0))
					continue
				}
				if last.Before(changed.Add(time.Second)) {
					t.Errorf("%s: allowed %s %s stopped (last record %v after the change)", step.name, name, proto, last.Sub(changed))
				}
				if proto == "udp" && lost != 0 {
					t.Errorf("%s: allowed %s lost %d datagrams", step.name, name, lost)
				}
				if proto == "udp" && n <= before[name] {
					t.Errorf("%s: allowed %s received nothing since the change", step.name, name)
				}
			}
		}
		delete(alive, step.denied)
	}
	if got := counts.total(); got < 6 {
		t.Errorf("%d revoked flows counted, want at least 6 (3 clients, TCP and UDP)", got)
	}
	sort.Slice(stops, func(i, j int) bool { return stops[i] < stops[j] })
	t.Logf("denied flows stopped after the change (publish + revocation + in-flight records): p50 %v, p99 %v, max %v; revoked per policy: %v",
		pct(stops, 50), pct(stops, 99), slices.Max(stops), counts.byPolicy())
}

type revokedCounts struct {
	mu sync.Mutex
	m  map[string]int
}

func (r *revokedCounts) ObserveRevoked(policy string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]int{}
	}
	r.m[policy]++
}

func (r *revokedCounts) ObservePass(_ time.Duration, _ int, err error) {
	if err != nil && !errors.Is(err, context.Canceled) {
		panic(fmt.Sprintf("revocation pass failed: %v", err))
	}
}

func (r *revokedCounts) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.m {
		n += v
	}
	return n
}

func (r *revokedCounts) byPolicy() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.m {
		out[k] = v
	}
	return out
}
