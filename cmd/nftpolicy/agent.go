package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/config"
	"github.com/nftpolicy/nftpolicy/pkg/controller"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
	"github.com/nftpolicy/nftpolicy/pkg/tablewatch"
	"github.com/nftpolicy/nftpolicy/pkg/version"
)

// agentOptions are the flags of `nftpolicy agent`.
type agentOptions struct {
	// cfg is the effective configuration (defaults, --config, flags);
	// applyConfig fills in the fields below from it.
	cfg *config.AgentConfiguration
	// configFile is --config.
	configFile     string
	kubeconfig     string
	podCompress    bool
	hostname       string
	nodeIPs        []string
	mode           string
	failOpen       bool
	sourceValid    bool
	tunnel         tunnelOptions
	queueNum       uint16
	queues         uint16
	queueVariant   string
	allowMark      uint32
	metricsAddr    string
	profiling      bool
	healthAddr     string
	fullSyncPeriod time.Duration
	refreshDelay   time.Duration
	budgets        compile.Budgets
	cnpCheck       time.Duration
	livenessBudget time.Duration
	maxQueueLen    uint32
	// queueSourceRate and queueSourceBurst bound, per source address, queue
	// mode's new connections queued per second.
	queueSourceRate, queueSourceBurst uint32
	logs                              *logsapi.LoggingConfiguration
	// queueProber answers --queue-variant auto; the kernel's, in the
	// agent's own network namespace, unless a test sets another.
	queueProber queuerule.QueueProber
	denyLog     denyLogOptions
	stagedLog   stagedLogOptions
	verify      verifyOptions
	newPod      newPodOptions
	fqdn        fqdnOptions
	state       stateOptions
	serving     servingOptions
	status      statusOptions
	preview     previewServerOptions
	uninstall   uninstallOptions
	watch       watchOptions
}

const agentUsage = `usage: nftpolicy agent [--config FILE] [flags]

Enforces NetworkPolicies and ClusterNetworkPolicies for the pods of this node.
Settings come from their defaults, then the AgentConfiguration file --config
names (docs/config.md), then the flags given on the command line, which win.`

func runAgent(args []string, stdout, stderr io.Writer) int {
	o := &agentOptions{queueProber: queuerule.KernelQueueProber{}}
	if code, ok := parseAgentArgs(o, args, stderr, agentUsage); !ok {
		return code
	}
	if err := logsapi.ValidateAndApply(o.logs, nil); err != nil {
		fmt.Fprintf(stderr, "nftpolicy: logging flags: %v\n", err)
		return exitBadInput
	}
	defer logs.FlushLogs()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := klog.Background().WithName("agent")
	ctx = klog.NewContext(ctx, logger)
	info := version.Get()
	logger.Info("Starting nftpolicy agent", "version", info.Version, "commit", info.Commit, "goVersion", info.GoVersion, "platform", info.Platform)
	if cfg, err := effectiveConfigJSON(o.cfg); err == nil {
		logger.V(1).Info("Effective configuration", "configFile", o.configFile, "config", string(cfg))
	}
	if err := applyMemoryLimit(logger); err != nil {
		logger.Error(err, "Invalid memory limit")
		return exitBadInput
	}
	if err := agent(ctx, o); err != nil {
		logger.Error(err, "Agent failed")
		return exitFailure
	}
	return exitOK
}

