package kernel

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// kernelQueueVariant is what the agent-side probe finds on this kernel.
func kernelQueueVariant(t *testing.T) compile.QueueVariant {
	t.Helper()
	v, err := queuerule.ProbeQueueVariant(context.Background())
	if err != nil {
		t.Fatalf("ProbeQueueVariant: %v", err)
	}
	return v
}

// queueVariants are the variants to run: xt-compat always (it only needs
// nft_compat and xt_NFQUEUE), native where the probe finds the expression.
func queueVariants(t *testing.T) (variants []compile.QueueVariant, native bool) {
	variants = []compile.QueueVariant{compile.QueueXTCompat}
	if kernelQueueVariant(t) == compile.QueueNative {
		variants = append(variants, compile.QueueNative)
		native = true
	}
	return variants, native
}

func received(c *lab.Lab) map[string]queue.Stats {
	out := map[string]queue.Stats{}
	for _, n := range c.Nodes() {
		if st, ok := c.QueueStats(n); ok {
			out[n] = st
		}
	}
	return out
}

// TestQueueMode runs every scenario with all new connections of isolated
// pods decided by the NFQUEUE runtime of their node, each node evaluating
// with the program built for it.
func TestQueueMode(t *testing.T) {
	requireRoot(t)
	variants, native := queueVariants(t)
	for _, variant := range variants {
		for _, f := range scenarioFiles(t) {
			name := strings.TrimSuffix(filepath.Base(f), ".yaml")
			t.Run(string(variant)+"/"+name, func(t *testing.T) {
				t.Parallel()
				s := scenariotest.Load(t, f)
				c := newLab(t, s, lab.Config{Mode: compile.ModeQueue, QueueVariant: variant})
				if _, err := c.Apply(testContext(t), s, false); err != nil {
					if native && variant == compile.QueueXTCompat {
						// ProbeQueueVariant stops at native: xt_NFQUEUE may be absent.
						t.Skipf("kernel with the native queue expression cannot load the xt-compat rule: %v", err)
					}
					t.Fatal(err)
				}
				check(t, c, s, false)
				var total uint64
				for n, st := range received(c) {
					total += st.Received
					if st.MarkLoops != 0 || st.UnparsableDropped != 0 || st.VerdictErrors != 0 {
						t.Errorf("%s: runtime stats %+v", n, st)
					}
				}
				if len(s.Policies) > 0 && total == 0 {
					t.Errorf("no packet was queued: the queue rule is not in the path")
				}
				if variant == compile.QueueXTCompat {
					for _, n := range c.Nodes() {
						if ok, err := c.CompatQueueRuleInstalled(n); !ok || err != nil {
							t.Errorf("%s: xt-compat queue rule installed = %v, %v", n, ok, err)
						}
					}
				}
			})
		}
	}
}

const udpFlowScenario = `
pods:
  - {namespace: x, name: a, labels: {pod: a}, ip: 10.244.1.10, node: node-1}
  - {namespace: y, name: dns, labels: {app: dns}, ip: 10.244.2.53, node: node-2}
policies:
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: out, namespace: x}
    spec:
      podSelector: {}
      policyTypes: [Egress]
      egress: [{ports: [{port: 53, protocol: UDP}, {port: 54, protocol: UDP}]}]
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: in, namespace: y}
    spec:
      podSelector: {}
      ingress: [{ports: [{port: 53, protocol: UDP}, {port: 54, protocol: UDP}]}]
probes:
  - {from: {pod: x/a}, to: {pod: y/dns}, port: 53, protocol: UDP}
  - {from: {pod: x/a}, to: {pod: y/dns}, port: 55, protocol: UDP}
`

