package fqdn

import (
	"github.com/prometheus/client_golang/prometheus"
)

// queryUntrusted is the cause label of a query to a server whose replies
// are never learned.
const queryUntrusted = "untrusted_server"

// captureMetrics count what query matching and stream tracking
// (HandlePacket) keep and drop.
type captureMetrics struct {
	queriesRecorded    prometheus.Counter
	queriesNotRecorded *prometheus.CounterVec
	queriesEvicted     prometheus.Counter
	outstanding        prometheus.Gauge
	segmentsDropped    prometheus.Counter
	streamsUntracked   *prometheus.CounterVec
	streams            prometheus.Gauge
}

func newCaptureMetrics(m *Metrics) *captureMetrics {
	c := &captureMetrics{
		queriesRecorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftpolicy_dns_queries_recorded_total",
			Help: "DNS queries of pods with domainNames rules recorded as outstanding: only replies that answer one are learned.",
		}),
		queriesNotRecorded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nftpolicy_dns_queries_not_recorded_total",
			Help: "DNS queries of pods with domainNames rules released without being recorded (their replies are not learned), by cause: untrusted_server (the replies would not be learned anyway), malformed (not a query with one question), untracked_stream (a TCP connection that is not followed).",
		}, []string{"cause"}),
		queriesEvicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftpolicy_dns_queries_evicted_total",
			Help: "Outstanding DNS queries forgotten before their reply because the pod (or all pods) had too many outstanding: their replies are not learned.",
		}),
		outstanding: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nftpolicy_dns_queries_outstanding",
			Help: "Outstanding DNS queries over UDP (recorded, not answered, not expired yet).",
		}),
		segmentsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftpolicy_dns_tcp_segments_dropped_total",
			Help: "DNS-over-TCP segments dropped because they start beyond the next byte of their stream (a segment before them is missing); TCP sends them again in order.",
		}),
		streamsUntracked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nftpolicy_dns_tcp_streams_untracked_total",
			Help: "DNS-over-TCP connections no longer followed, whose replies are then released unlearned, by cause: evicted (the pod's or the node's bound on followed connections), buffer_limit (the pod's or the node's bound on buffered bytes), message_too_long, syn_mismatch (a second SYN-ACK with another sequence number), truncated_capture.",
		}, []string{"cause"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nftpolicy_dns_tcp_streams",
			Help: "DNS-over-TCP connections tracked (followed, or kept as not followed).",
		}),
	}
	for _, cause := range []string{queryUntrusted, CauseMalformed, CauseUntracked} {
		c.queriesNotRecorded.WithLabelValues(cause)
	}
	for _, cause := range []string{untrackEvicted, untrackBuffer, untrackTooLong, untrackISN, untrackTruncate} {
		c.streamsUntracked.WithLabelValues(cause)
	}
	for _, cause := range []string{CauseUnsolicited, CauseUntracked} {
		m.notLearned.WithLabelValues(cause)
	}
	return c
}

func (c *captureMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{c.queriesRecorded, c.queriesNotRecorded, c.queriesEvicted, c.outstanding, c.segmentsDropped, c.streamsUntracked, c.streams}
}
