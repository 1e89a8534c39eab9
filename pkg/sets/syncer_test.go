package sets

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Conventions: node n1; pods 10.0.1.x on n1, 10.0.2.x on n2.

// recorder wraps a Fake and keeps the text of every transaction it runs;
// failNext makes the next Run fail without applying anything.
type recorder struct {
	*knftables.Fake
	txs      []string
	failNext bool
}

func (r *recorder) Run(ctx context.Context, tx *knftables.Transaction) error {
	if r.failNext {
		r.failNext = false
		return errors.New("injected failure")
	}
	r.txs = append(r.txs, tx.String())
	return r.Fake.Run(ctx, tx)
}

func newRecorder() *recorder {
	return &recorder{Fake: knftables.NewFake(knftables.InetFamily, compile.TableName)}
}

func pod(ns, name, node, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

func policy(ns, name string, f func(*networkingv1.NetworkPolicy)) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if f != nil {
		f(np)
	}
	return np
}

type world struct {
	pods     []*corev1.Pod
	policies []*networkingv1.NetworkPolicy
}

func (w *world) ruleset(t *testing.T) *compile.Ruleset {
	t.Helper()
	return w.rulesetWith(t, compile.RenderConfig{Mode: compile.ModeHybrid})
}

func (w *world) rulesetWith(t *testing.T, cfg compile.RenderConfig) *compile.Ruleset {
	t.Helper()
	prog := compile.Build(compile.Input{NodeName: "n1", Pods: w.pods, Policies: w.policies})
	rs, err := compile.Render(prog, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func baseWorld() *world {
	return &world{
		pods: []*corev1.Pod{
			pod("x", "a", "n1", "10.0.1.1", map[string]string{"app": "web"}),
			pod("x", "b", "n1", "10.0.1.2", map[string]string{"app": "db"}),
			pod("y", "c", "n2", "10.0.2.1", map[string]string{"app": "client"}),
		},
		policies: []*networkingv1.NetworkPolicy{
			policy("x", "allow-web", func(np *networkingv1.NetworkPolicy) {
				np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
				np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				}}
			}),
		},
	}
}

func sync(t *testing.T, s *Syncer, rs *compile.Ruleset) Result {
	t.Helper()
	res, err := s.Sync(context.Background(), rs)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	return res
}

// matchesFreshLoad fails the test unless rec holds what a full load of
// desired into an empty table gives.
func matchesFreshLoad(t *testing.T, rec *recorder, desired *compile.Ruleset, what string) {
	t.Helper()
	fresh := newRecorder()
	fs, _ := New(Config{NFT: fresh})
	sync(t, fs, desired)
	// The Fake lists elements in the order they were added.
	if diff := cmp.Diff(lines(fresh.Dump()), lines(rec.Dump())); diff != "" {
		t.Errorf("%s (-fresh load +got):\n%s", what, diff)
	}
}

// lines returns the transaction's commands, sorted, without the table line.
func lines(tx string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(tx), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}

