package controller

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
)

// TestPolicyCounters: the golden scenario deny-and-allow on node-1, each
// counted rule counting its chain's number of letters plus its place, so
// that sums are checkable against the rules' comments (the test's oracle:
// "ns/name direction[i]" on allow rules, "default deny direction: ns/a,
// ns/b" on default denies). A counted rule the agent did not write there
// (another comment), or where it wrote none, counts for no policy.
func TestPolicyCounters(t *testing.T) {
	rs, counters := renderedRuleCounters(t)
	want := map[PolicyCounterKey]uint64{}
	for _, rc := range counters {
		if rest, ok := strings.CutPrefix(rc.Comment, "default deny "); ok {
			dir, pols, _ := strings.Cut(rest, ": ")
			for _, p := range strings.Split(pols, ", ") {
				want[PolicyCounterKey{p, dir, "denied"}] += rc.Packets
			}
		} else if pol, rest, ok := strings.Cut(rc.Comment, " "); ok && strings.Contains(pol, "/") {
			dir, _, _ := strings.Cut(rest, "[")
			want[PolicyCounterKey{pol, dir, "allowed"}] += rc.Packets
		}
	}
	for _, k := range []PolicyCounterKey{{"x/allow-web", "ingress", "allowed"}, {"x/allow-web", "ingress", "denied"}, {"x/default-deny", "ingress", "denied"}} {
		if want[k] == 0 {
			t.Fatalf("the scenario counts nothing for %v: %v", k, want)
		}
	}
	got := PolicyCounters(counters, ruleAt(rs))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}

	// Rules the agent did not write: another comment at the place of an
	// allow rule, a place past the chain's end, a chain it does not have.
	allow := slices.IndexFunc(counters, func(rc nftnl.RuleCounter) bool { return strings.HasPrefix(rc.Comment, "x/allow-web ingress") })
	if allow < 0 {
		t.Fatal("no counted allow rule of x/allow-web")
	}
	at := counters[allow]
	odd := []nftnl.RuleCounter{
		{Chain: at.Chain, Index: at.Index, Comment: "written by someone else", Packets: 1000},
		{Chain: at.Chain, Index: 10000, Comment: at.Comment, Packets: 1000},
		{Chain: "no-such-chain", Comment: at.Comment, Packets: 1000},
	}
	if diff := cmp.Diff(want, PolicyCounters(append(odd, counters...), ruleAt(rs))); diff != "" {
		t.Errorf("counters with rules the agent did not write (-want +got):\n%s", diff)
	}
	if got := PolicyCounters(counters, func(string, int) *compile.TableRule { return nil }); len(got) != 0 {
		t.Errorf("before the first sync: %v, want none", got)
	}
	if got := PolicyCounters(counters, nil); len(got) != 0 {
		t.Errorf("no rules to read: %v, want none", got)
	}
}

// renderedRuleCounters renders deny-and-allow as node-1 (hybrid mode)
// and gives each rule's counters as a rule dump reads them.
func renderedRuleCounters(t *testing.T) (*compile.Ruleset, []nftnl.RuleCounter) {
	t.Helper()
	rs, err := compile.Render(compile.Build(scenariotest.GoldenInput(t, "../compile/testdata/golden/deny-and-allow.yaml")), compile.RenderConfig{Mode: compile.ModeHybrid})
	if err != nil {
		t.Fatal(err)
	}
	var out []nftnl.RuleCounter
	for _, n := range rs.ChainOrder {
		for i, r := range rs.Chains[n].Rules {
			for _, e := range r.Exprs {
				if e.Kind == compile.ExprCounter {
					rc := nftnl.RuleCounter{Chain: n, Index: i, Packets: uint64(len(n) + i), Bytes: 1}
					if r.Comment != nil {
						rc.Comment = *r.Comment
					}
					out = append(out, rc)
				}
			}
		}
	}
	return rs, out
}

// ruleAt is sets.Syncer.CommittedRule after a sync of rs.
func ruleAt(rs *compile.Ruleset) RuleAt {
	return func(chain string, i int) *compile.TableRule {
		if c := rs.Chains[chain]; c != nil && i >= 0 && i < len(c.Rules) {
			return &c.Rules[i]
		}
		return nil
	}
}

// logLines captures a logger's output, one string per entry.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger(verbosity int) logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, prefix+" "+args)
		l.mu.Unlock()
	}, funcr.Options{Verbosity: verbosity})
}

func (l *logLines) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

// gather runs one scrape of a collector and returns the samples' names.
func gather(t *testing.T, c prometheus.Collector) []string {
	t.Helper()
	ch := make(chan prometheus.Metric, 100)
	c.Collect(ch)
	close(ch)
	var out []string
	for m := range ch {
		out = append(out, m.Desc().String())
	}
	return out
}

