#!/usr/bin/env bash
# hack/crd.sh prints the path of the ClusterNetworkPolicy CRD manifest of the
# sigs.k8s.io/network-policy-api version in go.mod, from the Go module cache
# (downloading the module through the Go module proxy when it is missing).
# Tests and the conformance scripts install exactly the CRD whose Go types
# the agent was built with; the repository does not carry a copy.
#
# Usage: bash hack/crd.sh [standard|experimental]   (default: standard)
#   standard      the API's standard channel
#   experimental  adds egress peers `nodes` and `domainNames` and the
#                 `destinationNamedPort` protocol entry
# Example: kubectl apply -f "$(bash hack/crd.sh experimental)"
set -euo pipefail

channel=${1:-standard}
case $channel in
standard | experimental) ;;
*)
	printf 'usage: %s [standard|experimental]\n' "$0" >&2
	exit 2
	;;
esac

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Without a version, `go mod download` takes the one go.mod selects.
dir=$(go mod download -json sigs.k8s.io/network-policy-api | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
if [[ -z $dir ]]; then
	echo "hack/crd.sh: go mod download gave no directory for sigs.k8s.io/network-policy-api" >&2
	exit 1
fi
file=$dir/config/crd/$channel/policy.networking.k8s.io_clusternetworkpolicies.yaml
if [[ ! -f $file ]]; then
	echo "hack/crd.sh: $file does not exist" >&2
	exit 1
fi
printf '%s\n' "$file"