func TestIncrementalTransactions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(w *world)
		want   []string
	}{{
		name: "pod added: only set and map elements",
		change: func(w *world) {
			w.pods = append(w.pods, pod("y", "d", "n2", "10.0.2.2", map[string]string{"app": "client"}))
		},
		want: []string{
			`add element inet nftpolicy known-pods-v4 { 10.0.2.2 }`,
			`add element inet nftpolicy peers-qeylrstm-v4 { 10.0.2.2 comment "y/d" }`,
		},
	}, {
		name: "local pod added and selected: vmap and self elements, no chain",
		change: func(w *world) {
			w.pods = append(w.pods, pod("x", "a2", "n1", "10.0.1.3", map[string]string{"app": "web"}))
		},
		want: []string{
			`add element inet nftpolicy ingress-pods-v4 { 10.0.1.3 comment "x/a2" : goto ingress-isolated-2f7e2rg4 }`,
			`add element inet nftpolicy known-pods-v4 { 10.0.1.3 }`,
			`add element inet nftpolicy self-v4 { 10.0.1.3 . 10.0.1.3 comment "x/a2" }`,
		},
	}, {
		name: "label changed: the pod leaves the peer set",
		change: func(w *world) {
			w.pods[2] = pod("y", "c", "n2", "10.0.2.1", map[string]string{"app": "other"})
		},
		want: []string{
			`delete element inet nftpolicy peers-qeylrstm-v4 { 10.0.2.1 }`,
		},
	}, {
		name: "policy edited: only its chain is refilled",
		change: func(w *world) {
			w.policies[0].Spec.Ingress[0].Ports = []networkingv1.NetworkPolicyPort{{Port: ptrIntStr(8080)}}
		},
		want: []string{
			`add element inet nftpolicy ingress-x/allow-web-0-ports { tcp . 8080 }`,
			`add rule inet nftpolicy ingress-x/allow-web ip saddr @peers-qeylrstm-v4 meta l4proto . th dport @ingress-x/allow-web-0-ports counter accept comment "x/allow-web ingress[0]"`,
			`add rule inet nftpolicy ingress-x/allow-web ip6 saddr @peers-qeylrstm-v6 meta l4proto . th dport @ingress-x/allow-web-0-ports counter accept comment "x/allow-web ingress[0]"`,
			`add set inet nftpolicy ingress-x/allow-web-0-ports { type inet_proto . inet_service ; flags interval ; comment "x/allow-web ingress[0] ports" ; }`,
			`flush chain inet nftpolicy ingress-x/allow-web`,
		},
	}, {
		name: "policy deleted: its chains, sets and elements go",
		change: func(w *world) {
			w.policies = nil
		},
		want: []string{
			`delete chain inet nftpolicy ingress-isolated-2f7e2rg4`,
			`delete chain inet nftpolicy ingress-x/allow-web`,
			`delete element inet nftpolicy ingress-pods-v4 { 10.0.1.1 }`,
			`delete element inet nftpolicy self-v4 { 10.0.1.1 . 10.0.1.1 }`,
			`delete set inet nftpolicy peers-qeylrstm-v4`,
			`delete set inet nftpolicy peers-qeylrstm-v6`,
			`flush chain inet nftpolicy ingress-isolated-2f7e2rg4`,
			`flush chain inet nftpolicy ingress-x/allow-web`,
		},
	}, {
		name:   "nothing changed: no transaction",
		change: func(w *world) {},
		want:   nil,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			s, err := New(Config{NFT: rec})
			if err != nil {
				t.Fatal(err)
			}
			w := baseWorld()
			if res := sync(t, s, w.ruleset(t)); !res.Full {
				t.Fatalf("first sync not full")
			}
			tc.change(w)
			desired := w.ruleset(t)
			res := sync(t, s, desired)
			if res.Full {
				t.Fatalf("second sync was full")
			}
			var got []string
			if len(rec.txs) == 2 {
				got = lines(rec.txs[1])
			} else if len(rec.txs) != 1 {
				t.Fatalf("%d transactions, want 1 or 2", len(rec.txs))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("incremental transaction (-want +got):\n%s", diff)
			}
			for _, l := range got {
				if strings.Contains(l, "table") {
					t.Errorf("incremental sync touched the table: %s", l)
				}
			}
			// The result must equal a fresh full load of the same ruleset.
			matchesFreshLoad(t, rec, desired, "incremental result differs from a full load")
		})
	}
}

func ptrIntStr(i int) *intstr.IntOrString { v := intstr.FromInt32(int32(i)); return &v }

func TestFailureForcesFullResync(t *testing.T) {
	rec := newRecorder()
	s, _ := New(Config{NFT: rec})
	w := baseWorld()
	sync(t, s, w.ruleset(t))
	w.pods = append(w.pods, pod("y", "d", "n2", "10.0.2.2", map[string]string{"app": "client"}))
	rec.failNext = true
	if _, err := s.Sync(context.Background(), w.ruleset(t)); err == nil {
		t.Fatal("injected failure not reported")
	}
	res := sync(t, s, w.ruleset(t))
	if !res.Full {
		t.Fatal("sync after a failure was not full")
	}
	matchesFreshLoad(t, rec, w.ruleset(t), "after resync")
}

func TestFullSyncRemovesStaleObjectsWithoutDeletingTable(t *testing.T) {
	rec := newRecorder()
	// A table left by an earlier agent, with a chain and set we no longer want.
	tx := rec.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "ingress-old/policy"})
	tx.Add(&knftables.Set{Name: "peers-stale-v4", Type: "ipv4_addr"})
	tx.Add(&knftables.Rule{Chain: "ingress-old/policy", Rule: "ip saddr @peers-stale-v4 accept"})
	if err := rec.Fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	s, _ := New(Config{NFT: rec})
	w := baseWorld()
	sync(t, s, w.ruleset(t))
	for _, l := range lines(rec.txs[0]) {
		if strings.HasPrefix(l, "delete table") || strings.HasPrefix(l, "destroy table") {
			t.Errorf("full sync deleted the table: %s", l)
		}
	}
	dump := rec.Dump()
	if strings.Contains(dump, "ingress-old/policy") || strings.Contains(dump, "peers-stale-v4") {
		t.Errorf("stale objects survived the full sync:\n%s", dump)
	}
}

