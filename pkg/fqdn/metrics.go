package fqdn

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are DNS learning's Prometheus metrics.
type Metrics struct {
	learned    prometheus.Counter
	notLearned *prometheus.CounterVec
	podAddrs   prometheus.Histogram
	hold       prometheus.Histogram
	// answersSkipped counts address records not learned, by cause;
	// evictions the names evicted past a pod's bounds; deleteFailures the
	// kernel deletions of learned elements that failed.
	answersSkipped *prometheus.CounterVec
	evictions      prometheus.Counter
	deleteFailures prometheus.Counter
	capture        *captureMetrics
}

// NewMetrics creates the metrics, unregistered.
func NewMetrics() *Metrics {
	m := &Metrics{
		learned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftpolicy_dns_replies_learned_total",
			Help: "DNS replies to pods with domainNames egress rules whose answers were written to the kernel before the reply was released.",
		}),
		notLearned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nftpolicy_dns_replies_not_learned_total",
			Help: "DNS replies released (or, for write_failed without --fail-open, dropped) without learning, by cause: untrusted_source (not from the cluster DNS endpoints or --dns-servers), unsolicited (answers no outstanding query of the pod: never asked, already answered, expired, another question), untracked_stream (a DNS-over-TCP connection that is not followed), malformed, truncated (TC bit: the client retries over TCP), not_a_response, no_matching_name, no_address, write_failed (the kernel refused the elements), no_program.",
		}, []string{"cause"}),
		podAddrs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nftpolicy_dns_pod_learned_addresses",
			Help:    "Learned name and address pairs the pod that received a learned reply holds (expired ones until dropped), observed at each learned reply: at most --fqdn-max-addresses-per-pod.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8),
		}),
		hold: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nftpolicy_dns_reply_hold_seconds",
			Help:    "Time a queued DNS reply was held by the agent (parse, kernel write, commit) before its verdict: the delay DNS learning adds to every lookup of a pod with domainNames rules.",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3, 250e-3, 1},
		}),
		answersSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nftpolicy_dns_answers_not_learned_total",
			Help: "Address records of learned DNS replies that were not learned, by cause: ipv4_mapped (an AAAA record holding ::ffff:a.b.c.d, which only an A record may admit), not_unicast (unspecified, loopback, multicast or broadcast), over_pod_bound (one reply holding more than the pod may keep).",
		}, []string{"cause"}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftpolicy_dns_learned_evictions_total",
			Help: "Learned names evicted, least recently learned first, because a pod's lookups exceeded its bounds (--fqdn-max-names-per-pod, --fqdn-max-addresses-per-pod); their addresses' kernel elements are deleted unless another kept name resolves to them.",
		}),
		deleteFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftpolicy_dns_learned_delete_failures_total",
			Help: "Kernel deletions of learned elements (evicted names, pods that left) that failed: those elements stay until their timeout.",
		}),
	}
	for _, c := range []string{AnswerMapped, AnswerNotUnicast, AnswerOverBound} {
		m.answersSkipped.WithLabelValues(c)
	}
	m.capture = newCaptureMetrics(m)
	for _, c := range []string{CauseUntrusted, CauseMalformed, CauseTruncated, CauseNotAnswer, CauseNoMatch, CauseNoAddress, CauseWriteError, CauseNoProgram} {
		m.notLearned.WithLabelValues(c)
	}
	return m
}

// Register registers the metrics.
func (m *Metrics) Register(r prometheus.Registerer) error {
	for _, c := range append([]prometheus.Collector{m.learned, m.notLearned, m.podAddrs, m.hold, m.answersSkipped, m.evictions, m.deleteFailures}, m.capture.collectors()...) {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
