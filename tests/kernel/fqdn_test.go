package kernel

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// fqdnLab is the FQDN lab of a test.
type fqdnLab struct {
	*lab.FQDNLab
	t *testing.T
}

func newFQDNLab(t *testing.T, cfg lab.Config) *fqdnLab {
	requireRoot(t)
	fl, err := lab.NewFQDNLab(testContext(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fl.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &fqdnLab{FQDNLab: fl, t: t}
}

// in is the lab reporting to t: a subtest's failures must be the
// subtest's (a parent's Fatal from a subtest is a misuse, and its Error
// marks the parent, leaving the failing subtest shown as passed).
func (l *fqdnLab) in(t *testing.T) *fqdnLab { return &fqdnLab{FQDNLab: l.FQDNLab, t: t} }

func (l *fqdnLab) mustLookup(name string, v6, tcp bool, want string) {
	l.t.Helper()
	l.mustLookupVia(lab.FQDNServer, name, v6, tcp, want)
}

// mustLookupVia asks the cluster DNS at server, an address of either
// family.
func (l *fqdnLab) mustLookupVia(server netip.Addr, name string, v6, tcp bool, want string) {
	l.t.Helper()
	got, err := l.Lookup(server, name, v6, tcp)
	if err != nil {
		l.t.Fatalf("lookup %s via %s: %v", name, server, err)
	}
	if len(got) != 1 || got[0].String() != want {
		l.t.Fatalf("lookup %s via %s = %v, want %s", name, server, got, want)
	}
}

func (l *fqdnLab) probe(addr string, port uint16) bool {
	l.t.Helper()
	ok, err := l.Net().Probe(context.Background(), l.Pod, netip.MustParseAddr(addr), port, netlab.TCP, time.Second)
	if err != nil {
		l.t.Fatal(err)
	}
	return ok
}

func (l *fqdnLab) expect(addr string, want bool, why string) {
	l.t.Helper()
	if got := l.probe(addr, 80); got != want {
		l.t.Errorf("x/a -> %s:80 connected = %v, want %v (%s)\n%s", addr, got, want, why, l.ListTable("node-1"))
	}
}

func (l *fqdnLab) notLearned(cause string) float64 {
	return counterValue(l.t, l.Agent("node-1").DNS().Metrics, "nftpolicy_dns_replies_not_learned_total", cause)
}

// counterValue reads one series of the learner's metrics.
func counterValue(t *testing.T, m *fqdn.Metrics, name, cause string) float64 {
	t.Helper()
	v, err := lab.FQDNCounter(m, name, cause)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestFQDNLearning runs the domainNames cases against a real DNS server:
// a pod reaches exactly the addresses it resolved, after the lookup.
func TestFQDNLearning(t *testing.T) {
	l := newFQDNLab(t, lab.Config{})
	// Hybrid mode's connection queue holds only pods the agent does not
	// know yet: every connection of this test is decided by the kernel.
	defer func() {
		for _, n := range []string{"node-1", "node-2"} {
			if st, ok := l.QueueStats(n); ok && st.Received > 0 {
				t.Errorf("%s queued %d connection packets of known pods in hybrid mode", n, st.Received)
			}
		}
	}()

	l.expect("192.0.2.10", false, "nothing resolved yet")

	t.Run("exact name, A", func(t *testing.T) {
		l := l.in(t)
		l.mustLookup("www.example.com", false, false, "192.0.2.10")
		l.expect("192.0.2.10", true, "www.example.com resolved")
		l.expect("192.0.2.11", false, "not resolved")
	})
	t.Run("exact name, AAAA", func(t *testing.T) {
		l := l.in(t)
		l.mustLookup("www.example.com", true, false, "2001:db8::10")
		if !l.probe("2001:db8::10", 80) {
			t.Errorf("x/a -> [2001:db8::10]:80 denied after its AAAA lookup\n%s", l.ListTable("node-1"))
		}
	})
	t.Run("AAAA from the DNS server's IPv6 address", func(t *testing.T) {
		l := l.in(t)
		l.expect("2001:db8::11", false, "nothing resolved yet")
		l.mustLookupVia(lab.FQDNServerV6, "v6.example.org", true, false, "2001:db8::11")
		l.expect("2001:db8::11", true, "v6.example.org resolved over IPv6")
		l.expect("2001:db8::12", false, "not resolved")
	})
	t.Run("wildcard", func(t *testing.T) {
		l := l.in(t)
		l.mustLookup("a.b.example.org", false, false, "192.0.2.11")
		l.expect("192.0.2.11", true, "*.example.org matches a.b.example.org (two labels)")
		l.mustLookup("example.org", false, false, "192.0.2.12")
		l.expect("192.0.2.12", false, "*.example.org does not match example.org")
	})
	t.Run("CNAME chain", func(t *testing.T) {
		l := l.in(t)
		l.mustLookup("api.example.com", false, false, "192.0.2.13")
		l.expect("192.0.2.13", true, "api.example.com is an alias of lb.cdn.test")
	})
	t.Run("TCP", func(t *testing.T) {
		l := l.in(t)
		l.mustLookup("tcp.example.org", false, true, "192.0.2.15")
		l.expect("192.0.2.15", true, "answer over TCP, in one segment")
	})
	t.Run("truncated reply", func(t *testing.T) {
		l := l.in(t)
		before := l.notLearned(fqdn.CauseTruncated)
		l.mustLookup("trunc.example.org", false, false, "192.0.2.16")
		l.expect("192.0.2.16", false, "a truncated reply is released but not learned")
		if got := l.notLearned(fqdn.CauseTruncated); got != before+1 {
			t.Errorf("truncated replies counted %v, want %v", got, before+1)
		}
	})
	t.Run("untrusted server", func(t *testing.T) {
		l := l.in(t)
		before := l.notLearned(fqdn.CauseUntrusted)
		got, err := l.Lookup(lab.FQDNRogueServer, "www.example.com", false, false)
		if err != nil || len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.14") {
			t.Fatalf("lookup through the rogue server = %v, %v", got, err)
		}
		l.expect("192.0.2.14", false, "answers of an untrusted server are never learned")
		if got := l.notLearned(fqdn.CauseUntrusted); got != before+1 {
			t.Errorf("untrusted replies counted %v, want %v", got, before+1)
		}
	})
	t.Run("evaluator agrees", func(t *testing.T) {
		l := l.in(t)
		ln := l.Agent("node-1").DNS().Learner
		web := []compile.DomainPattern{{Suffix: "www.example.com"}, {Suffix: "example.org", Wildcard: true}, {Suffix: "api.example.com"}}
		pod := netip.MustParseAddr("10.244.1.10")
		for addr, want := range map[string]bool{"192.0.2.10": true, "192.0.2.11": true, "192.0.2.13": true, "192.0.2.12": false, "192.0.2.14": false, "192.0.2.16": false,
			"2001:db8::11": true, "2001:db8::12": false} {
			if got := ln.Resolved(pod, netip.MustParseAddr(addr), web); got != want {
				t.Errorf("learner: x/a resolved %s = %v, want %v", addr, got, want)
			}
		}
	})
	t.Run("one queued packet per UDP query and reply", func(t *testing.T) {
		l := l.in(t)
		rt := l.Agent("node-1").DNS().Runtime
		before := rt.Stats().Received
		const n = 20
		for i := 0; i < n; i++ {
			l.mustLookup("www.example.com", false, false, "192.0.2.10")
		}
		if got := rt.Stats().Received - before; got != 2*n {
			t.Errorf("DNS queue received %d packets for %d UDP lookups, want two each (the query and the reply)", got, n)
		}
	})
}

// TestFQDNTTLExpiry: once an answer's TTL passed, an established
// connection goes on, a new one is denied until the pod looks up again.
func TestFQDNTTLExpiry(t *testing.T) {
	l := newFQDNLab(t, lab.Config{})
	ext, ok := l.ExternalEndpoint(netip.MustParseAddr("192.0.2.17"))
	if !ok {
		t.Fatal("no external host 192.0.2.17")
	}
	// A server that keeps connections open, on a port of rule "web".
	var ln net.Listener
	if err := l.Net().InNetns(ext, func() error {
		var err error
		ln, err = net.Listen("tcp", "192.0.2.17:8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					s, err := r.ReadString('\n')
					if err != nil {
						return
					}
					fmt.Fprint(c, strings.ToUpper(s))
				}
			}()
		}
	}()
	dial := func() (net.Conn, error) {
		var c net.Conn
		err := l.Net().InNetns(l.Pod, func() error {
			var err error
			c, err = net.DialTimeout("tcp", "192.0.2.17:8080", time.Second)
			return err
		})
		return c, err
	}
	echo := func(c net.Conn) error {
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := fmt.Fprint(c, "ping\n"); err != nil {
			return err
		}
		s, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && s != "PING\n" {
			err = fmt.Errorf("echo %q", s)
		}
		return err
	}
	l.mustLookup("short.example.org", false, false, "192.0.2.17")
	conn, err := dial()
	if err != nil {
		t.Fatalf("connect right after the lookup: %v", err)
	}
	defer conn.Close()
	if err := echo(conn); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3500 * time.Millisecond) // TTL 2 s (the test agents' minimum is 1 s)
	if err := echo(conn); err != nil {
		t.Errorf("established connection after the TTL expired: %v", err)
	}
	if c, err := dial(); err == nil {
		c.Close()
		t.Errorf("a new connection after the TTL expired was allowed\n%s", l.ListTable("node-1"))
	}
	l.mustLookup("short.example.org", false, false, "192.0.2.17")
	c, err := dial()
	if err != nil {
		t.Fatalf("connect after a new lookup: %v", err)
	}
	c.Close()
}