func (o *agentOptions) nodeName() (string, error) {
	if o.hostname != "" {
		return strings.ToLower(o.hostname), nil
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		return strings.ToLower(n), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("finding the node name: %w", err)
	}
	return strings.ToLower(h), nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// builtinTypesConfig is cfg for the API's built-in types (pods,
// namespaces, nodes, NetworkPolicies, events), which the API server also
// serves as protobuf: decoding a large pod list from protobuf costs a
// fraction of the CPU and garbage of JSON, at start-up when it competes
// with the first sync and on every watch event after. Custom resources
// have no protobuf encoding; their client keeps cfg's JSON.
func builtinTypesConfig(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return c
}

// renderConfig is the render configuration of the queue and share flags
// (the rest is filled in as the agent starts).
func (o *agentOptions) renderConfig(mode compile.Mode) (compile.RenderConfig, error) {
	o.queues = queueCount(o.queues)
	dnsQueue, err := o.fqdn.dnsQueueNum(o.queueNum, o.queues)
	if err != nil {
		return compile.RenderConfig{}, err
	}
	ports, peers, err := o.tunnel.parse()
	if err != nil {
		return compile.RenderConfig{}, err
	}
	return compile.RenderConfig{Mode: mode, QueueNum: o.queueNum, Queues: o.queues, FailOpen: o.failOpen, AllowMark: o.allowMark,
		DNSQueueNum: dnsQueue, NoSourceValidation: !o.sourceValid, QueueSourceRate: o.queueSourceRate, QueueSourceBurst: o.queueSourceBurst,
		TunnelUDPPorts: ports, TunnelPeers: peers}, nil
}

// chooseQueueVariant returns the variant the flag names, or, for auto, the
// one the kernel supports. A kernel with neither is an error: every sync
// in queue mode would fail.
func chooseQueueVariant(ctx context.Context, flag string, prober queuerule.QueueProber) (compile.QueueVariant, error) {
	switch flag {
	case string(compile.QueueNative):
		return compile.QueueNative, nil
	case string(compile.QueueXTCompat):
		return compile.QueueXTCompat, nil
	case "auto":
	default:
		return "", fmt.Errorf("--queue-variant %q: must be auto, native or xt-compat", flag)
	}
	v, err := queuerule.ChooseQueueVariant(ctx, prober)
	switch {
	case errors.Is(err, queuerule.ErrNoQueueSupport):
		return "", fmt.Errorf("--queue-variant auto: %w; queue mode cannot work on this node (use --mode hybrid or kernel, or a kernel with either)", err)
	case err != nil:
		return "", fmt.Errorf("--queue-variant auto: %w", err)
	}
	return v, nil
}

// agent runs the agent until ctx ends or a part fails: the queues first,
// then the API clients, the ruleset's writer, the controller and the
// servers around it.
func agent(ctx context.Context, o *agentOptions) error {
	log := klog.FromContext(ctx)
	mode, node, nodeIPs, err := o.parse()
	if err != nil {
		return err
	}
	metrics, reg, err := newRegistry()
	if err != nil {
		return err
	}

	render, err := o.renderConfig(mode)
	if err != nil {
		return err
	}
	dnsQueue := render.DNSQueueNum
	eval := &evaluate.Evaluator{OpenWithoutProgram: o.failOpen}
	podCIDRs, err := o.newPod.parsePodCIDRs()
	if err != nil {
		return err
	}
	if err := o.newPod.configure(&render, eval, reg); err != nil {
		return err
	}
	errs := make(chan error, 4)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Full builds and program snapshots are bursts of garbage; the memory
	// they free is returned to the OS once both pause.
	release := controller.NewMemoryReleaser(controller.DefaultMemoryReleaseDelay)
	o.state.afterWrite = release.Soon
	// The queues are answered first, before the slower start-up steps, from
	// the program snapshot if there is one (agent_queue.go).
	stopQueue, done, err := o.startQueue(ctx, &render, node, eval, reg, metrics, errs)
	defer stopQueue()
	if done || err != nil {
		return err
	}
	client, podClient, policyClient, dyn, err := apiClients(o.kubeconfig, node, o.podCompress)
	if err != nil {
		return err
	}
	// The DaemonSet's watch outlives ctx (a SIGTERM): its last word decides
	// at exit whether the table stays.
	ownerCtx, stopOwner := context.WithCancel(context.WithoutCancel(ctx))
	defer stopOwner()
	owner := o.uninstall.start(ownerCtx, client)
	if err := o.finishRenderConfig(ctx, &render, dnsQueue, metrics); err != nil {
		return err
	}
	syncer, elements, closeSyncer, err := newSyncer(render, reg, log, &o.watch)
	defer closeSyncer()
	if err != nil {
		return err
	}
	recorder, stopEvents := eventRecorder(ctx, client, node, log)
	defer stopEvents()

	onProgram, err := o.newPod.startRevoker(ctx, eval)
	if err != nil {
		return err
	}
	// Hooks after each publication: revocation, and DNS learning's
	// clean-up (added by startFQDN, before the controller runs).
	hooks := &controller.Hooks{}
	hooks.OnProgram(onProgram)
	hooks.OnProgram(o.newPod.rangesHook(log, render))
	podStore, err := slicedPodStore(o.cfg, node, client, podClient, recorder, reg, log)
	if err != nil {
		return err
	}
	ctrl, err := o.status.newController(ctx, controller.Config{
		Client: client, PodClient: podClient, PodStore: podStore, PolicyClient: policyClient, ClusterPolicyCheckPeriod: o.cnpCheck, NodeName: node, NodeIPs: nodeIPs, Render: render, Syncer: syncer, Evaluator: eval,
		Metrics: metrics, Recorder: recorder, FullSyncPeriod: o.fullSyncPeriod, ProgramRefreshDelay: o.refreshDelay, Logger: log,
		PodCIDRs: podCIDRs, Budgets: o.budgets, Hooks: hooks, MemoryReleaser: release,
	}, dyn, reg)
	if err != nil {
		return err
	}
	reg.MustRegister(controller.NewCounterCollector(10*time.Second, nftnl.NewConn(compile.TableName, 0), metrics, log.WithName("metrics")).WithRules(syncer.CommittedRule))

	if err := o.startServers(ctx, reg, ctrl, client, node, errs); err != nil {
		return err
	}
	o.preview.start(ctx, &previewServer{node: node, snapshot: ctrl.Snapshot, current: ctrl.Program, eval: eval, revoke: o.newPod.revoke, afterBuild: release.Soon})
	if render.LearnsDNS() {
		o.fqdn.removed = &o.uninstall.removed
		stopDNS, err := o.fqdn.startFQDN(ctx, render, dnsQueue, eval, elements, client, reg, errs, hooks)
		defer stopDNS()
		if err != nil {
			return err
		}
	}
	if err := o.startNFLOGReaders(ctx, render, node, eval, reg); err != nil {
		return err
	}
	return o.run(ctx, ctrl, mode, node, owner, errs)
}

// run runs the controller until ctx ends or a part fails. At the end,
// unless the agent's DaemonSet is going away, the table stays: kernel-
// decided verdicts remain enforced while the agent is away; queued packets
// are dropped (or, with --fail-open, let through) by the kernel until an
// agent listens again.
func (o *agentOptions) run(ctx context.Context, ctrl *controller.Controller, mode compile.Mode, node string, owner *ownerWatch, errs chan error) error {
	log := klog.FromContext(ctx)
	o.watch.startTableWatch(ctx, ctrl)
	o.uninstall.keepChained(ctx)
	ctrlDone := make(chan struct{})
	go func() {
		err := ctrl.Run(ctx)
		close(ctrlDone)
		errs <- wrapErr("controller", err)
	}()
	log.Info("nftpolicy agent started", "node", node, "mode", mode, "failOpen", o.failOpen)
	select {
	case <-ctx.Done():
		if o.uninstall.removeAtExit(log, owner, ctrlDone, o.state.dir); o.uninstall.removed.Load() {
			return nil
		}
		log.Info("Shutting down; the nftables ruleset stays in place", "queuedPacketsWhileAway", map[bool]string{true: "accepted", false: "dropped"}[o.failOpen])
		return nil
	case err := <-errs:
		return err
	}
}

// parse reads the settings the agent needs first: the mode, the node's
// name and addresses (config.Validate checked the rest).
func (o *agentOptions) parse() (mode compile.Mode, node string, nodeIPs []netip.Addr, err error) {
	if mode, err = compile.ParseMode(o.mode); err != nil {
		return "", "", nil, err
	}
	if node, err = o.nodeName(); err != nil {
		return "", "", nil, err
	}
	for _, s := range o.nodeIPs {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return "", "", nil, fmt.Errorf("--node-ip: %w", err)
		}
		nodeIPs = append(nodeIPs, a)
	}
	return mode, node, nodeIPs, nil
}

