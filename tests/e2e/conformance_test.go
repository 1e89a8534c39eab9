package e2e_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/tests/e2e"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.RemoveBuiltBinary()
	os.Exit(code)
}

// requireLab stops the test, before anything is built, when root, ip, nft
// or hack/tools.sh's binaries are missing (skip, or fail with
// NFTPOLICY_REQUIRE_TOOLS set).
func requireLab(t *testing.T) {
	t.Helper()
	testenv.Require(t, "e2e tests", testenv.Root("create network namespaces and run nftpolicy agents that program nftables and NFQUEUE in them"),
		testenv.Binaries("ip", "nft"), kubeenv.Tools())
}

const (
	tcp  = compile.ProtoTCP
	udp  = compile.ProtoUDP
	sctp = compile.ProtoSCTP
)

// gridNode spreads the grid over the nodes, alternating in key order, so
// that every namespace has pods on two nodes and every case has same-node
// and cross-node pairs: with two nodes x/a, x/c, y/b, z/a, z/c are on the
// first, the others on the second.
func gridNode(key string, nodes []string) string {
	i := slices.Index(ct.GridPods(), key)
	return nodes[max(i, 0)%len(nodes)]
}

// pp is a port and protocol.
type pp struct {
	port  uint16
	proto compile.Protocol
}

func (k pp) String() string { return fmt.Sprintf("%d/%v", k.port, k.proto) }

// stepTables returns the full-grid truth table of every expectation of a
// step of nc: all nine pods exist, so the case's GridExtra deltas apply.
func stepTables(nc ct.NetpolCase, st ct.NetpolStep) map[pp]ct.TruthTable {
	out := map[pp]ct.TruthTable{}
	for _, e := range st.Expect {
		out[pp{e.Port, e.Proto}] = e.Table(ct.GridPods(), nc.GridExtra...)
	}
	return out
}

// stepLabels returns the labels of the grid's namespaces and pods in a step.
func stepLabels(st ct.NetpolStep) (nss, pods map[string]map[string]string) {
	return st.Grid(ct.GridPods()).Labels()
}

// Timing of the suite's probes.
const (
	matrixTimeout = 700 * time.Millisecond // first try of a matrix probe
	retryTimeout  = 3 * time.Second        // second try of a cell that disagrees
	watchEvery    = 5 * time.Millisecond   // enforcement delay probes
	watchTimeout  = 300 * time.Millisecond
	watchLimit    = 30 * time.Second
)

// TestConformance runs every upstream case in hybrid and in queue mode, on
// one cluster per mode, and reports the enforcement delay.
func TestConformance(t *testing.T) {
	requireLab(t)
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeQueue} {
		t.Run(string(mode), func(t *testing.T) { runConformance(t, cluster.Config{Mode: mode}, false) })
	}
}

// suite is one mode's (or one enforcer's) cluster and what the cases share.
type suite struct {
	mode  compile.Mode
	c     *cluster.Cluster
	p     *e2e.Prober
	ep    map[string]netlab.Endpoint
	nodes []string

	// enforcer is the cluster's enforcer; lenient suites (the peer of
	// hack/compare.sh) log and count disagreements instead of failing.
	enforcer cluster.Enforcer
	lenient  bool

	mu       sync.Mutex
	delays   []delaySample
	probes   int
	sctpSkip string // why SCTP cases cannot run, or ""
	broken   string // why the cluster cannot be trusted any more, or ""

	passed, failed int
	ran            map[int]bool   // case numbers the -run filter let through
	skipped        map[int]string // case number -> why

	// checked and agreed count the probes of checkStep whose real packets
	// were judged, and those that matched the expected verdict; disagree
	// lists the others, each with the evaluator's explanation.
	checked, agreed int
	disagree        []e2e.Disagreement
}

type delaySample struct {
	kind string // create, update, relabel, delete
	d    time.Duration
	what string
}

