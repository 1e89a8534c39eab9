package publish

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the publisher's metrics.
type Metrics struct {
	Leader     prometheus.Gauge
	Slices     prometheus.Gauge
	Pods       prometheus.Gauge
	Writes     *prometheus.CounterVec
	WriteDelay prometheus.Histogram
}

// NewMetrics makes the metrics, unregistered.
func NewMetrics() *Metrics {
	return &Metrics{
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftpolicy_publisher_leader",
			Help: "1 while this publisher holds the Lease and publishes, else 0."}),
		Slices: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftpolicy_publisher_slices",
			Help: "PodAddressSlices the leader means to publish (0 on a standby)."}),
		Pods: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftpolicy_publisher_pods",
			Help: "Pods the leader publishes in its slices (eligible pods with an address)."}),
		Writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_publisher_writes_total",
			Help: "Writes of PodAddressSlices by op=create|update|delete and result=ok|conflict|error (conflict: the slice changed since it was read, as after another leader's write)."},
			[]string{"op", "result"}),
		WriteDelay: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "nftpolicy_publisher_write_delay_seconds",
			Help:    "From the first pod event a slice's write carries to the end of that write.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}}),
	}
}

// Register registers the metrics.
func (m *Metrics) Register(r prometheus.Registerer) error {
	return errors.Join(r.Register(m.Leader), r.Register(m.Slices), r.Register(m.Pods),
		r.Register(m.Writes), r.Register(m.WriteDelay))
}