// newRegistry returns the agent's metrics, registered with the Go and
// process collectors in a registry of their own.
func newRegistry() (*controller.Metrics, *prometheus.Registry, error) {
	metrics := controller.NewMetrics()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		controller.NewBuildInfo(version.Get()))
	if err := metrics.Register(reg); err != nil {
		return nil, nil, fmt.Errorf("registering metrics: %w", err)
	}
	return metrics, reg, nil
}

// apiClients returns the clients of the built-in types (protobuf), of
// pods (decoded straight into their stored form), of ClusterNetworkPolicies
// and of the node's NodeEnforcement (dynamic).
func apiClients(kubeconfig, node string, podCompress bool) (kubernetes.Interface, rest.Interface, npaclient.Interface, dynamic.Interface, error) {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("loading client configuration: %w", err)
	}
	cfg.UserAgent = "nftpolicy/" + node
	client, err := kubernetes.NewForConfig(builtinTypesConfig(cfg))
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("creating client: %w", err)
	}
	podCfg := rest.CopyConfig(cfg)
	podCfg.DisableCompression = !podCompress
	podClient, err := slim.NewPodClient(podCfg)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("creating the pod client: %w", err)
	}
	// ClusterNetworkPolicy and NodeEnforcement are custom resources: JSON
	// only.
	policyClient, err := npaclient.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("creating the ClusterNetworkPolicy client: %w", err)
	}
	// The NodeEnforcement's writer keeps one write in flight and coalesces
	// what comes meanwhile: client-go's token bucket (5 a second) would
	// only hold a report back, up to 200 ms after a few changes. The API
	// server bounds the agents' writes (install.yaml's FlowSchema).
	statusCfg := rest.CopyConfig(cfg)
	statusCfg.QPS = -1
	dyn, err := dynamic.NewForConfig(statusCfg)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("creating the NodeEnforcement client: %w", err)
	}
	return client, podClient, policyClient, dyn, nil
}

