package monitoring

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestMonitoringObjectsAccepted applies deploy/monitoring's objects to a
// real kube-apiserver that serves the Prometheus Operator's CRDs
// (hack/monitoring-crds.sh: a pinned release's manifests from the Go module
// proxy), with strict field validation: a misspelled or misplaced field of
// the ServiceMonitor, the PrometheusRule, the Service or the RBAC objects
// is refused, as is a value the CRDs' schemas reject.
func TestMonitoringObjectsAccepted(t *testing.T) {
	out, err := exec.Command("bash", "../../hack/monitoring-crds.sh").Output()
	if err != nil {
		t.Fatalf("hack/monitoring-crds.sh: %v", err)
	}
	crds := strings.Fields(string(out))
	env := cluster.StartControlPlane(t)
	for _, crd := range crds {
		if out, err := env.Kubectl(t, "apply", "--server-side", "-f", crd); err != nil {
			t.Fatalf("applying %s: %v\n%s", crd, err, out)
		}
	}
	if out, err := env.Kubectl(t, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com"); err != nil {
		t.Fatalf("waiting for the CRDs: %v\n%s", err, out)
	}
	for _, f := range []string{"servicemonitor.yaml", "prometheusrule.yaml"} {
		path, err := filepath.Abs(filepath.Join(kitDir, f))
		if err != nil {
			t.Fatal(err)
		}
		out, err := env.Kubectl(t, "apply", "--server-side", "--validate=strict", "-f", path)
		if err != nil {
			t.Errorf("applying %s: %v\n%s", f, err, out)
			continue
		}
		t.Logf("%s:\n%s", f, out)
	}
}
