package kernel

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/tests/internal/dnsserver"
)

// SetClusterDNS replaces the cluster DNS server's records (FQDNRecords
// at first).
func (l *FQDNLab) SetClusterDNS(records []dnsserver.Record) { l.cluster.Set(records) }

// RemoveLabPod deletes a pod's namespace from the lab, as when the pod is
// deleted, so that a later scenario may give its addresses to another pod.
// The pod must also be gone from the scenarios applied after.
func (c *Cluster) RemoveLabPod(key string) error {
	p := c.pods[key]
	if p == nil {
		return fmt.Errorf("the lab has no pod %s", key)
	}
	if err := c.lab.RemovePod(p.name); err != nil {
		return err
	}
	delete(c.pods, key)
	return nil
}

// FQDNCounter reads one counter of a learner's metrics: the series whose
// only label has the value label, or the first series when label is "";
// 0 when there is none.
func FQDNCounter(m *fqdn.Metrics, name, label string) (float64, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		return 0, err
	}
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			if label == "" || (len(s.GetLabel()) == 1 && s.GetLabel()[0].GetValue() == label) {
				if s.GetCounter() != nil {
					return s.GetCounter().GetValue(), nil
				}
			}
		}
	}
	return 0, nil
}
