#!/usr/bin/env bash
# hack/chart-sync.sh remakes charts/nftpolicy/templates/install.yaml from
# install.yaml (hack/release/chart.go: the DaemonSet's settings become
# values, everything else is copied), and charts/nftpolicy/templates/
# publisher.yaml from deploy/publisher.yaml (rendered with
# publisher.enabled). Run it after changing either;
# it stops, naming the line, when install.yaml moved a line the chart makes
# a value of. go test ./hack/release fails while the two differ.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GOWORK=off go run ./hack/release chart-sync -in install.yaml -out charts/nftpolicy/templates/install.yaml
