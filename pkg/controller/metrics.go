package controller

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// Metrics are the agent's Prometheus metrics. Create them once with
// NewMetrics and register them with Register.
type Metrics struct {
	SyncDuration       *prometheus.HistogramVec
	TrackerCorrections prometheus.Counter
	SyncFailures       prometheus.Counter
	LastSuccessfulSync prometheus.Gauge
	SyncedInputs       prometheus.Gauge
	ProgrammingLatency prometheus.Histogram
	ProgramLag         prometheus.Histogram
	RefreshDiscards    prometheus.Counter
	ProgrammedPolicies prometheus.Gauge
	ProgrammedPods     prometheus.Gauge
	SetElements        prometheus.Gauge
	InvalidPolicies    prometheus.Gauge
	PolicyProblems     prometheus.Counter

	ClusterPolicyAPI          prometheus.Gauge
	ProgrammedClusterPolicies prometheus.Gauge
	InvalidClusterPolicies    prometheus.Gauge
	ClusterPolicyProblems     prometheus.Counter

	// RejectedPolicies counts the objects of each kind currently over
	// compile.MaxPolicyCost or their budgets (compile.Budgets);
	// PoliciesRejected counts rejections, once per object version.
	RejectedPolicies *prometheus.GaugeVec
	PoliciesRejected *prometheus.CounterVec
	// NamespaceCostMax is the largest share of the namespace budget
	// (compile.Budgets.Namespace) one namespace's NetworkPolicies use.
	NamespaceCostMax prometheus.Gauge

	QueueVerdicts    *prometheus.CounterVec
	QueueDecision    prometheus.Histogram
	QueueRuleVariant *prometheus.GaugeVec
	// QueueHeldDropped counts held connections (of unknown pod addresses)
	// dropped at a bound: bound=source (one source address held its share)
	// or bound=total (every hold slot taken).
	QueueHeldDropped *prometheus.CounterVec

	// CollectorErrors counts failed reads of the collectors that ask the
	// kernel when scraped (NewCounterCollector, NewQueueStatsCollector).
	CollectorErrors *prometheus.CounterVec

	// IncrementalFallbacks counts the changes the tracker left to a full
	// rebuild, by reason (compile.Fallback).
	IncrementalFallbacks *prometheus.CounterVec

	// OutsideChanges counts the changes other processes made to the
	// table, by kind (repair.go).
	OutsideChanges *prometheus.CounterVec
}

// NewMetrics creates the metrics, unregistered.
func NewMetrics() *Metrics {
	m := &Metrics{
		OutsideChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nftpolicy_outside_changes_total",
			Help: "Changes another process made to table inet nftpolicy (the kernel's nftables notifications), by kind: table, chain, rule, set, element, object, flowtable. Each is repaired at once by a full sync.",
		}, []string{"kind"}),
		IncrementalFallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nftpolicy_incremental_fallbacks_total",
			Help: "Pod, NetworkPolicy and ClusterNetworkPolicy changes the incremental compiler left to a full rebuild, by reason (" + fallbackReasons() + ").",
		}, []string{"reason"}),
		TrackerCorrections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftpolicy_tracker_corrections_total",
			Help: "Set elements changed by the check after pod changes had been applied incrementally (a rebuild that carries no new change): the incremental compiler disagreed with the full build (a bug: please report it with the agent's logs at -v=2).",
		}),
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nftpolicy_sync_duration_seconds", Help: "Time to compile and apply one sync, by kind: pods (pod changes applied as element changes), policies (NetworkPolicy and ClusterNetworkPolicy changes compiled alone, the changed chains and sets written), incremental (everything rebuilt, the table's differences applied) or full (the table rewritten).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"kind"}),
		SyncFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftpolicy_sync_failures_total", Help: "Syncs whose nftables transaction failed (the next sync is full).",
		}),
		LastSuccessfulSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nftpolicy_last_successful_sync_timestamp_seconds", Help: "Unix time of the last sync that committed.",
		}),
		SyncedInputs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nftpolicy_last_synced_inputs_fingerprint",
			Help: "Fingerprint (controller.InputsFingerprint, 48 bits) of the Pods, Namespaces and NetworkPolicies, with their resourceVersions, that the last committed sync was compiled from. It equals the fingerprint of the API's current objects once every change is in force.",
		}),
		ProgrammingLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nftpolicy_programming_latency_seconds", Help: "From the first API change observed to the kernel commit that includes it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		ProgramLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nftpolicy_program_lag_seconds", Help: "From a kernel commit to the publication of its program to the evaluator (explain, revocation, DNS learning, the snapshot): how long the evaluator decided with an older program than the kernel enforced.",
			Buckets: prometheus.ExponentialBuckets(0.0000625, 2, 21),
		}),
		RefreshDiscards: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftpolicy_program_refresh_discarded_total", Help: "Program refreshes after policy changes that could not be built off the sync loop or were discarded after it, because changes were applied meanwhile; three in a row make the refresh a full build on the loop.",
		}),
	}
	m.addPolicyMetrics()
	m.addQueueMetrics()
	for _, f := range compile.Fallbacks() {
		m.IncrementalFallbacks.WithLabelValues(string(f)) // every reason exported, from 0
	}
	for _, k := range []string{"table", "chain", "rule", "set", "element"} {
		m.OutsideChanges.WithLabelValues(k)
	}
	return m
}

