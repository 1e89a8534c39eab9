package fqdn

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// MetricValue returns one counter of m: by metric name, and by its label
// value for the counters with a cause label.
func MetricValue(m *Metrics, name, label string) float64 {
	var c prometheus.Collector
	switch name {
	case "nftpolicy_dns_replies_not_learned_total":
		c = m.notLearned.WithLabelValues(label)
	case "nftpolicy_dns_answers_not_learned_total":
		c = m.answersSkipped.WithLabelValues(label)
	case "nftpolicy_dns_learned_evictions_total":
		c = m.evictions
	case "nftpolicy_dns_learned_delete_failures_total":
		c = m.deleteFailures
	default:
		panic("no counter " + name)
	}
	return testutil.ToFloat64(c)
}