// runConformance runs every upstream case on a cluster started with cfg and
// returns the suite with its counts.
func runConformance(t *testing.T, cfg cluster.Config, lenient bool) *suite {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s := newSuite(t, ctx, cfg, lenient)
	setup := time.Since(began)

	for _, nc := range ct.NetpolCases() {
		s.mu.Lock()
		wrong := len(s.disagree)
		s.mu.Unlock()
		ok := t.Run(fmt.Sprintf("%02d-%s", nc.Num, slug(nc.Name)), func(t *testing.T) { s.runCase(t, ctx, nc) })
		s.mu.Lock()
		// A lenient suite's disagreements fail no test, but the case failed.
		ok = ok && len(s.disagree) == wrong
		switch _, skipped := s.skipped[nc.Num]; {
		case skipped, !s.ran[nc.Num]:
		case ok:
			s.passed++
		default:
			s.failed++
		}
		s.mu.Unlock()
	}
	s.report(t, setup, time.Since(began))
	return s
}

// newSuite starts a cluster with cfg, creates the grid's namespaces and
// pods and checks the baseline (no policy: everything connects).
func newSuite(t *testing.T, ctx context.Context, cfg cluster.Config, lenient bool) *suite {
	s := &suite{mode: cfg.Mode, enforcer: cfg.Enforcer, lenient: lenient, ep: map[string]netlab.Endpoint{}, ran: map[int]bool{}, skipped: map[int]string{}}
	if s.mode == "" {
		s.mode = compile.ModeHybrid
	}
	if s.enforcer == "" {
		s.enforcer = cluster.EnforcerNftpolicy
	}
	s.c = cluster.Start(t, cfg)
	s.nodes = s.c.Nodes()
	s.p = e2e.NewProber(s.c.Lab)
	s.p.Timeout, s.p.RetryTimeout = matrixTimeout, -1 // retried per cell by checkStep
	t.Cleanup(s.p.Close)
	for _, ns := range ct.GridNamespaces() {
		if err := s.c.EnsureNamespace(ctx, ns, nil); err != nil {
			t.Fatal(err)
		}
	}
	placed := map[string][]string{}
	for _, k := range ct.GridPods() {
		ns, name, _ := strings.Cut(k, "/")
		node := gridNode(k, s.nodes)
		if _, err := s.c.CreatePod(ctx, cluster.Pod{Namespace: ns, Name: name, Labels: map[string]string{"pod": name},
			Node: node, IPs: []netip.Addr{ct.GridIP(k)}, Ports: ct.GridPorts()}); err != nil {
			t.Fatal(err)
		}
		ep, err := s.c.PodEndpoint(k)
		if err != nil {
			t.Fatal(err)
		}
		s.ep[k] = ep
		if err := s.p.ListenSCTP(ep, true); err != nil {
			s.sctpSkip = fmt.Sprintf("cannot open a raw SCTP socket: %v", err)
		}
		placed[node] = append(placed[node], k)
	}
	for _, n := range s.nodes {
		t.Logf("%s: %s", n, strings.Join(placed[n], " "))
	}
	s.baseline(t, ctx)
	return s
}

// who names the suite's enforcer in messages: nftpolicy's mode, or the peer.
func (s *suite) who() string {
	if s.enforcer != cluster.EnforcerNftpolicy {
		return s.enforcer.String()
	}
	return string(s.mode) + " mode"
}

// disagreed reports a disagreement: a test failure, or a log line in a
// lenient suite.
func (s *suite) disagreed(t *testing.T, format string, args ...any) {
	t.Helper()
	if s.lenient {
		t.Logf(format, args...)
		return
	}
	t.Errorf(format, args...)
}

func slug(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '-'
	}, s)
}

