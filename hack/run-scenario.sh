#!/usr/bin/env bash
# hack/run-scenario.sh runs a scenario (docs/scenario-format.md) end to end:
# it starts a real kube-apiserver and etcd (built by hack/tools.sh), the
# scenario's nodes (those it lists or its pods name, else node-1 and node-2)
# as network namespaces with the listed addresses and one real
# `nftpolicy agent` each, gives the Node objects the listed labels, creates
# the namespaces, pods (ip endpoints become external hosts attached to the
# first node) and policies through the API (the experimental
# ClusterNetworkPolicy CRD first when there are clusterNetworkPolicies),
# waits until every agent reports them programmed, makes each pod with
# dnsAnswers resolve its names through a real DNS server (in a namespace of
# its own, trusted by the agents), tries every probe as a
# real connection (a node endpoint sends from, or is served in, the node's
# namespace), prints one JSON line per probe ({"probe":i,"allowed":b}) and
# tears everything down. Needs root; nothing outside its own network
# namespaces is changed.
#
# Usage: sudo bash hack/run-scenario.sh FILE [--mode hybrid|queue] [-v]
#                                       [--timeout 1s] [--retry-timeout 2s]
# Exit status: 0 every probe decided, 2 bad scenario, 1 any other failure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() { sed -n '2,20s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

args=()
file=""
while (($#)); do
	case $1 in
	-h | --help) usage; exit 0 ;;
	--mode | --timeout | --retry-timeout | --deadline) args+=("$1=${2:?$1 needs a value}"); shift 2 ;;
	-*) args+=("$1"); shift ;;
	*)
		[[ -z $file ]] || { echo "run-scenario.sh: one scenario file only (got $file and $1)" >&2; exit 2; }
		file=$1; shift ;;
	esac
done
[[ -n $file ]] || { usage >&2; exit 2; }
[[ -r $file ]] || { echo "run-scenario.sh: cannot read $file" >&2; exit 2; }
file=$(cd "$(dirname "$file")" && pwd)/$(basename "$file")

if ((EUID != 0)); then
	echo "run-scenario.sh: needs root (network namespaces, nftables); try: sudo bash hack/run-scenario.sh $file" >&2
	exit 1
fi
for tool in go ip nft; do
	command -v "$tool" >/dev/null 2>&1 || { echo "run-scenario.sh: $tool not found; run: bash hack/deps.sh" >&2; exit 1; }
done
tools=${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}/bin
for b in etcd kube-apiserver kubectl; do
	[[ -x $tools/$b ]] || { echo "run-scenario.sh: $tools/$b not found; build the tools first: bash hack/tools.sh" >&2; exit 1; }
done

cd "$root"
mkdir -p _output/bin
if [[ -z ${NFTPOLICY_BIN:-} ]]; then
	go build -o _output/bin/nftpolicy ./cmd/nftpolicy || exit 1
	export NFTPOLICY_BIN=$root/_output/bin/nftpolicy
fi
go build -o _output/bin/nftpolicy-runscenario ./tests/e2e/cmd/runscenario || exit 1
exec _output/bin/nftpolicy-runscenario ${args[@]+"${args[@]}"} "$file"
