package controller

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// testdata/nft-list-table.json is `nft -t -j list table inet nftpolicy` of the
// golden scenario deny-and-allow on node-1, with each rule's counter set to
// its handle so that sums are checkable; its rules' comments and counters
// are what the collector reads over netlink.
func TestPolicyCounters(t *testing.T) {
	got := PolicyCounters(goldenRuleCounters(t))
	want := map[PolicyCounterKey]uint64{
		{"x/allow-web", "ingress", "allowed"}:   32 + 33 + 34 + 35 + 36 + 37,
		{"x/allow-web", "ingress", "denied"}:    30,
		{"x/default-deny", "ingress", "denied"}: 30 + 31,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
}

// goldenRuleCounters reads testdata/nft-list-table.json's rule counters.
func goldenRuleCounters(t *testing.T) []nftnl.RuleCounter {
	data, err := os.ReadFile("testdata/nft-list-table.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Nftables []struct {
			Rule *struct {
				Chain, Comment string
				Expr           []map[string]json.RawMessage
			}
		}
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var out []nftnl.RuleCounter
	for _, o := range doc.Nftables {
		if o.Rule == nil {
			continue
		}
		for _, e := range o.Rule.Expr {
			var c struct{ Packets, Bytes uint64 }
			if raw, ok := e["counter"]; ok && json.Unmarshal(raw, &c) == nil {
				out = append(out, nftnl.RuleCounter{Chain: o.Rule.Chain, Comment: o.Rule.Comment, Packets: c.Packets, Bytes: c.Bytes})
			}
		}
	}
	return out
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
	c := NewCounterCollector(0, nftnl.NewConn("unused", 0), m, logs.logger(0))
	now := time.Unix(1000, 0)
	c.errs.now = func() time.Time { return now }
	errs := m.CollectorErrors.WithLabelValues("nft_counters")
	reads := func(rules []nftnl.RuleCounter, err error) {
		c.read = func(context.Context) ([]nftnl.RuleCounter, error) { return rules, err }
	}

	// A working read: counters are served, nothing is counted or logged.
	reads(goldenRuleCounters(t), nil)
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