func TestCounterCollectorCountsAndLogsFailures(t *testing.T) {
	m := NewMetrics()
	var logs logLines
	rs, counters := renderedRuleCounters(t)
	c := NewCounterCollector(0, nftnl.NewConn("unused", 0), m, logs.logger(0)).WithRules(ruleAt(rs))
	now := time.Unix(1000, 0)
	c.errs.now = func() time.Time { return now }
	errs := m.CollectorErrors.WithLabelValues("nft_counters")
	reads := func(rules []nftnl.RuleCounter, err error) {
		c.read = func(context.Context) ([]nftnl.RuleCounter, error) { return rules, err }
	}

	// A working read: counters are served, nothing is counted or logged.
	reads(counters, nil)
	if got := gather(t, c); len(got) != 3 {
		t.Fatalf("working read: %d samples, want 3", len(got))
	}
	if v := counterValue(t, errs); v != 0 || len(logs.take()) != 0 {
		t.Fatalf("working read: errors %v, logs present", v)
	}

	// The read fails: the old values are not served; counted and logged once.
	reads(nil, errors.New("netlink receive: operation not permitted"))
	if got := gather(t, c); len(got) != 0 {
		t.Errorf("failing read: served %d stale samples", len(got))
	}
	got := logs.take()
	if len(got) != 1 || !strings.Contains(got[0], "operation not permitted") || !strings.Contains(got[0], `"collector"="nft_counters"`) {
		t.Errorf("first failure logged as %q; want one line with the error and the collector", got)
	}
	// Again within the minute: counted, not logged.
	now = now.Add(30 * time.Second)
	gather(t, c)
	if got := logs.take(); len(got) != 0 {
		t.Errorf("second failure within a minute logged: %q", got)
	}
	// A minute after the first log of a cause, it is logged again with the
	// number left out.
	now = now.Add(31 * time.Second)
	gather(t, c)
	if got := logs.take(); len(got) != 1 || !strings.Contains(got[0], `"suppressedSinceLastLog"=1`) {
		t.Errorf("failure after a minute logged as %q; want one line saying one was left out", got)
	}
	if v := counterValue(t, errs); v != 3 {
		t.Errorf("nftpolicy_collector_errors_total{collector=nft_counters} = %v, want 3", v)
	}

	// No table yet (before the first sync): no counters, and no error.
	reads(nil, nil)
	if got := gather(t, c); len(got) != 0 {
		t.Errorf("no table: %d samples", len(got))
	}
	if v := counterValue(t, errs); v != 3 || len(logs.take()) != 0 {
		t.Errorf("no table counted as an error (%v) or logged", v)
	}
}

func TestQueueStatsCollectorCountsAndLogsFailures(t *testing.T) {
	m := NewMetrics()
	var logs logLines
	c := NewQueueStatsCollector(m, logs.logger(0))
	c.read = func() ([]queue.QueueStats, error) {
		return []queue.QueueStats{{QueueNum: 100, QueueTotal: 2, QueueDropped: 3, UserDropped: 4}}, nil
	}
	if got := gather(t, c); len(got) != 3 {
		t.Fatalf("readable stats: %d samples, want 3", len(got))
	}
	c.read = func() ([]queue.QueueStats, error) { return nil, fs.ErrNotExist }
	for range 3 {
		if got := gather(t, c); len(got) != 0 {
			t.Errorf("unreadable stats: %d samples served", len(got))
		}
	}
	if v := counterValue(t, m.CollectorErrors.WithLabelValues("nfqueue_stats")); v != 3 {
		t.Errorf("nftpolicy_collector_errors_total{collector=nfqueue_stats} = %v, want 3", v)
	}
	got := logs.take()
	if len(got) != 1 || !strings.Contains(got[0], "file does not exist") || !strings.Contains(got[0], queue.KernelQueueStatsPath) {
		t.Errorf("logged %q; want one line (rate-limited) naming the file and the error", got)
	}
}

type failingSink struct{ err error }

func (s failingSink) Create(*corev1.Event) (*corev1.Event, error)        { return nil, s.err }
func (s failingSink) Update(*corev1.Event) (*corev1.Event, error)        { return nil, s.err }
func (s failingSink) Patch(*corev1.Event, []byte) (*corev1.Event, error) { return nil, s.err }

func TestEventSinkLogsFailedWritesAtV2(t *testing.T) {
	ev := &corev1.Event{Reason: "InvalidNetworkPolicy", InvolvedObject: corev1.ObjectReference{Kind: "NetworkPolicy", Namespace: "x", Name: "bad"}}
	for _, v := range []int{1, 2} {
		var logs logLines
		s := EventSink{Sink: failingSink{errors.New("forbidden")}, Logger: logs.logger(v)}
		if _, err := s.Create(ev); err == nil {
			t.Fatal("the sink's error was swallowed")
		}
		got := logs.take()
		if v < 2 && len(got) != 0 {
			t.Errorf("-v=%d: logged %q", v, got)
		}
		if v >= 2 && (len(got) != 1 || !strings.Contains(got[0], "forbidden") || !strings.Contains(got[0], `"name"="bad"`) || !strings.Contains(got[0], "InvalidNetworkPolicy")) {
			t.Errorf("-v=%d: logged %q; want one line with the error, the object and the reason", v, got)
		}
	}
	var logs logLines
	s := EventSink{Sink: failingSink{}, Logger: logs.logger(2)}
	if _, err := s.Patch(ev, nil); err != nil || len(logs.take()) != 0 {
		t.Errorf("a successful write was logged or failed: %v", err)
	}
}
