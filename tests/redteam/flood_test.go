package redteam

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	stagedlog "github.com/nftpolicy/nftpolicy/pkg/staged"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

func requireRootFlood(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, nftables, NFQUEUE")
	}
}

// TestRedTeamQueueFlood: a pod floods the queue with connections to unused
// pod-range addresses (lab.QueueFloodAttack: 3,000 a second) while new
// pods start on its node (their first
// connections are held until the agent knows them) and while it connects
// to a new pod whose policy denies it. With either fail mode, the other
// pods' allowed connections must succeed (>= 99%) and no denied connection
// may be admitted.
func TestRedTeamQueueFlood(t *testing.T) {
	requireRootFlood(t)
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("failOpen=%v", failOpen), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			l, err := lab.New(ctx, nil, lab.Config{FailOpen: failOpen})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := l.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			res, err := l.RunQueueFlood(ctx, lab.QueueFloodAttack(failOpen))
			if err != nil {
				t.Fatal(err)
			}
			allowed, ok := res.Allowed()
			var times []time.Duration
			for _, o := range res.Outcomes {
				if o.Want {
					times = append(times, o.Duration)
				}
			}
			admitted := res.Admitted()
			t.Logf("flooder opened %d connections (%d dropped over its share by the kernel, %d by the evaluator); other pods' allowed connections: %d/%d; denied admitted: %d/%d (allowed connections' times %v)",
				res.Sent, res.ShareDropped, res.HeldDropped, ok, allowed, len(admitted), len(res.Outcomes)-allowed, times)
			if ok*100 < allowed*99 {
				t.Errorf("other pods' allowed connections during the flood: %d/%d succeeded, want >= 99%%", ok, allowed)
			}
			for _, o := range admitted {
				t.Errorf("denied connection admitted during the flood: %s", o.ProbeReq)
			}
		})
	}
}

const floodDenyLogScenario = `
namespaces:
  - {name: x}
pods:
  - {namespace: x, name: web, labels: {app: web}, ip: 10.244.1.10, node: node-1}
  - {namespace: x, name: noisy, ip: 10.244.1.11, node: node-1}
  - {namespace: x, name: quiet, ip: 10.244.1.12, node: node-1}
policies:
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: web-deny-all, namespace: x}
    spec: {podSelector: {matchLabels: {app: web}}, policyTypes: [Ingress]}
`

// floodDenyLines keeps the lines of one message (the deny log's or the
// staged log's).
type floodDenyLines struct {
	msg string
	mu  sync.Mutex
	l   []string
}

func (ls *floodDenyLines) Write(b []byte) (int, error) {
	if s := string(b); strings.Contains(s, `"`+ls.msg+`"`) {
		ls.mu.Lock()
		ls.l = append(ls.l, s)
		ls.mu.Unlock()
	}
	return len(b), nil
}

func (ls *floodDenyLines) with(sub string) int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	n := 0
	for _, l := range ls.l {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

// TestRedTeamDenyLogFlood: x/noisy sends denied datagrams to x/web as fast
// as it can (each a new connection, a new denial) for 4 s; meanwhile x/quiet
// tries one denied connection to x/web (two SYNs, both within the flood),
// the same denial (web's isolation).
// Its denial must still be logged: the kernel's log budget is per source,
// so one pod cannot spend another's.
func TestRedTeamDenyLogFlood(t *testing.T) { logFlood(t, false) }

// TestRedTeamStagedLogFlood is TestRedTeamDenyLogFlood with x/web's
// isolation staged: every datagram is allowed, and its connection's first
// packet is copied to the staged log, whose kernel budget is per source
// too.
func TestRedTeamStagedLogFlood(t *testing.T) { logFlood(t, true) }

// logFlood runs the log flood attack on the deny log, or with staged on the
// staged log.
func logFlood(t *testing.T, staged bool) {
	requireRootFlood(t)
	s, err := scenario.Parse([]byte(floodDenyLogScenario))
	if err != nil {
		t.Fatal(err)
	}
	const group, kernelRate = 12, 5
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, msg := lab.Config{DenyLogGroup: group, DenyLogRate: kernelRate}, "Denied connection"
	if staged {
		s.Policies[0].Annotations = map[string]string{compile.StagedAnnotation: "true"}
		cfg, msg = lab.Config{StagedLogGroup: group, StagedLogRate: kernelRate, StagedLogTotalRate: compile.DefaultStagedLogTotalRate}, "Staged verdict"
	}
	c, err := lab.New(ctx, s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Apply(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	got := &floodDenyLines{msg: msg}
	readCfg := denylog.Config{Group: group, FlowInterval: time.Nanosecond, LinesPerSecond: 1000000}
	var stop func() error
	if staged {
		stop, err = c.RunStagedLog(ctx, "node-1", stagedlog.Config{Config: readCfg}, stagedlog.NewMetrics(), got)
	} else {
		stop, err = c.RunDenyLog(ctx, "node-1", readCfg, denylog.NewMetrics(), got)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("deny log reader: %v", err)
		}
	}()
	time.Sleep(300 * time.Millisecond)

	noisy, ok := c.PodEndpoint("x/noisy")
	if !ok {
		t.Fatal("no endpoint for x/noisy")
	}
	web := netip.MustParseAddr("10.244.1.10")
	const floodFor = 4 * time.Second
	var sent atomic.Int64
	flood := make(chan error, 1)
	go func() {
		flood <- c.Net().InNetns(noisy, func() error {
			conn, err := net.ListenUDP("udp4", nil)
			if err != nil {
				return err
			}
			defer conn.Close()
			end := time.Now().Add(floodFor)
			for i := 0; time.Now().Before(end); i++ {
				if _, err := conn.WriteToUDPAddrPort([]byte("x"), netip.AddrPortFrom(web, uint16(10000+i%50000))); err != nil {
					return err
				}
				sent.Add(1)
			}
			return nil
		})
	}()
	time.Sleep(time.Second) // the flood has spent any burst
	// x/quiet: one denied datagram (a new connection) every 200 ms.
	quietEP, ok := c.PodEndpoint("x/quiet")
	if !ok {
		t.Fatal("no endpoint for x/quiet")
	}
	const quietSent = 10
	err = c.Net().InNetns(quietEP, func() error {
		conn, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer conn.Close()
		for i := 0; i < quietSent; i++ {
			if _, err := conn.WriteToUDPAddrPort([]byte("q"), netip.AddrPortFrom(web, uint16(30000+i))); err != nil {
				return err
			}
			time.Sleep(time.Second / kernelRate)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-flood; err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	quiet, noisyLines := got.with(`src="x/quiet"`), got.with(`src="x/noisy"`)
	t.Logf("%s lines during x/noisy's flood of %d datagrams in %v: %d line(s) from x/noisy, %d of %d from x/quiet", msg, sent.Load(), floodFor, noisyLines, quiet, quietSent)

	if quiet < quietSent-1 {
		t.Errorf("x/quiet's connections within its rate: %d of %d logged while x/noisy flooded the log, want at least %d", quiet, quietSent, quietSent-1)
	}
}