// baseline checks that, with no policy, every pair connects on every
// protocol, and finds out whether SCTP probing works at all.
func (s *suite) baseline(t *testing.T, ctx context.Context) {
	if _, err := s.c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	allowed := ct.NewTruthTable(ct.GridPods(), nil)
	want := map[pp]ct.TruthTable{{80, tcp}: allowed, {81, tcp}: allowed, {80, udp}: allowed, {81, udp}: allowed}
	if s.sctpSkip == "" {
		// SCTP is tried separately: it may be impossible here.
		cells, err := s.probeCells(ctx, map[pp]ct.TruthTable{{80, sctp}: allowed})
		if err != nil {
			t.Fatal(err)
		}
		var bad []string
		for _, cl := range cells {
			if !cl.r.Allowed || cl.r.Err != nil {
				bad = append(bad, fmt.Sprintf("%s -> %s: %s %v", cl.from, cl.to, cl.r.Detail, cl.r.Err))
			}
		}
		if len(bad) > 0 {
			s.sctpSkip = fmt.Sprintf("without any policy %d of %d raw SCTP INITs did not reach the server's namespace (%s)",
				len(bad), len(cells), strings.Join(bad[:min(len(bad), 3)], "; "))
		}
	}
	if s.sctpSkip != "" {
		t.Logf("SCTP cases will be skipped: %s", s.sctpSkip)
	}
	s.checkStep(t, ctx, "baseline, no policies", want)
	if t.Failed() {
		t.FailNow()
	}
}

// state is what a case has applied.
type state struct {
	policies map[string]*networkingv1.NetworkPolicy // by namespace/name
	nss      map[string]map[string]string
	pods     map[string]map[string]string
}

func initialState() state {
	nss, pods := stepLabels(ct.NetpolStep{})
	return state{policies: map[string]*networkingv1.NetworkPolicy{}, nss: nss, pods: pods}
}

func (s *suite) runCase(t *testing.T, ctx context.Context, nc ct.NetpolCase) {
	s.mu.Lock()
	s.ran[nc.Num] = true
	broken, sctpSkip := s.broken, s.sctpSkip
	s.mu.Unlock()
	skip := func(why string) {
		s.mu.Lock()
		s.skipped[nc.Num] = why
		s.mu.Unlock()
		t.Skip(why)
	}
	if broken != "" {
		skip("the cluster could not be brought back to its initial state: " + broken)
	}
	for _, st := range nc.Steps {
		for _, e := range st.Expect {
			if e.Proto == sctp && sctpSkip != "" {
				skip("SCTP: this kernel has no SCTP sockets (no CONFIG_IP_SCTP) and the raw-socket probe does not work here: " + sctpSkip)
			}
		}
	}
	cur := initialState()
	prev := map[pp]ct.TruthTable{} // empty: all allowed
	defer func() { s.cleanup(t, ctx, nc, cur, prev) }()
	for si, st := range nc.Steps {
		step := fmt.Sprintf("step %d", si+1)
		if st.Note != "" {
			step += " (" + st.Note + ")"
		}
		next := state{policies: map[string]*networkingv1.NetworkPolicy{}}
		for _, np := range st.Policies {
			next.policies[np.Namespace+"/"+np.Name] = np
		}
		next.nss, next.pods = stepLabels(st)
		tables := stepTables(nc, st)
		kind := transitionKind(cur, next)
		if err := s.transition(t, ctx, kind, step, cur, next, prev, tables); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		cur, prev = next, tables
		s.checkStep(t, ctx, step, tables)
	}
}

// transitionKind names what a step changes through the API.
func transitionKind(cur, next state) string {
	var kinds []string
	for k, np := range next.policies {
		if old, ok := cur.policies[k]; !ok {
			kinds = append(kinds, "create")
		} else if !equality.Semantic.DeepEqual(old.Spec, np.Spec) {
			kinds = append(kinds, "update")
		}
	}
	for k := range cur.policies {
		if _, ok := next.policies[k]; !ok {
			kinds = append(kinds, "delete")
		}
	}
	if !equality.Semantic.DeepEqual(cur.nss, next.nss) || !equality.Semantic.DeepEqual(cur.pods, next.pods) {
		kinds = append(kinds, "relabel")
	}
	slices.Sort(kinds)
	kinds = slices.Compact(kinds)
	if len(kinds) == 0 {
		return "none"
	}
	return strings.Join(kinds, "+")
}