// finishRenderConfig completes render with what the kernel supports: the
// queue rule's variant (without one, hybrid mode queues nothing), the DNS
// queue's number, and the deny log's settings; then validates it.
func (o *agentOptions) finishRenderConfig(ctx context.Context, render *compile.RenderConfig, dnsQueue uint16, metrics *controller.Metrics) error {
	log := klog.FromContext(ctx)
	if render.UsesQueue() || render.LearnsDNS() {
		v, err := chooseQueueVariant(ctx, o.queueVariant, o.queueProber)
		if err != nil && render.Mode != compile.ModeQueue {
			// Hybrid mode works without queueing, but for what only
			// userspace can decide.
			log.Error(err, "Nothing can be queued on this node: connections of pods this agent has not seen yet are not held, and domainNames peers match nothing")
			render.NoDNSLearning = true
			render.SkipUnknownPods = true
			v = compile.QueueNative
		} else if err != nil {
			return err
		}
		render.QueueVariant = v
		metrics.QueueRuleVariant.WithLabelValues(string(v)).Set(1)
		log.Info("Queue rule variant chosen", "variant", v, "queues", compile.QueueRange(render.QueueNum, render.Queues), "failOpen", o.failOpen)
	}
	if render.LearnsDNS() {
		// Before the first sync, which points the DNS queue rule there.
		n, err := chooseDNSQueue(log, dnsQueue)
		if err != nil {
			return err
		}
		render.DNSQueueNum = n
	}
	return o.configureLogs(render)
}