func TestExternalChainInstalledBeforeUse(t *testing.T) {
	rec := newRecorder()
	var calls []string
	ext := func(ctx context.Context, chain string) error {
		// The chain exists, and nothing jumps to it yet.
		if !strings.Contains(rec.Dump(), "add chain inet nftpolicy "+chain) {
			t.Errorf("external rules installed before chain %s exists", chain)
		}
		if len(calls) == 0 && strings.Contains(rec.Dump(), "goto "+chain) {
			t.Errorf("something jumps to %s before its rules exist", chain)
		}
		calls = append(calls, chain)
		return nil
	}
	s, _ := New(Config{NFT: rec, External: ext})
	w := baseWorld()
	prog := compile.Build(compile.Input{NodeName: "n1", Pods: w.pods, Policies: w.policies})
	rs, err := compile.Render(prog, compile.RenderConfig{Mode: compile.ModeQueue, QueueVariant: compile.QueueXTCompat})
	if err != nil {
		t.Fatal(err)
	}
	sync(t, s, rs)
	if diff := cmp.Diff([]string{compile.ChainQueue}, calls); diff != "" {
		t.Errorf("external installs (-want +got):\n%s", diff)
	}
	// Incremental syncs leave the external rules alone.
	sync(t, s, rs)
	if len(calls) != 1 {
		t.Errorf("incremental sync reinstalled external rules")
	}
	if !strings.Contains(rec.Dump(), "goto "+compile.ChainQueue) {
		t.Errorf("queue mode ruleset does not dispatch to the queue chain:\n%s", rec.Dump())
	}
	// A second full sync must not flush the external chain.
	s.ForceFull()
	sync(t, s, rs)
	if slices.Contains(strings.Split(rec.txs[len(rec.txs)-1], "\n"), "flush chain inet nftpolicy "+compile.ChainQueue) {
		t.Errorf("full sync flushed the external chain")
	}
}

// oldDefinitions names a set and a map that baseWorld renders and returns
// a transaction filler that declares them the way an older version might
// have: same names, other types, flags and timeout, with an element and a
// rule that uses the set.
func oldDefinitions(t *testing.T, rs *compile.Ruleset) (set, vmap string, tx func(*knftables.Transaction)) {
	t.Helper()
	set, vmap = "peers-qeylrstm-v4", "ingress-pods-v4"
	if rs.Sets[set] == nil || rs.Sets[set].Set == nil || rs.Sets[vmap] == nil || rs.Sets[vmap].Map == nil {
		t.Fatalf("baseWorld no longer renders set %s and map %s; pick others", set, vmap)
	}
	timeout := time.Minute
	return set, vmap, func(tx *knftables.Transaction) {
		tx.Add(&knftables.Table{Comment: rs.Table.Comment})
		tx.Add(&knftables.Set{Name: set, Type: "ipv4_addr . inet_service", Flags: []knftables.SetFlag{knftables.IntervalFlag}, Timeout: &timeout})
		tx.Add(&knftables.Element{Set: set, Key: []string{"10.9.0.0/16", "80"}})
		tx.Add(&knftables.Map{Name: vmap, Type: "ipv4_addr . inet_proto : verdict"})
		tx.Add(&knftables.Chain{Name: "ingress-old"})
		tx.Add(&knftables.Rule{Chain: "ingress-old", Rule: "ip saddr . tcp dport @" + set + " accept"})
	}
}

func TestFullSyncReplacesSetsWhoseDefinitionChanged(t *testing.T) {
	rs := baseWorld().ruleset(t)
	rec := newRecorder()
	set, vmap, old := oldDefinitions(t, rs)
	tx := rec.NewTransaction()
	old(tx)
	if err := rec.Fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	s, _ := New(Config{NFT: rec})
	if res := sync(t, s, rs); !res.Full {
		t.Fatal("first sync not full")
	}
	matchesFreshLoad(t, rec, rs, "after a full sync over old definitions of "+set+" and "+vmap)
}

func TestIncrementalSyncReplacesSetWhoseDefinitionChanged(t *testing.T) {
	w := baseWorld()
	rec := newRecorder()
	s, _ := New(Config{NFT: rec})
	sync(t, s, w.ruleset(t))
	desired := w.ruleset(t)
	set, _, _ := oldDefinitions(t, desired)
	def := *desired.Sets[set].Set
	def.Flags = append(def.Flags, knftables.IntervalFlag)
	desired.Sets[set] = &compile.Set{Key: desired.Sets[set].Key, Set: &def, Elements: desired.Sets[set].Elements}
	if res := sync(t, s, desired); !res.Full {
		t.Error("a set whose flags changed was synced incrementally, over its old definition")
	}
	matchesFreshLoad(t, rec, desired, "after the set's flags changed")
}
