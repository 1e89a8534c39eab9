package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/bootcni"
	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/uninstall"
)

// uninstallCheckTimeout bounds, at SIGTERM, the read of the DaemonSet that
// tells an uninstall from an update. It delays the queue hand-over of an
// update only when the API does not answer (a healthy API answers in
// milliseconds), and the hand-over's own bounds (2 s for the successor's
// queues, 5 s for its first sync, 3 s of draining) must still fit
// install.yaml's 10 s grace period.
const uninstallCheckTimeout = time.Second

// uninstallOptions are the flags of the removal at uninstall.
type uninstallOptions struct {
	enabled      bool
	podName      string
	podNamespace string
	// removed is set once the agent removed its table at shutdown: there
	// is then no queue to hand over.
	removed atomic.Bool
	// cni are the host's CNI directories where cni-install put the boot
	// plugin (empty: not installed by this DaemonSet).
	cni cniDirs
	// chainDone is closed when keepChained has stopped (nil: not started).
	chainDone chan struct{}
}

// chainPeriod is how often the agent checks that the boot plugin is still
// in the node's CNI configuration list.
const chainPeriod = 10 * time.Second

// keepChained puts the boot plugin back into the node's CNI configuration
// list whenever the network plugin rewrote the list without it (flannel's
// and Calico's installers write their list at every start), until ctx
// ends; the removal at exit waits for it to stop. Only when cni-install
// installed the plugin (its executable is there).
func (o *uninstallOptions) keepChained(ctx context.Context) {
	if o.cni.bin == "" || o.cni.conf == "" {
		return
	}
	log := klog.FromContext(ctx).WithName("boot-plugin")
	o.chainDone = make(chan struct{})
	go func() {
		defer close(o.chainDone)
		t := time.NewTicker(chainPeriod)
		defer t.Stop()
		for {
			if _, err := os.Stat(filepath.Join(o.cni.bin, bootcni.PluginName)); err == nil {
				conf, wrote, err := bootcni.Chain(o.cni.conf)
				switch {
				case err != nil:
					log.V(2).Info("Cannot chain the boot plugin", "err", err)
				case wrote:
					log.Info("The boot plugin was missing from the CNI configuration (rewritten by the network plugin?): chained it again", "file", conf)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// ownerWatch follows the agent's DaemonSet: the owner found through the
// agent's pod, and what the API last said of the DaemonSet's name. The
// watch is opened at start, while the agent's credentials are valid:
// `kubectl delete -f install.yaml` deletes the ServiceAccount and its RBAC
// before the DaemonSet, after which a read at SIGTERM is refused (401),
// but a watch already open still reports the DaemonSet's deletion.
type ownerWatch struct {
	mu    sync.Mutex
	owner *uninstall.Owner
	obs   uninstall.Observation
	// changed is closed and replaced at each observation.
	changed chan struct{}
	client  kubernetes.Interface
}

// start finds the agent's DaemonSet and watches it until ctx ends, in the
// background (the API may not answer yet: the agent must start anyway).
// Without the pod's name or with the removal off it does nothing: the agent
// then always keeps its table at exit.
func (o *uninstallOptions) start(ctx context.Context, client kubernetes.Interface) *ownerWatch {
	w := &ownerWatch{client: client, changed: make(chan struct{})}
	log := klog.FromContext(ctx).WithName("uninstall")
	switch {
	case !o.enabled:
		return w
	case o.podName == "" || o.podNamespace == "":
		log.Info("Not watching the agent's DaemonSet (no --pod-name/--pod-namespace): at exit the table always stays; after an uninstall run `nftpolicy cleanup` on each node")
		return w
	}
	go w.run(ctx, log, o.podNamespace, o.podName)
	return w
}

func (w *ownerWatch) run(ctx context.Context, log klog.Logger, ns, pod string) {
	var owner *uninstall.Owner
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := w.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", pod).String()})
		if err != nil {
			log.V(2).Info("Reading the agent's pod", "pod", ns+"/"+pod, "err", err)
			return false, nil
		}
		if len(pods.Items) == 0 {
			log.Info("The agent's pod is not in the API; not watching its DaemonSet", "pod", ns+"/"+pod)
			return true, nil
		}
		ref := metav1.GetControllerOf(&pods.Items[0])
		if ref == nil || ref.Kind != "DaemonSet" || ref.APIVersion != appsv1.SchemeGroupVersion.String() {
			log.Info("The agent's pod has no DaemonSet controller; at exit the table always stays", "pod", ns+"/"+pod)
			return true, nil
		}
		owner = &uninstall.Owner{Namespace: ns, Name: ref.Name, UID: ref.UID}
		return true, nil
	})
	if err != nil || owner == nil {
		return
	}
	w.mu.Lock()
	w.owner = owner
	w.mu.Unlock()
	log.Info("Watching the agent's DaemonSet: if it is deleted, the table is removed at exit", "daemonSet", owner.Namespace+"/"+owner.Name, "uid", owner.UID)
	factory := informers.NewSharedInformerFactoryWithOptions(w.client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", owner.Name).String()
		}))
	inf := factory.Apps().V1().DaemonSets().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj) },
		UpdateFunc: func(_, obj any) { w.observe(obj) },
		DeleteFunc: func(any) { w.observe(nil) },
	})
	factory.Start(ctx.Done())
	if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) && len(inf.GetStore().List()) == 0 {
		w.observe(nil) // listed, and not there
	}
	<-ctx.Done()
	factory.Shutdown()
}

