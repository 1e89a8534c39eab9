package inproc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/controller"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// Quiet discards logs. logr.Discard() has a nil sink, which the product's
// Defaults replace with klog.
var Quiet = funcr.New(func(prefix, args string) {}, funcr.Options{})

// runtimeReadyTimeout bounds how long New waits for the NFQUEUE runtime to
// bind its queues.
const runtimeReadyTimeout = 10 * time.Second

// Agent is one node's syncer and, in queue mode, evaluator and runtime.
type Agent struct {
	Node string
	// Runtime is the NFQUEUE runtime in queue mode, nil otherwise.
	Runtime *queue.Runtime
	// Program is the last program Apply committed.
	Program *compile.Program
	// OnProgram, when set, is called after each publication with the
	// previous program and the new one, as the agent's first program hook
	// is (connection revocation).
	OnProgram func(old, cur *compile.Program)

	nft    *netlab.NodeNFT
	netns  *os.File // the node's namespace, for netlink sockets
	syncer *sets.Syncer
	// apply is the agent's sequence (controller.Applier): commit, publish,
	// run the hooks; hooks are its hooks, the agent's.
	apply *controller.Applier
	hooks controller.Hooks
	rcfg  compile.RenderConfig
	qcfg  queuerule.QueueRuleConfig
	eval  evaluate.Evaluator
	// elements writes element-only changes over netlink, as the agent does.
	elements *nftnl.Conn
	stopRT   context.CancelFunc
	rtDone   chan error
	dns      DNSLearning
}