// transition makes the API hold next instead of cur. When some verdict
// changes (prev to tables; a port missing from prev was all allowed if prev
// is empty), one pair whose verdict flips is probed every few milliseconds
// from just before the first API request, and the delay until the new
// verdict shows is recorded. It returns once the agents are programmed.
func (s *suite) transition(t *testing.T, ctx context.Context, kind, step string, cur, next state, prev, tables map[pp]ct.TruthTable) error {
	flip, want, what := s.pickFlip(prev, tables)
	start := time.Now()
	type watched struct {
		d   time.Duration
		err error
	}
	var res chan watched
	wctx, cancel := context.WithTimeout(ctx, watchLimit)
	defer cancel()
	if flip != nil {
		res = make(chan watched, 1)
		go func() {
			d, err := s.p.WatchFlip(wctx, *flip, want, start, watchEvery, watchTimeout)
			res <- watched{d, err}
		}()
	}
	err := s.apply(ctx, cur, next)
	if err != nil {
		cancel() // the change did not happen
	}
	if res != nil {
		w := <-res
		switch {
		case w.err != nil && err == nil:
			s.disagreed(t, "%s: %s %s: %v", step, kind, what, w.err)
		case w.err == nil:
			s.mu.Lock()
			s.delays = append(s.delays, delaySample{kind: kind, d: w.d, what: what})
			s.mu.Unlock()
			t.Logf("%s: %s: %s after %v", step, kind, what, w.d.Round(time.Millisecond))
		}
	}
	if err != nil {
		return err
	}
	if _, err := s.c.WaitProgrammed(ctx); err != nil {
		return err
	}
	return nil
}

// pickFlip chooses the pair to watch: a cell whose verdict differs between
// prev and next, preferring TCP, then UDP, then SCTP, and pods on different
// nodes.
func (s *suite) pickFlip(prev, next map[pp]ct.TruthTable) (*e2e.ProbeSpec, bool, string) {
	allowed := ct.NewTruthTable(ct.GridPods(), nil)
	if len(next) == 0 { // back to no policy: all allowed
		next = map[pp]ct.TruthTable{}
		for k := range prev {
			next[k] = allowed
		}
	}
	keys := sortedKeys(next)
	var best *e2e.ProbeSpec
	var bestWant bool
	var bestWhat string
	bestScore := -1
	for _, k := range keys {
		if k.proto == sctp && s.sctpSkip != "" {
			continue
		}
		before, ok := prev[k]
		if !ok {
			if len(prev) > 0 {
				continue // this port's previous state was not checked
			}
			before = allowed
		}
		after := next[k]
		for _, f := range ct.GridPods() {
			for _, to := range ct.GridPods() {
				pair := [2]string{f, to}
				if f == to || before.Allowed[pair] == after.Allowed[pair] {
					continue
				}
				score := 0
				if gridNode(f, s.nodes) != gridNode(to, s.nodes) {
					score++
				}
				if k.proto == tcp {
					score += 4
				} else if k.proto == udp {
					score += 2
				}
				if score > bestScore {
					bestScore, bestWant = score, after.Allowed[pair]
					best = &e2e.ProbeSpec{From: s.ep[f], To: s.ep[to], Src: ct.GridIP(f), Dst: ct.GridIP(to), Port: k.port, Proto: k.proto}
					bestWhat = fmt.Sprintf("%s -> %s %v %s", f, to, k, ct.VerdictWord(after.Allowed[pair]))
				}
			}
		}
	}
	return best, bestWant, bestWhat
}