// configureLogs turns on the kernel side of the deny log, the staged log
// and runtime verification as their flags say, fills in the defaults and
// validates: the end of the agent's render configuration, and of
// `nftpolicy compile`'s (compileRenderConfig), which must render what the
// agent installs.
func (o *agentOptions) configureLogs(render *compile.RenderConfig) error {
	o.denyLog.configureDenyLog(render)
	o.stagedLog.configureStagedLog(render)
	o.verify.configureVerify(render)
	render.Defaults()
	return render.Validate()
}

// newSyncer returns the syncer that writes the node's table, and the
// netlink writer it shares with DNS learning; closeAll releases both and
// the nft process kept in advance, also after an error. It gives watch the
// owner of the agent's transactions when its nft processes are known.
func newSyncer(render compile.RenderConfig, reg *prometheus.Registry, log klog.Logger, watch *watchOptions) (syncer *sets.Syncer, elements *nftnl.Conn, closeAll func(), err error) {
	var closers []func()
	closeAll = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	plainNFT, err := knftables.New(knftables.InetFamily, compile.TableName)
	if err != nil {
		return nil, nil, closeAll, fmt.Errorf("nftables: %w", err)
	}
	// Transactions go to an nft process started in advance: a policy
	// change does not wait for nft to start.
	var nft knftables.Interface = plainNFT
	if warm, err := sets.NewWarmNFT(plainNFT, log.WithName("nft")); err != nil {
		log.Info("Each transaction starts its own nft process", "reason", err)
	} else {
		closers = append(closers, func() { warm.Close() })
		nft = warm
		watch.owner = tablewatch.NewOwner()
		warm.SetOnStart(watch.owner.AddChild)
	}
	// Pod churn and policy edits go to the kernel over netlink, in one
	// batch per sync.
	elements = nftnl.NewConn(compile.TableName, 0)
	closers = append(closers, func() { elements.Close() })
	syncer, err = sets.New(sets.Config{NFT: nft, Logger: log.WithName("sets"), External: compatInstaller(render),
		Netlink: elements, OneCommandPerSet: true})
	if err != nil {
		return nil, nil, closeAll, err
	}
	reg.MustRegister(netlinkFallbacksMetric(syncer.NetlinkFallbacks))
	return syncer, elements, closeAll, nil
}

// netlinkFallbacksMetric is nftpolicy_netlink_batch_fallbacks_total, read
// from the syncer's count when scraped.
func netlinkFallbacksMetric(count func() int64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "nftpolicy_netlink_batch_fallbacks_total",
		Help: "Netlink batches (elements, or chains, rules and sets) the kernel refused (nothing applied; a full sync followed).",
	}, func() float64 { return float64(count()) })
}

// eventRecorder returns a recorder of the agent's Events (as component
// nftpolicy on node) and the function that stops sending them.
func eventRecorder(ctx context.Context, client kubernetes.Interface, node string, log klog.Logger) (record.EventRecorder, func()) {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(controller.EventSink{
		Sink: &typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}, Logger: log.WithName("events"),
	})
	return broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "nftpolicy", Host: node}), broadcaster.Shutdown
}

func wrapErr(what string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// metricsMux serves /metrics from reg and, with profiling, Go's profiles
// under /debug/pprof/, behind the same listener and authentication.
func metricsMux(reg prometheus.Gatherer, profiling bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{MaxRequestsInFlight: metricsMaxInFlight}))
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// compatInstaller installs the xt NFQUEUE rule over netlink when the
// ruleset uses the xt-compat variant.
func compatInstaller(render compile.RenderConfig) sets.ExternalRules {
	if !(render.UsesQueue() || render.LearnsDNS()) || render.QueueVariant != compile.QueueXTCompat {
		return nil
	}
	return func(ctx context.Context, chain string) error {
		conn, err := nftables.New()
		if err != nil {
			return fmt.Errorf("netlink: %w", err)
		}
		defer conn.CloseLasting()
		return queuerule.InstallCompatQueueRule(conn, compile.TableName, chain, queuerule.CompatRuleConfig(render, chain))
	}
}