// TestQueueUDPFlowQueuedOnce sends several datagrams of one UDP flow,
// isolated on both ends (so both nodes queue), and checks that each node's
// runtime saw only the first: the allow verdict is remembered in the
// conntrack mark. Port 53 is served and answers (the flow becomes
// established); port 54 is not, so conntrack still calls every later
// datagram "new" and only the mark keeps it out of the queue.
func TestQueueUDPFlowQueuedOnce(t *testing.T) {
	requireRoot(t)
	s, err := scenario.Parse([]byte(udpFlowScenario))
	if err != nil {
		t.Fatal(err)
	}
	c := newLab(t, s, lab.Config{Mode: compile.ModeQueue}) // the variant the kernel supports
	check(t, c, s, false)
	ep, _ := c.PodEndpoint("x/a")
	dst := netip.MustParseAddr("10.244.2.53")
	const datagrams = 5
	for _, tc := range []struct {
		port   int
		echoed bool
	}{{53, true}, {54, false}} {
		t.Run(fmt.Sprint(tc.port), func(t *testing.T) {
			before := received(c)
			var conn *net.UDPConn
			if err := c.Net().InNetns(ep, func() error {
				var err error
				conn, err = net.ListenUDP("udp4", nil) // unconnected: ICMP errors are not reported
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, uint16(tc.port)))
			got := 0
			for i := 0; i < datagrams; i++ {
				msg := []byte(fmt.Sprintf("datagram %d", i))
				if _, err := conn.WriteToUDP(msg, to); err != nil {
					t.Fatal(err)
				}
				_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				buf := make([]byte, 64)
				if n, _, err := conn.ReadFromUDP(buf); err == nil && string(buf[:n]) == string(msg) {
					got++
				}
			}
			if want := map[bool]int{true: datagrams, false: 0}[tc.echoed]; got != want {
				t.Errorf("%d of %d datagrams echoed, want %d", got, datagrams, want)
			}
			after := received(c)
			for _, n := range []string{"node-1", "node-2"} {
				if d := after[n].Received - before[n].Received; d != 1 {
					t.Errorf("%s queued %d packets of the flow, want 1 (stats %+v)", n, d, after[n])
				}
				if after[n].MarkLoops != 0 {
					t.Errorf("%s: %d mark loops", n, after[n].MarkLoops)
				}
			}
		})
	}
}

// TestNativeQueueVariant: on a kernel without the nft queue expression
// (CONFIG_NFT_QUEUE off, as on this 6.18 build) a ruleset with the native
// queue statement must fail to load with the kernel's error, and the agent's
// probe must choose xt-compat; on a kernel with it, the native variant must
// load and enforce like the others (TestQueueMode runs it then).
func TestNativeQueueVariant(t *testing.T) {
	requireRoot(t)
	v := kernelQueueVariant(t)
	t.Logf("ProbeQueueVariant: %s", v)
	s := scenariotest.Load(t, "testdata/default-deny.yaml")
	c := newLab(t, s, lab.Config{Mode: compile.ModeQueue, QueueVariant: compile.QueueNative})
	var native bool
	if err := c.Net().InNode("node-1", func() error {
		var err error
		native, err = queuerule.ProbeNativeQueue(context.Background())
		return err
	}); err != nil {
		t.Fatalf("ProbeNativeQueue in node-1: %v", err)
	}
	if native != (v == compile.QueueNative) {
		t.Errorf("ProbeNativeQueue in a node says %v, ProbeQueueVariant says %s", native, v)
	}
	_, err := c.Apply(testContext(t), s, false)
	if v == compile.QueueNative {
		if err != nil {
			t.Fatalf("native queue ruleset on a kernel with the queue expression: %v", err)
		}
		check(t, c, s, false)
		return
	}
	if v != compile.QueueXTCompat {
		t.Fatalf("ProbeQueueVariant = %s, want xt-compat on a kernel without native queue", v)
	}
	if err == nil {
		t.Fatal("native queue ruleset loaded on a kernel whose probe found no queue expression")
	}
	// nft reports the kernel's ENOENT for the unknown "queue" expression
	// against the offending rule.
	msg := err.Error()
	for _, want := range []string{"Could not process rule", "No such file or directory", "queue"} {
		if !strings.Contains(msg, want) {
			t.Errorf("load error lacks %q:\n%s", want, msg)
		}
	}
	t.Logf("expected load failure: %s", firstLines(msg, 4))
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
