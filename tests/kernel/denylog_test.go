package kernel

// The deny log on the real kernel: the ruleset logs drops to an NFLOG group
// inside node-1's namespace, and a denylog.Logger reading that group writes
// the lines.

import (
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

const denyLogScenario = `
namespaces:
  - {name: x}
  - {name: y, labels: {team: frontend}}
pods:
  - {namespace: x, name: web, labels: {app: web}, ips: [10.244.1.10, "fd00:10:244:1::10"], node: node-1}
  - {namespace: x, name: db, labels: {app: db}, ips: [10.244.1.11, "fd00:10:244:1::11"], node: node-1}
  - {namespace: y, name: client, ips: [10.244.2.10, "fd00:10:244:2::10"], node: node-2}
policies:
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: default-deny, namespace: x}
    spec: {podSelector: {}, policyTypes: [Ingress]}
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: allow-web, namespace: x}
    spec:
      podSelector: {matchLabels: {app: web}}
      ingress:
        - from: [{namespaceSelector: {matchLabels: {team: frontend}}}]
          ports: [{port: 80}]
probes:
  - {from: {pod: y/client}, to: {pod: x/web}, port: 80}
  - {from: {pod: x/db}, to: {pod: x/web}, port: 80}
  - {from: {ip: "fd00:10:244:1::11"}, to: {ip: "fd00:10:244:1::10"}, port: 80}
`

// lines keeps the log lines that contain match (klog's text format, as
// the agent writes them), not the reader's own messages.
type lines struct {
	match string
	mu    sync.Mutex
	l     []string
}

func (ls *lines) Write(b []byte) (int, error) {
	s := strings.TrimSpace(string(b))
	if !strings.Contains(s, ls.match) {
		return len(b), nil
	}
	ls.mu.Lock()
	ls.l = append(ls.l, s)
	ls.mu.Unlock()
	return len(b), nil
}
func (ls *lines) get() []string {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return append([]string(nil), ls.l...)
}

// take returns the lines so far and forgets them.
func (ls *lines) take() []string {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	out := ls.l
	ls.l = nil
	return out
}

func TestDenyLog(t *testing.T) {
	requireRoot(t)
	s, err := scenario.Parse([]byte(denyLogScenario))
	if err != nil {
		t.Fatal(err)
	}
	const group, kernelRate = 11, 20
	c := newLab(t, s, lab.Config{DenyLogGroup: group, DenyLogRate: kernelRate})
	ctx := testContext(t)
	if _, err := c.Apply(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	// The reader, bound to node-1's namespace, resolving with node-1's program.
	got := &lines{match: `"Denied connection"`}
	m := denylog.NewMetrics()
	stop, err := c.RunDenyLog(ctx, "node-1", denylog.Config{Group: group, FlowInterval: time.Minute, LinesPerSecond: 100}, m, got)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("deny log reader: %v", err)
		}
	}()
	time.Sleep(300 * time.Millisecond) // bound before the first drop

	// One denied connection per family (its SYN retransmitted within the
	// probe's timeout): exactly one line each, naming both pods, their
	// addresses of that family and the policies.
	for _, tc := range []struct {
		probe        int
		srcIP, dstIP string
	}{{1, "10.244.1.11", "10.244.1.10"}, {2, "fd00:10:244:1::11", "fd00:10:244:1::10"}} {
		rep, err := c.Probe(ctx, s, []int{tc.probe})
		if err != nil || rep.Outcomes[0].Err != nil || rep.Outcomes[0].Connected {
			t.Fatalf("denied probe %d: %v %+v", tc.probe, err, rep.Outcomes)
		}
		time.Sleep(300 * time.Millisecond)
		denied := got.take()
		if len(denied) != 1 {
			t.Fatalf("one denied connection from %s: %d lines: %v", tc.srcIP, len(denied), denied)
		}
		t.Logf("the line: %s", denied[0])
		for _, want := range []string{`src="x/db"`, `srcIP="` + tc.srcIP + `"`, `dst="x/web"`, `dstIP="` + tc.dstIP + `"`, `protocol="TCP"`, `port=80`,
			`direction="ingress"`, `policyKind="NetworkPolicy"`, `policy="x/allow-web, x/default-deny"`, `rule="default deny"`, `node="node-1"`} {
			if !strings.Contains(denied[0], want) {
				t.Errorf("line lacks %s: %s", want, denied[0])
			}
		}
	}

	// An allowed connection logs nothing.
	rep, err := c.Probe(ctx, s, []int{0})
	if err != nil || rep.Outcomes[0].Err != nil || !rep.Outcomes[0].Connected {
		t.Fatalf("allowed probe: %v %+v", err, rep.Outcomes)
	}
	time.Sleep(300 * time.Millisecond)
	if n := len(got.get()); n != 0 {
		t.Errorf("an allowed connection logged: %v", got.get())
	}

	// 10,000 denied connections in one second (UDP datagrams to distinct
	// ports: each is a new conntrack entry): the kernel logs at most the source's
	// burst plus its rate for the time taken, the rest is counted by the
	// deny chain's counters; userspace writes no more lines for the same
	// source, destination and policy and counts what it dropped.
	before := testutil.ToFloat64(m.Denied.WithLabelValues(compile.DenyKindNetworkPolicy, "x/allow-web, x/default-deny"))
	ep, ok := c.PodEndpoint("x/db")
	if !ok {
		t.Fatal("no endpoint for x/db")
	}
	web := netip.MustParseAddr("10.244.1.10")
	const flood = 10000
	start := time.Now()
	err = c.Net().InNetns(ep, func() error {
		conn, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer conn.Close()
		for i := 0; i < flood; i++ {
			if _, err := conn.WriteToUDPAddrPort([]byte("x"), netip.AddrPortFrom(web, uint16(20000+i))); err != nil {
				return err
			}
			if i%1000 == 999 {
				time.Sleep(time.Until(start.Add(time.Duration(i+1) * time.Second / flood)))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	time.Sleep(500 * time.Millisecond)
	received := testutil.ToFloat64(m.Denied.WithLabelValues(compile.DenyKindNetworkPolicy, "x/allow-web, x/default-deny")) - before
	limit := float64(kernelRate) + kernelRate*elapsed.Seconds() + 2
	if received < 1 || received > limit {
		t.Errorf("flood of %d in %v: the kernel logged %v messages, want 1..%v", flood, elapsed, received, limit)
	}
	if n := len(got.get()); n != 0 {
		t.Errorf("flood from one source to one destination: %d more lines", n)
	}
	if dropped := testutil.ToFloat64(m.Dropped.WithLabelValues("flow_rate_limit")); dropped < received {
		t.Errorf("userspace dropped %v lines, want at least the flood's %v messages", dropped, received)
	}
	// The deny chain's counters: every datagram dropped, the suppressed
	// ones are the dropped minus the logged.
	info := compile.DenyInfo{Kind: compile.DenyKindNetworkPolicy, Policy: "x/allow-web, x/default-deny", Rule: compile.DenyRuleDefault, Direction: compile.Ingress}
	out, err := c.Net().NodeExec("node-1", "nft", "list", "chain", "inet", compile.TableName, compile.DenyChainName(info.ID()))
	if err != nil {
		t.Fatalf("listing the deny chain: %v: %s", err, out)
	}
	counts := regexp.MustCompile(`counter packets (\d+)`).FindAllStringSubmatch(string(out), -1)
	if len(counts) != 2 {
		t.Fatalf("deny chain counters: %s", out)
	}
	dropped, _ := strconv.Atoi(counts[0][1])
	logged, _ := strconv.Atoi(counts[1][1])
	suppressed := dropped - logged
	t.Logf("flood: %d datagrams in %v; kernel dropped %d, logged %d, suppressed %d; userspace received %v, wrote %d line(s)",
		flood, elapsed.Round(time.Millisecond), dropped, logged, suppressed, received, len(got.get()))
	if dropped < flood || suppressed < flood-int(limit)-5 {
		t.Errorf("kernel counters: %d dropped, %d logged; want at least %d dropped, nearly all suppressed", dropped, logged, flood)
	}
}
