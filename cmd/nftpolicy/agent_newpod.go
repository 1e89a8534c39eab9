package main

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// newPodOptions are the flags of the two unenforced windows: pods that send
// before the agent knows them, and connections a policy change denies.
type newPodOptions struct {
	unknownPods bool
	podCIDRs    []string
	wait        time.Duration
	// sourceRate and sourceBurst bound, per source address, the
	// connections of unknown pod addresses queued per second.
	sourceRate, sourceBurst uint32
	revoke                  bool
	metrics                 *newPodMetrics
	// uplinks are --uplink-interfaces; nil: the default routes' interfaces.
	uplinks []string
}

// parsePodCIDRs parses --pod-cidrs (config.Validate checked them) and
// checks --uplink-interfaces.
func (o *newPodOptions) parsePodCIDRs() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range o.podCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--pod-cidrs: %w", err)
		}
		out = append(out, p)
	}
	if err := compile.ValidateUplinks(o.uplinks); err != nil {
		return nil, fmt.Errorf("--uplink-interfaces: %w", err)
	}
	return out, nil
}

// configureRender applies the options to the render configuration: the
// agent's, and `nftpolicy compile`'s, which must render what the agent
// installs (without --uplink-interfaces, both take the default-route
// interfaces of the machine they run on).
func (o *newPodOptions) configureRender(render *compile.RenderConfig) {
	render.SkipUnknownPods = !o.unknownPods
	render.UplinkIfaces = o.uplinks
	if render.UplinkIfaces == nil {
		render.UplinkIfaces = defaultRouteIfaces("/proc/net/route", "/proc/net/ipv6_route")
	}
	render.HeldSourceRate, render.HeldSourceBurst = o.sourceRate, o.sourceBurst
}

// configure applies the options to the render configuration and the
// evaluator, and registers the unknown-pod metrics.
func (o *newPodOptions) configure(render *compile.RenderConfig, eval *evaluate.Evaluator, reg prometheus.Registerer) error {
	o.configureRender(render)
	eval.UnknownPodWait = o.wait
	m, err := newNewPodMetrics(reg)
	if err != nil {
		return err
	}
	eval.UnknownPods = m
	o.metrics = m
	return nil
}

// newNewPodMetrics registers the unknown-pod and revocation metrics.
func newNewPodMetrics(reg prometheus.Registerer) (*newPodMetrics, error) {
	m := &newPodMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_unknown_pod_decisions_total",
			Help: "New connections of pod addresses the agent did not know yet, by result: programmed (the pod was learned within --unknown-pod-wait and policy decided), timeout_allowed or timeout_dropped (--fail-open decided at the bound for a known source; an unknown source is always dropped). Those dropped before being held are nftpolicy_queue_held_dropped_total."},
			[]string{"result"}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "nftpolicy_unknown_pod_wait_seconds",
			Help:    "How long a new connection of an unknown pod address was held before its verdict.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 13)}),
		revoked: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_revoked_flows_total",
			Help: "Established connections deleted from conntrack because a policy change denies them, by the policy that denies them now."},
			[]string{"policy"}),
		pass: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "nftpolicy_revocation_pass_seconds",
			Help:    "Time of one revocation pass after a policy change: conntrack dump, decisions with the old and new policies, deletes.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		passFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "nftpolicy_revocation_failures_total",
			Help: "Revocation passes that failed (conntrack unreadable, or a delete refused): denied connections may keep flowing until they end; see the agent log."}),
	}
	m.ranges = prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftpolicy_pod_ranges",
		Help: "Pod address ranges the last program knows (--pod-cidrs, else Nodes' spec.podCIDRs). 0 in hybrid or queue mode: unknown pods are not held; a new connection from an unknown source on a pod interface is dropped until the pod is programmed (see docs/security.md)."})
	for _, c := range []prometheus.Collector{m.decisions, m.wait, m.revoked, m.pass, m.passFailures, m.ranges} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// startRevoker opens ctnetlink and runs the revoker; its OnProgram is the
