package podstore

import "github.com/prometheus/client_golang/prometheus"

// SliceMetrics are the Sliced store's metrics.
type SliceMetrics struct {
	// Source is 1 for the pod source in use, 0 for the other.
	Source *prometheus.GaugeVec
	// Slices and Entries are the slices and pod entries held.
	Slices, Entries prometheus.Gauge
	// Rejected counts slices not read whole, by reason (invalid: entries
	// left out; limit: the slice left out).
	Rejected *prometheus.CounterVec
}

// NewSliceMetrics returns the metrics, unregistered.
func NewSliceMetrics() *SliceMetrics {
	m := &SliceMetrics{
		Source: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nftpolicy_pod_source",
			Help: "1 for the agent's source of other nodes' pods in use: pods (every Pod) or slices (PodAddressSlices)."}, []string{"source"}),
		Slices: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftpolicy_pod_slices",
			Help: "PodAddressSlices held."}),
		Entries: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftpolicy_pod_slice_entries",
			Help: "Pod entries held from PodAddressSlices (the agent's own node's left out)."}),
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_pod_slices_rejected_total",
			Help: "PodAddressSlices not read whole: invalid (bad entries left out, their pods unknown) or limit (the slice left out)."}, []string{"reason"}),
	}
	m.Source.WithLabelValues(SourcePods)
	m.Source.WithLabelValues(SourceSlices)
	return m
}

// Register registers the metrics on reg.
func (m *SliceMetrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.Source, m.Slices, m.Entries, m.Rejected} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *SliceMetrics) setSource(source string) {
	for _, s := range []string{SourcePods, SourceSlices} {
		v := 0.0
		if s == source {
			v = 1
		}
		m.Source.WithLabelValues(s).Set(v)
	}
}