// apply writes the difference between cur and next to the API: policies
// first (deletions, then creations and updates), then labels.
func (s *suite) apply(ctx context.Context, cur, next state) error {
	for _, k := range slices.Sorted(maps.Keys(cur.policies)) {
		if _, ok := next.policies[k]; !ok {
			ns, name, _ := strings.Cut(k, "/")
			if err := s.c.DeletePolicy(ctx, ns, name); err != nil {
				return err
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(next.policies)) {
		np := next.policies[k]
		if old, ok := cur.policies[k]; ok && equality.Semantic.DeepEqual(old.Spec, np.Spec) {
			continue
		}
		if _, err := s.c.ApplyPolicy(ctx, np); err != nil {
			return err
		}
	}
	for _, ns := range ct.GridNamespaces() {
		if set, remove := labelDiff(cur.nss[ns], next.nss[ns]); set != nil || remove != nil {
			if err := s.c.LabelNamespace(ctx, ns, set, remove...); err != nil {
				return err
			}
		}
	}
	for _, k := range ct.GridPods() {
		if set, remove := labelDiff(cur.pods[k], next.pods[k]); set != nil || remove != nil {
			ns, name, _ := strings.Cut(k, "/")
			if err := s.c.LabelPod(ctx, ns, name, set, remove...); err != nil {
				return err
			}
		}
	}
	return nil
}

func labelDiff(cur, next map[string]string) (set map[string]string, remove []string) {
	for k, v := range next {
		if cur[k] != v {
			if set == nil {
				set = map[string]string{}
			}
			set[k] = v
		}
	}
	for k := range cur {
		if _, ok := next[k]; !ok {
			remove = append(remove, k)
		}
	}
	return set, remove
}

// cleanup deletes the case's policies and restores the labels through the
// API (measuring the delete like any transition), then checks that every
// pair connects again on the ports the case probed. If the cluster cannot be
// restored, the remaining cases are skipped.
func (s *suite) cleanup(t *testing.T, ctx context.Context, nc ct.NetpolCase, cur state, prev map[pp]ct.TruthTable) {
	init := initialState()
	// The policies first, measured as a delete; the labels after.
	noPolicies := state{policies: map[string]*networkingv1.NetworkPolicy{}, nss: cur.nss, pods: cur.pods}
	err := s.transition(t, ctx, "delete", "cleanup", cur, noPolicies, prev, map[pp]ct.TruthTable{})
	if err == nil {
		err = s.apply(ctx, noPolicies, init)
	}
	if err == nil {
		_, err = s.c.WaitProgrammed(ctx)
	}
	if err == nil {
		// Nothing may be left over in the API either.
		var list *networkingv1.NetworkPolicyList
		list, err = s.c.Client.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) > 0 {
			err = fmt.Errorf("%d policies left, e.g. %s/%s", len(list.Items), list.Items[0].Namespace, list.Items[0].Name)
		}
	}
	if err != nil {
		s.mu.Lock()
		s.broken = fmt.Sprintf("after case %d: %v", nc.Num, err)
		s.mu.Unlock()
		t.Errorf("cleanup: %v", err)
		return
	}
	allowed := ct.NewTruthTable(ct.GridPods(), nil)
	want := map[pp]ct.TruthTable{}
	for k := range prev {
		want[k] = allowed
	}
	if !s.checkStep(t, ctx, "cleanup: no policies", want) {
		s.mu.Lock()
		s.broken = fmt.Sprintf("after case %d: connectivity not restored once its policies were deleted", nc.Num)
		s.mu.Unlock()
	}
}

// cell is one probe of a matrix.
type cell struct {
	k        pp
	from, to string
	want     bool
	spec     e2e.ProbeSpec
	r        e2e.ProbeResult
	eval     evaluate.Verdict
	// prog is the program eval (and a disagreement's explanation) reads.
	prog *compile.Program
}

// probeCells probes every ordered pair of distinct pods for each table, all
// at once (one try), and decides each with the evaluator on the API's
// current objects.
func (s *suite) probeCells(ctx context.Context, tables map[pp]ct.TruthTable) ([]*cell, error) {
	prog, err := s.c.Program(ctx)
	if err != nil {
		return nil, err
	}
	var cells []*cell
	var specs []e2e.ProbeSpec
	for _, k := range sortedKeys(tables) {
		for _, f := range ct.GridPods() {
			for _, to := range ct.GridPods() {
				if f == to {
					continue
				}
				cl := &cell{k: k, from: f, to: to, want: tables[k].Allowed[[2]string{f, to}], prog: prog,
					spec: e2e.ProbeSpec{From: s.ep[f], To: s.ep[to], Src: ct.GridIP(f), Dst: ct.GridIP(to), Port: k.port, Proto: k.proto}}
				cl.eval = evaluate.Evaluate(prog, cl.spec.Src, cl.spec.Dst, k.proto, k.port)
				cells = append(cells, cl)
				specs = append(specs, cl.spec)
			}
		}
	}
	for i, r := range s.p.Run(ctx, specs) {
		cells[i].r = r
	}
	s.mu.Lock()
	s.probes += len(specs)
	s.mu.Unlock()
	return cells, ctx.Err()
}

func sortedKeys(m map[pp]ct.TruthTable) []pp {
	keys := slices.Collect(maps.Keys(m))
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].proto != keys[j].proto {
			return keys[i].proto < keys[j].proto
		}
		return keys[i].port < keys[j].port
	})
	return keys
}

