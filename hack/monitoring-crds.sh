#!/usr/bin/env bash
# hack/monitoring-crds.sh prints the paths of the Prometheus Operator's
# ServiceMonitor and PrometheusRule CRD manifests of a pinned
# prometheus-operator release, from the Go module cache (downloading the
# module through the Go module proxy when it is missing). tests/monitoring
# installs them in the lab's API server and applies deploy/monitoring's
# objects with strict field validation; the repository carries no copy.
#
# Usage: bash hack/monitoring-crds.sh   # one path a line
set -euo pipefail

PROMETHEUS_OPERATOR_VERSION=v0.85.0 # github.com/prometheus-operator/prometheus-operator
mod=github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION
# Outside this module (it is no dependency of go.mod).
dir=$(cd / && GOWORK=off GOFLAGS=-mod=mod go mod download -json "$mod" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
if [[ -z $dir ]]; then
	echo "hack/monitoring-crds.sh: go mod download gave no directory for $mod" >&2
	exit 1
fi
for kind in servicemonitors prometheusrules; do
	file=$dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml
	if [[ ! -f $file ]]; then
		echo "hack/monitoring-crds.sh: $file does not exist" >&2
		exit 1
	fi
	printf '%s\n' "$file"
done
