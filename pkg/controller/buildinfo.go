package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftpolicy/nftpolicy/pkg/version"
)

// NewBuildInfo returns the nftpolicy_build_info gauge: 1, labelled with the
// agent's version, commit and Go version, so that a dashboard can tell
// which agents a rollout has reached (the usual Prometheus build-info
// idiom: join on it, or count by version).
func NewBuildInfo(info version.Info) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nftpolicy_build_info",
		Help: "Always 1; the labels are the agent's version, the commit it was built from and its Go version.",
	}, []string{"version", "commit", "goversion"})
	g.WithLabelValues(info.Version, info.Commit, info.GoVersion).Set(1)
	return g
}