// addPolicyMetrics creates the metrics of the program in force and of
// the policies' problems, rejections and budgets.
func (m *Metrics) addPolicyMetrics() {
	m.ProgrammedPolicies = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nftpolicy_programmed_policies", Help: "NetworkPolicies in the applied program.",
	})
	m.ProgrammedPods = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nftpolicy_programmed_local_pods", Help: "Local pods isolated by at least one policy in the applied program.",
	})
	m.SetElements = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nftpolicy_programmed_set_elements", Help: "Elements in the table's sets and maps.",
	})
	m.InvalidPolicies = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nftpolicy_invalid_policies", Help: "Policies with parts that could not be used as written (those parts allow nothing).",
	})
	m.PolicyProblems = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nftpolicy_policy_problems_total", Help: "Problems found in policies, counted once per policy version.",
	})
	m.ClusterPolicyAPI = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nftpolicy_cluster_network_policy_api_enabled",
		Help: "1 while the ClusterNetworkPolicy API (policy.networking.k8s.io/v1beta1) is served and its informer synced, so ClusterNetworkPolicies are enforced; 0 otherwise.",
	})
	m.ProgrammedClusterPolicies = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nftpolicy_programmed_cluster_network_policies", Help: "ClusterNetworkPolicies in the applied program.",
	})
	m.InvalidClusterPolicies = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nftpolicy_invalid_cluster_network_policies",
		Help: "ClusterNetworkPolicies with parts that could not be used as written (Accept parts allow nothing, Deny and Pass parts deny).",
	})
	m.ClusterPolicyProblems = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nftpolicy_cluster_network_policy_problems_total", Help: "Problems found in ClusterNetworkPolicies, counted once per policy version.",
	})
	m.RejectedPolicies = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nftpolicy_rejected_policies",
		Help: "Objects (kind NetworkPolicy or ClusterNetworkPolicy) not compiled because their cost is over the bound (compile.MaxPolicyCost) or, for a NetworkPolicy, what it makes is over its budget (--policy-cost-budget, --namespace-cost-budget); each is enforced fail-closed: a NetworkPolicy isolates its pods and allows nothing, a ClusterNetworkPolicy's Accept rules match nothing and its Deny and Pass rules deny.",
	}, []string{"kind"})
	m.PoliciesRejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nftpolicy_policies_rejected_total",
		Help: "Objects rejected and enforced fail-closed, counted once per object version, by kind and reason (cost: what it says is over compile.MaxPolicyCost; budget: what it makes is over --policy-cost-budget or --cluster-policy-cost-budget; namespace-budget: over what its namespace has left of --namespace-cost-budget).",
	}, []string{"kind", "reason"})
	m.NamespaceCostMax = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nftpolicy_namespace_cost_max_ratio",
		Help: "The largest share of --namespace-cost-budget that one namespace's NetworkPolicies were charged at the last build (what they make: entries, pods their selectors are matched against, peer set elements); 1: a namespace is at its budget and its next policy by name is rejected.",
	})
}

// addQueueMetrics creates the metrics of the NFQUEUE runtime and the
// kernel-reading collectors.
func (m *Metrics) addQueueMetrics() {
	m.QueueVerdicts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nftpolicy_queue_verdicts_total", Help: "Verdicts given to queued packets.",
	}, []string{"verdict", "protocol", "family"})
	m.QueueDecision = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "nftpolicy_queue_decision_seconds", Help: "Time the evaluator took to decide a parsed queued packet (parsing the headers and sending the verdict are not included).",
		Buckets: prometheus.ExponentialBuckets(1e-6, 2, 20),
	})
	m.QueueRuleVariant = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nftpolicy_queue_rule_variant", Help: "1 for the queue rule variant in use (native or xt-compat).",
	}, []string{"variant"})
	m.QueueHeldDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nftpolicy_queue_held_dropped_total",
		Help: "New connections of unknown pod addresses the evaluator did not hold but dropped: bound=source (their source address held its share already), bound=total (the queue's length held already).",
	}, []string{"bound"})
	m.CollectorErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nftpolicy_collector_errors_total",
		Help: "Scrapes in which a collector could not read the kernel (collector=nft_counters: the nft rule counters; collector=nfqueue_stats: the kernel's queue counters); its metrics are left out of that scrape.",
	}, []string{"collector"})
}

// fallbackReasons lists the reasons compile.Fallbacks names, for the help
// text: the tracker's list is the only one.
func fallbackReasons() string {
	var names []string
	for _, f := range compile.Fallbacks() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}

// Register adds every metric to the registerer.
func (m *Metrics) Register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.SyncDuration, m.TrackerCorrections, m.IncrementalFallbacks, m.SyncFailures, m.LastSuccessfulSync, m.SyncedInputs, m.ProgrammingLatency, m.ProgramLag, m.RefreshDiscards,
		m.ProgrammedPolicies, m.ProgrammedPods, m.SetElements, m.InvalidPolicies, m.PolicyProblems,
		m.ClusterPolicyAPI, m.ProgrammedClusterPolicies, m.InvalidClusterPolicies, m.ClusterPolicyProblems, m.RejectedPolicies, m.PoliciesRejected, m.NamespaceCostMax,
		m.QueueVerdicts, m.QueueDecision, m.QueueRuleVariant, m.QueueHeldDropped, m.CollectorErrors, m.OutsideChanges} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// ObserveHeldDrop implements the queue runtime's queue.HeldDropObserver.
func (m *Metrics) ObserveHeldDrop(bound string) { m.QueueHeldDropped.WithLabelValues(bound).Inc() }

// ObserveVerdict implements the queue runtime's observer.
func (m *Metrics) ObserveVerdict(allow bool, proto uint8, family uint8, d time.Duration) {
	verdict := "denied"
	if allow {
		verdict = "allowed"
	}
	fam := "ipv4"
	if family == 6 {
		fam = "ipv6"
	}
	m.QueueVerdicts.WithLabelValues(verdict, queue.ProtoLabel(proto), fam).Inc()
	m.QueueDecision.Observe(d.Seconds())
}