// controller's hook. Nil (no hook) when revocation is off. The revoker
// decides with eval, and so with what pods resolved (eval.Resolved, set by
// startFQDN before the first program is published).
func (o *newPodOptions) startRevoker(ctx context.Context, eval *evaluate.Evaluator) (func(old, cur *compile.Program), error) {
	if !o.revoke {
		return nil, nil
	}
	conn, err := conntrack.Dial(0)
	if err != nil {
		return nil, fmt.Errorf("connection revocation (--revoke-connections): %w", err)
	}
	r, err := conntrack.NewRevoker(conntrack.Config{Decide: eval.DecideSides, DecideBefore: eval.DecideSidesBefore, Table: conn, Observer: o.metrics,
		Logger: klog.FromContext(ctx).WithName("conntrack")})
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	go func() {
		defer conn.Close()
		r.Run(ctx)
	}()
	return r.OnProgram, nil
}

type newPodMetrics struct {
	decisions, revoked *prometheus.CounterVec
	wait, pass         prometheus.Histogram
	passFailures       prometheus.Counter
	ranges             prometheus.Gauge
}

// rangesHook is an OnProgram hook that reports the pod ranges of each
// program (nftpolicy_pod_ranges) and warns when a program has none while
// unknown pods are to be held: the agent never runs without them silently.
func (o *newPodOptions) rangesHook(log klog.Logger, render compile.RenderConfig) func(old, cur *compile.Program) {
	return func(old, cur *compile.Program) {
		if cur == nil {
			return
		}
		o.metrics.ranges.Set(float64(len(cur.PodCIDRs)))
		if len(cur.PodCIDRs) == 0 && render.QueuesUnknownPods() && (old == nil || len(old.PodCIDRs) > 0) {
			log.Info("WARNING: no pod address ranges known (no --pod-cidrs, no Node has spec.podCIDRs): unknown pods cannot be held; a new connection from an unknown source on a pod interface is dropped until the pod is programmed. Set --pod-cidrs to hold them instead",
				"uplinks", render.UplinkIfaces)
		}
	}
}

// defaultRouteIfaces returns the interfaces of the IPv4 and IPv6 default
// routes (/proc/net/route, /proc/net/ipv6_route), sorted, each once; lo's
// unreachable IPv6 default is not one. Unreadable files give none.
func defaultRouteIfaces(route4, route6 string) []string {
	seen := map[string]bool{}
	if b, err := os.ReadFile(route4); err == nil {
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// Iface Destination Gateway Flags RefCnt Use Metric Mask ...
			if f := strings.Fields(line); len(f) >= 8 && f[1] == "00000000" && f[7] == "00000000" {
				seen[f[0]] = true
			}
		}
	}
	if b, err := os.ReadFile(route6); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			// dest destlen src srclen nexthop metric refcnt use flags iface
			if f := strings.Fields(line); len(f) == 10 && f[1] == "00" && strings.Trim(f[0], "0") == "" && f[9] != "lo" {
				seen[f[9]] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (m *newPodMetrics) ObserveUnknownPod(result string, waited time.Duration) {
	m.decisions.WithLabelValues(result).Inc()
	m.wait.Observe(waited.Seconds())
}

func (m *newPodMetrics) ObserveRevoked(policy string) { m.revoked.WithLabelValues(policy).Inc() }

func (m *newPodMetrics) ObservePass(d time.Duration, _ int, err error) {
	m.pass.Observe(d.Seconds())
	if err != nil {
		m.passFailures.Inc()
	}
}

// maxHeldPerSource is the userspace bound on one source's held packets:
// what the kernel's per-source limit lets into the queue during one wait.
func (o *newPodOptions) maxHeldPerSource() int {
	return int(o.sourceBurst) + int(math.Ceil(float64(o.sourceRate)*o.wait.Seconds()))
}