// TestFQDNRace: a pod that connects the instant its lookup returns is never
// denied: the reply is held until the kernel holds its answer. Before each
// lookup the learned set is flushed, so every connect depends on the reply
// just learned.
func TestFQDNRace(t *testing.T) {
	l := newFQDNLab(t, lab.Config{})
	set := compile.FQDNSetName(&l.Agent("node-1").Program.ClusterPolicies[0], 1, true)
	iterations := 1000
	if testing.Short() {
		iterations = 100
	}
	failures := 0
	for i := 0; i < iterations; i++ {
		if out, err := l.Net().NodeExec("node-1", "nft", "flush", "set", "inet", compile.TableName, set); err != nil {
			t.Fatalf("flush %s: %v: %s", set, err, out)
		}
		if _, err := l.Lookup(lab.FQDNServer, "www.example.com", false, false); err != nil {
			t.Fatalf("iteration %d: lookup: %v", i, err)
		}
		if !l.probe("192.0.2.10", 80) {
			failures++
		}
	}
	if failures > 0 {
		t.Errorf("%d of %d connections right after their lookup were denied", failures, iterations)
	}
	t.Logf("%d lookups, each followed at once by a connection: %d denied", iterations, failures)
}

// TestFQDNAgentDown: with no agent on the DNS queue, replies are dropped
// (the lookup times out) or, with --fail-open, delivered unlearned.
func TestFQDNAgentDown(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("failOpen=%v", failOpen), func(t *testing.T) {
			l := newFQDNLab(t, lab.Config{FailOpen: failOpen})
			if err := l.Agent("node-1").StopDNS(); err != nil {
				t.Fatal(err)
			}
			got, err := l.Lookup(lab.FQDNServer, "www.example.com", false, false)
			if !failOpen {
				if err == nil {
					t.Fatalf("fail closed: the lookup got %v while no agent listens", got)
				}
				return
			}
			if err != nil || len(got) != 1 {
				t.Fatalf("fail open: lookup = %v, %v; want the answer", got, err)
			}
			l.expect("192.0.2.10", false, "fail open: the reply passed unlearned")
		})
	}
}