// observe records what the API said of the DaemonSet (nil: none).
func (w *ownerWatch) observe(obj any) {
	obs := uninstall.Observation{Known: true, At: time.Now()}
	if ds, ok := obj.(*appsv1.DaemonSet); ok {
		obs.Exists, obs.UID, obs.Deleting = true, ds.UID, ds.DeletionTimestamp != nil
	}
	w.mu.Lock()
	w.obs = obs
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

func (w *ownerWatch) state() (*uninstall.Owner, uninstall.Observation, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.owner, w.obs, w.changed
}

// decide tells, at SIGTERM, an uninstall from an update or a restart:
// it reads the DaemonSet afresh (bounded by timeout); when the API does not
// answer (unreachable, or the credentials already deleted), the watch's
// last word decides, and it may still arrive until timeout. Without an
// answer the table stays (fail closed).
func (w *ownerWatch) decide(log klog.Logger, timeout time.Duration) (uninstall.Verdict, string) {
	owner, obs, changed := w.state()
	if owner == nil {
		return uninstall.Keep, "the agent's DaemonSet is not known"
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	list, err := w.client.AppsV1().DaemonSets(owner.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", owner.Name).String()})
	if err == nil {
		fresh := uninstall.Observation{Known: true, At: time.Now()}
		if len(list.Items) > 0 {
			ds := list.Items[0]
			fresh.Exists, fresh.UID, fresh.Deleting = true, ds.UID, ds.DeletionTimestamp != nil
		}
		return uninstall.Decide(*owner, fresh)
	}
	log.Info("Cannot read the agent's DaemonSet at exit; deciding from its watch", "err", err)
	for {
		if v, why := uninstall.Decide(*owner, obs); v == uninstall.Remove {
			return v, why + " (seen by the watch)"
		}
		select {
		case <-changed:
			_, obs, changed = w.state()
		case <-ctx.Done():
			v, why := uninstall.Decide(*owner, obs)
			return v, fmt.Sprintf("%s (the watch's last word; the API did not answer: %v)", why, err)
		}
	}
}

// removeAtExit runs when the agent stops: if its DaemonSet is going away
// it removes the table (with the queue rules) and the program snapshot.
// ctrlDone is closed once the controller stopped: no sync may write the
// table again after its removal.
func (o *uninstallOptions) removeAtExit(log klog.Logger, w *ownerWatch, ctrlDone <-chan struct{}, stateDir string) {
	if w == nil || !o.enabled {
		return
	}
	verdict, why := w.decide(log, uninstallCheckTimeout)
	if verdict == uninstall.Keep {
		log.Info("Keeping the nftables table for the next agent", "reason", why)
		return
	}
	select {
	case <-ctrlDone:
	case <-time.After(uninstallCheckTimeout):
		log.Info("The controller has not stopped; removing the table anyway")
	}
	// The boot plugin first: left configured without an agent, it would
	// hold every new pod of the node. keepChained must not put it back.
	if o.chainDone != nil {
		<-o.chainDone
	}
	if err := removeBootPlugin(io.Discard, o.cni); err != nil {
		log.Error(err, "The agent's DaemonSet is going away but the boot plugin could not be removed; run `nftpolicy cleanup` on this node")
	}
	conn, err := nftables.New()
	if err == nil {
		defer conn.CloseLasting()
		var had bool
		had, err = uninstall.RemoveTable(conn)
		if err == nil {
			o.removed.Store(true)
			log.Info("The agent's DaemonSet is going away: removed the nftables table and its queue rules", "reason", why, "table", "inet "+compile.TableName, "hadTable", had)
		}
	}
	if err != nil {
		log.Error(err, "The agent's DaemonSet is going away but the table could not be removed; run `nftpolicy cleanup` on this node", "reason", why)
		return
	}
	if files, err := uninstall.RemoveState(stateDir); err != nil {
		log.Error(err, "Removing the program snapshot", "removed", files)
	}
}
