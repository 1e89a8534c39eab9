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
	capture    *captureMetrics
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
			Help:    "Unexpired learned addresses (name and address pairs) of the pod that received a learned reply, observed at each learned reply: how many elements one pod holds.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8),
		}),
		hold: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nftpolicy_dns_reply_hold_seconds",
			Help:    "Time a queued DNS reply was held by the agent (parse, kernel write, commit) before its verdict: the delay DNS learning adds to every lookup of a pod with domainNames rules.",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3, 250e-3, 1},
		}),
	}
	m.capture = newCaptureMetrics(m)
	for _, c := range []string{CauseUntrusted, CauseMalformed, CauseTruncated, CauseNotAnswer, CauseNoMatch, CauseNoAddress, CauseWriteError, CauseNoProgram} {
		m.notLearned.WithLabelValues(c)
	}
	return m
}

// Register registers the metrics.
func (m *Metrics) Register(r prometheus.Registerer) error {
	for _, c := range append([]prometheus.Collector{m.learned, m.notLearned, m.podAddrs, m.hold}, m.capture.collectors()...) {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