// New starts the agent of node in lab with the render configuration rcfg
// (its mode, queue numbers, queue variant and allow mark); log may be the
// zero Logger, which means Quiet. Close it.
func New(lab *netlab.Lab, node string, rcfg compile.RenderConfig, log logr.Logger) (_ *Agent, err error) {
	if log.GetSink() == nil {
		log = Quiet
	}
	a := &Agent{Node: node, rcfg: rcfg}
	if a.nft, err = netlab.NewNodeNFT(lab, node); err != nil {
		return nil, err
	}
	path, err := lab.NodeNetnsPath(node)
	if err != nil {
		return nil, err
	}
	if a.netns, err = os.Open(path); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, a.Close())
		}
	}()
	a.qcfg = queuerule.QueueRuleConfig{
		QueueNum: rcfg.QueueNum,
		Queues:   rcfg.Queues,
		Bypass:   rcfg.FailOpen,
		Fanout:   rcfg.Queues > 1,
		Counter:  true,
		Comment:  "nftpolicy: new connections to the userspace evaluator",
	}
	// As the agent runs it: element changes over netlink, full syncs with
	// one command per set.
	a.elements = nftnl.NewConn(compile.TableName, int(a.netns.Fd()))
	scfg := sets.Config{NFT: a.nft, Logger: log, Netlink: a.elements, OneCommandPerSet: true}
	if (rcfg.UsesQueue() || rcfg.LearnsDNS()) && rcfg.QueueVariant == compile.QueueXTCompat {
		scfg.External = a.installQueueRule
	}
	if a.syncer, err = sets.New(scfg); err != nil {
		return nil, err
	}
	// The hooks in the agent's order: revocation (OnProgram here), then
	// DNS learning's (startDNS). Program is the one in force first.
	a.hooks.OnProgram(func(_, cur *compile.Program) { a.Program = cur })
	a.hooks.OnProgram(func(old, cur *compile.Program) {
		if a.OnProgram != nil {
			a.OnProgram(old, cur)
		}
	})
	if a.apply, err = controller.NewApplier(controller.ApplierConfig{Render: rcfg, Syncer: a.syncer, Evaluator: &a.eval, Hooks: &a.hooks}); err != nil {
		return nil, err
	}
	if rcfg.UsesQueue() {
		if err := a.startRuntime(log); err != nil {
			return nil, err
		}
	}
	if rcfg.LearnsDNS() {
		if err := a.startDNS(log); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// installQueueRule is the syncer's External installer: the xt-compat
// NFQUEUE rule, written over netlink into the node's table.
func (a *Agent) installQueueRule(ctx context.Context, chain string) error {
	conn, err := nftables.New(nftables.WithNetNSFd(int(a.netns.Fd())))
	if err != nil {
		return err
	}
	defer conn.CloseLasting()
	return queuerule.InstallCompatQueueRule(conn, compile.TableName, chain, queuerule.CompatRuleConfig(a.rcfg, chain))
}

// CompatQueueRuleInstalled reports whether the node's queue chain holds the
// xt-compat rule.
func (a *Agent) CompatQueueRuleInstalled() (bool, error) {
	conn, err := nftables.New(nftables.WithNetNSFd(int(a.netns.Fd())))
	if err != nil {
		return false, err
	}
	defer conn.CloseLasting()
	return queuerule.CheckCompatQueueRule(conn, compile.TableName, compile.ChainQueue, a.qcfg)
}

func (a *Agent) startRuntime(log logr.Logger) error {
	rt, err := queue.NewRuntime(queue.RuntimeConfig{
		QueueNum:  a.rcfg.QueueNum,
		Queues:    a.rcfg.Queues,
		FailOpen:  a.rcfg.FailOpen,
		AllowMark: a.rcfg.AllowMark,
		NetNS:     int(a.netns.Fd()),
		Logger:    log,
	}, queue.Evaluating(&a.eval))
	if err != nil {
		return err
	}
	a.Runtime = rt
	a.stopRT, a.rtDone, err = a.run(rt, "nfqueue runtime")
	return err
}

// run starts a runtime and waits until its queues are bound; cancel stops
// it, and done then yields Run's error.
func (a *Agent) run(rt *queue.Runtime, what string) (cancel context.CancelFunc, done chan error, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	select {
	case <-rt.Ready():
		return cancel, done, nil
	case err := <-done:
		done <- err
		return cancel, done, fmt.Errorf("%s on %s: %w", what, a.Node, err)
	case <-time.After(runtimeReadyTimeout):
		return cancel, done, fmt.Errorf("%s on %s: not ready after %v", what, a.Node, runtimeReadyTimeout)
	}
}

// Apply renders prog, lets mutate (when not nil) change the ruleset,
// commits it (a full sync when full) and then publishes prog, through the
// agent's Applier: the program is published, and the hooks run, only
// after the transaction rendered from it committed.
func (a *Agent) Apply(ctx context.Context, prog *compile.Program, mutate func(node string, rs *compile.Ruleset), full bool) (sets.Result, error) {
	rs, err := compile.Render(prog, a.rcfg)
	if err != nil {
		return sets.Result{}, fmt.Errorf("rendering for %s: %w", a.Node, err)
	}
	if mutate != nil {
		mutate(a.Node, rs)
	}
	if full {
		a.apply.ForceFull()
	}
	res, err := a.apply.Commit(ctx, rs)
	if err != nil {
		return res, fmt.Errorf("syncing %s: %w", a.Node, err)
	}
	a.apply.Publish(prog)
	return res, nil
}

// ApplyPodEvents takes the node from before to after the way the agent's
// controller does in hybrid mode, through its Applier: the changes that
// are neither pods', namespaces' nor policies' through a full build
// (before's pods, namespaces, policies and cluster policies with after's
// nodes), then each Namespace that differs through ApplyNamespace and
// CommitPolicies, then each NetworkPolicy that differs, one at a time,
// through ApplyPolicy and CommitPolicies, then each ClusterNetworkPolicy
// that differs through ApplyClusterPolicy and CommitPolicies, then each
// pod that differs through ApplyPods (a rebuild whenever the tracker asks
// for one). It returns how many pod and policy changes took each path;
// prog is the program of after, published at the end unless the tracker
// has it (the program it derived for the pods, from the last build or,
// after policy changes, from the program built of their state that it
// adopted).
func (a *Agent) ApplyPodEvents(ctx context.Context, before, after compile.Input, prog *compile.Program) (tracked, rebuilt int, err error) {
	tr := a.apply.Tracker()
	nss := byKey(before.Namespaces, func(ns *corev1.Namespace) string { return ns.Name })
	pods := byKey(before.Pods, func(p *corev1.Pod) string { return p.Namespace + "/" + p.Name })
	pols := byKey(before.Policies, func(np *networkingv1.NetworkPolicy) string { return np.Namespace + "/" + np.Name })
	cnps := byKey(before.ClusterPolicies, func(cnp *npav1beta1.ClusterNetworkPolicy) string { return cnp.Name })
	rebuild := func() error {
		in := after
		in.Pods, in.Policies, in.ClusterPolicies, in.Namespaces = sortedValues(pods), sortedValues(pols), sortedValues(cnps), sortedValues(nss)
		_, rs, err := a.apply.Build(in)
		if err != nil {
			return err
		}
		if _, err = a.apply.Commit(ctx, rs); err != nil {
			return fmt.Errorf("syncing %s: %w", a.Node, err)
		}
		return nil
	}
	if err := rebuild(); err != nil {
		return 0, 0, err
	}
	// policy commits one policy change the Applier applied, or rebuilds.
	policy := func(key string, f compile.Fallback) error {
		if f != compile.NoFallback {
			rebuilt++
			return rebuild()
		}
		tracked++
		if _, err := a.apply.CommitPolicies(ctx); err != nil {
			return fmt.Errorf("applying policy %s on %s: %w", key, a.Node, err)
		}
		return nil
	}
	nextNSs := byKey(after.Namespaces, func(ns *corev1.Namespace) string { return ns.Name })
	if err := changeEach(nss, nextNSs, func(name string, ns *corev1.Namespace) error {
		return policy(name, a.apply.ApplyNamespace(name, ns))
	}); err != nil {
		return tracked, rebuilt, err
	}
	nextPols := byKey(after.Policies, func(np *networkingv1.NetworkPolicy) string { return np.Namespace + "/" + np.Name })
	if err := changeEach(pols, nextPols, func(key string, np *networkingv1.NetworkPolicy) error {
		return policy(key, a.apply.ApplyPolicy(key, np))
	}); err != nil {
		return tracked, rebuilt, err
	}
	nextCNPs := byKey(after.ClusterPolicies, func(cnp *npav1beta1.ClusterNetworkPolicy) string { return cnp.Name })
	if err := changeEach(cnps, nextCNPs, func(name string, cnp *npav1beta1.ClusterNetworkPolicy) error {
		return policy(name, a.apply.ApplyClusterPolicy(name, cnp))
	}); err != nil {
		return tracked, rebuilt, err
	}
	if tr.Stale() {
		// The program refresh after policy changes, built off the sync
		// loop and adopted as the agent does (pkg/controller offloop.go):
		// the pod changes below derive their program from it.
		in := after
		in.Pods, in.Policies, in.ClusterPolicies = sortedValues(pods), sortedValues(pols), sortedValues(cnps)
		tr.Adopt(compile.BuildBase(in))
	}
	next := byKey(after.Pods, func(p *corev1.Pod) string { return p.Namespace + "/" + p.Name })
	if err := a.applyPods(ctx, pods, next, rebuild, &tracked, &rebuilt); err != nil {
		return tracked, rebuilt, err
	}
	if !tr.Stale() {
		// The evaluator gets the program the tracker derived for the pod
		// changes, as the agent publishes it.
		prog = tr.Program()
	}
	a.apply.Publish(prog)
	return tracked, rebuilt, nil
}

// applyPods takes pods to next one pod at a time through the Applier (in
// key order, then the deletions), rebuilding when the tracker asks.
func (a *Agent) applyPods(ctx context.Context, pods, next map[string]*corev1.Pod, rebuild func() error, tracked, rebuilt *int) error {
	keys := slices.Sorted(maps.Keys(next))
	for k := range pods {
		if next[k] == nil {
			keys = append(keys, k)
		}
	}
	get := func(key string) *compile.PodInfo {
		if p := next[key]; p != nil {
			return compile.NewPodInfo(p)
		}
		return nil
	}
	for _, key := range keys {
		p := next[key]
		if old := pods[key]; old != nil && p != nil && equality.Semantic.DeepEqual(old, p) {
			continue
		}
		if p == nil {
			delete(pods, key)
		} else {
			pods[key] = p
		}
		done, err := a.apply.ApplyPods(ctx, []string{key}, get, nil)
		if err != nil {
			return fmt.Errorf("applying pod %s on %s: %w", key, a.Node, err)
		}
		if done.Fallback != compile.NoFallback {
			*rebuilt++
			if err := rebuild(); err != nil {
				return err
			}
			continue
		}
		*tracked++
	}
	return nil
}

// byKey indexes objs by key.
func byKey[T any](objs []*T, key func(*T) string) map[string]*T {
	m := make(map[string]*T, len(objs))
	for _, o := range objs {
		m[key(o)] = o
	}
	return m
}

// sortedValues are m's values in key order.
func sortedValues[T any](m map[string]*T) []*T {
	var out []*T
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out
}

// changeEach takes cur (objects by key) to next one object at a time, in
// key order: changes and additions, then deletions (apply gets nil).
func changeEach[T any](cur, next map[string]*T, apply func(key string, obj *T) error) error {
	for _, key := range slices.Sorted(maps.Keys(next)) {
		if old := cur[key]; old != nil && equality.Semantic.DeepEqual(old, next[key]) {
			continue
		}
		cur[key] = next[key]
		if err := apply(key, next[key]); err != nil {
			return err
		}
	}
	for _, key := range slices.Sorted(maps.Keys(cur)) {
		if next[key] == nil {
			delete(cur, key)
			if err := apply(key, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// Evaluator is the evaluator the runtime asks; set its unknown-pod fields
// before the first Apply.
func (a *Agent) Evaluator() *evaluate.Evaluator { return &a.eval }

// Applier is the agent's sequence (controller.Applier) this node runs:
// a controller run in this process drives the same one's parts.
func (a *Agent) Applier() *controller.Applier { return a.apply }

// Hooks are the agent's hooks, which its Applier runs: add to them before
// the first Apply (they run from the goroutine that applies).
func (a *Agent) Hooks() *controller.Hooks { return &a.hooks }

// Syncer returns the agent's syncer, configured as the agent's (netlink
// elements, one command per set, the xt-compat queue rule installed over
// netlink), for a controller run in this process.
func (a *Agent) Syncer() *sets.Syncer { return a.syncer }

// NetnsFD is a descriptor of the node's network namespace, for sockets the
// caller opens there (ctnetlink).
func (a *Agent) NetnsFD() int { return int(a.netns.Fd()) }

// Close stops the runtime and releases the namespace handle. The node's
// table stays (the lab's teardown removes the namespace).
func (a *Agent) Close() error {
	var errs []error
	errs = append(errs, a.stopDNS())
	if a.stopRT != nil {
		a.stopRT()
		if err := <-a.rtDone; err != nil {
			errs = append(errs, err)
		}
		a.stopRT = nil
	}
	if a.elements != nil {
		errs = append(errs, a.elements.Close())
		a.elements = nil
	}
	if a.netns != nil {
		errs = append(errs, a.netns.Close())
		a.netns = nil
	}
	return errors.Join(errs...)
}