// checkStep probes every table of a step and compares real packets with the
// truth table and with the evaluator. A cell whose first try timed out where
// the table says allowed is tried again with a longer timeout (a loaded
// machine can miss a short one; a policy drop misses every timeout). On a
// mismatch it prints, per port, the expected and observed matrices, the
// evaluator's reasons, the agents' log tails and the involved nodes'
// rulesets. It reports whether everything agreed.
func (s *suite) checkStep(t *testing.T, ctx context.Context, step string, tables map[pp]ct.TruthTable) bool {
	t.Helper()
	if len(tables) == 0 {
		return true
	}
	cells, err := s.probeCells(ctx, tables)
	if err != nil {
		t.Errorf("%s: %v", step, err)
		return false
	}
	var again []*cell
	for _, cl := range cells {
		if cl.r.Err == nil && !cl.r.Allowed && cl.want {
			again = append(again, cl)
		}
	}
	if len(again) > 0 {
		specs := make([]e2e.ProbeSpec, len(again))
		for i, cl := range again {
			specs[i] = cl.spec
		}
		for i, r := range s.p.Try(ctx, specs, retryTimeout) {
			r.Tries = 2
			again[i].r = r
		}
	}
	ok := true
	involved := map[string]bool{}
	s.mu.Lock()
	for _, cl := range cells {
		if cl.r.Err != nil {
			continue // a harness problem, reported below, judges no enforcer
		}
		s.checked++
		if cl.r.Allowed == cl.want {
			s.agreed++
		} else {
			s.disagree = append(s.disagree, e2e.ExplainDisagreement(cl.prog, s.who(), step,
				fmt.Sprintf("%s -> %s %v (%s)", cl.from, cl.to, cl.k, nodePair(s, cl.from, cl.to)),
				cl.spec.Src, cl.spec.Dst, cl.k.proto, cl.k.port, cl.want, cl.r.Allowed))
		}
	}
	s.mu.Unlock()
	for _, k := range sortedKeys(tables) {
		var bad []string
		observed := ct.TruthTable{Pods: ct.GridPods(), Allowed: map[[2]string]bool{}}
		evaluated := ct.TruthTable{Pods: ct.GridPods(), Allowed: map[[2]string]bool{}}
		for _, cl := range cells {
			if cl.k != k {
				continue
			}
			pair := [2]string{cl.from, cl.to}
			observed.Allowed[pair], evaluated.Allowed[pair] = cl.r.Allowed, cl.eval.Allowed
			if cl.r.Err != nil || cl.r.Allowed != cl.want || cl.eval.Allowed != cl.want {
				how := cl.r.Detail
				if cl.r.Tries > 1 {
					how += ", also on a retry"
				}
				if cl.r.Err != nil {
					how = "harness problem: " + cl.r.Err.Error()
				}
				bad = append(bad, fmt.Sprintf("  %s -> %s (%s, %s -> %s): want %s, real packets %s (%s), evaluator %s (ingress=%v egress=%v): %s",
					cl.from, cl.to, nodePair(s, cl.from, cl.to), cl.spec.Src, cl.spec.Dst, ct.VerdictWord(cl.want), ct.VerdictWord(cl.r.Allowed), how,
					ct.VerdictWord(cl.eval.Allowed), cl.eval.Ingress, cl.eval.Egress, cl.eval.Reason()))
				involved[gridNode(cl.from, s.nodes)], involved[gridNode(cl.to, s.nodes)] = true, true
			}
		}
		if len(bad) > 0 {
			ok = false
			want := tables[k]
			s.disagreed(t, "%s, %v (%s): %d of %d pairs disagree ('.' allowed, 'X' denied, '*' differs from expected)\nexpected:\n%sobserved on real packets:\n%sevaluator:\n%smismatches:\n%s",
				step, k, s.who(), len(bad), len(want.Allowed), want.Render(nil), observed.Render(&want), evaluated.Render(&want), strings.Join(bad, "\n"))
		}
	}
	if !ok {
		for _, a := range s.c.Agents() {
			t.Logf("last 25 lines of the agent log of %s (%s):\n%s", a.Node, a.LogPath, a.LogTail(25))
		}
		for _, n := range s.nodes {
			if involved[n] {
				t.Logf("the %s table on %s:\n%s", s.enforcer, n, s.c.ListTable(n))
			}
		}
	}
	return ok
}

func nodePair(s *suite, from, to string) string {
	a, b := gridNode(from, s.nodes), gridNode(to, s.nodes)
	if a == b {
		return "same node " + a
	}
	return a + " -> " + b
}

// report logs the run's figures and the enforcement delay.
func (s *suite) report(t *testing.T, setup, total time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var skipped []string
	for _, num := range slices.Sorted(maps.Keys(s.skipped)) {
		skipped = append(skipped, fmt.Sprintf("%d (%s)", num, s.skipped[num]))
	}
	t.Logf("%s: %d of %d cases run passed, %d failed, %d skipped%s; setup %v, whole suite %v, %d probes on real packets",
		s.who(), s.passed, len(s.ran), s.failed, len(s.skipped), strings.TrimSuffix(": "+strings.Join(skipped, ", "), ": "),
		setup.Round(time.Millisecond), total.Round(time.Millisecond), s.probes)
	byKind := map[string][]time.Duration{}
	var all []time.Duration
	for _, d := range s.delays {
		kind := d.kind
		if strings.Contains(kind, "+") {
			kind = "mixed"
		}
		byKind[kind] = append(byKind[kind], d.d)
		all = append(all, d.d)
	}
	for _, kind := range slices.Sorted(maps.Keys(byKind)) {
		ds := byKind[kind]
		t.Logf("enforcement delay, %s (%s): p50=%v p99=%v max=%v n=%d", kind, s.who(), pct(ds, 50), pct(ds, 99), pct(ds, 100), len(ds))
	}
	if len(all) > 0 {
		t.Logf("enforcement_delay_ms p50=%d p99=%d n=%d (%s)", pct(all, 50).Milliseconds(), pct(all, 99).Milliseconds(), len(all), s.who())
	}
}

// pct is the nearest-rank percentile.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}
