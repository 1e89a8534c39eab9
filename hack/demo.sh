#!/usr/bin/env bash
# hack/demo.sh (`make demo`) shows nftpolicy enforcing NetworkPolicies on real
# packets, with no cluster at hand: it starts a real kube-apiserver and etcd
# (built by hack/tools.sh), two nodes made of network namespaces and one real
# `nftpolicy agent` per node, creates a 3x3 grid of pods (namespaces x, y, z;
# pods a, b, c), prints who can connect to whom before and after applying
# hack/demo/policies.yaml and then, with their CRD installed,
# hack/demo/cluster-policies.yaml, the ruleset of node-1 and why some connections are
# blocked, then removes everything. Needs root; nothing outside its own network
# namespaces is changed. Takes about 15 seconds once the tools are built.
#
# Usage: sudo bash hack/demo.sh [--mode hybrid|queue] [--no-table] [-v]
#        bash hack/demo.sh --kubeconfig FILE   # how to install on that cluster
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() { sed -n '2,14s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

kubeconfig=""
args=()
while (($#)); do
	case $1 in
	--kubeconfig) kubeconfig=${2:?--kubeconfig needs a file}; shift 2 ;;
	--kubeconfig=*) kubeconfig=${1#*=}; shift ;;
	--mode) args+=("-mode=${2:?--mode needs a value}"); shift 2 ;;
	--mode=*) args+=("-mode=${1#*=}"); shift ;;
	--no-table) args+=("-table=false"); shift ;;
	-v) args+=("-v"); shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "demo.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
	esac
done

if [[ -n $kubeconfig ]]; then
	cat <<-EOT
	You have a cluster ($kubeconfig): install nftpolicy there instead of running the local demo.

	  kubectl --kubeconfig $kubeconfig apply -f install.yaml
	  kubectl --kubeconfig $kubeconfig -n kube-system rollout status daemonset/nftpolicy

	One agent per node (DaemonSet, hybrid mode; set mode: queue in install.yaml's ConfigMap nftpolicy-config for queue mode).
	Then apply your NetworkPolicies as usual, e.g. the demo's, once namespaces x, y, z
	hold pods labelled pod=a|b|c:

	  kubectl --kubeconfig $kubeconfig apply -f hack/demo/policies.yaml

	Policies nftpolicy finds invalid are reported as Warning events:
	  kubectl --kubeconfig $kubeconfig get events -A --field-selector reason=InvalidNetworkPolicy
	EOT
	exit 0
fi

if ((EUID != 0)); then
	echo "demo.sh: the local demo needs root (network namespaces, nftables); try: sudo bash hack/demo.sh" >&2
	exit 1
fi
for tool in go ip nft; do
	command -v "$tool" >/dev/null 2>&1 || { echo "demo.sh: $tool not found; run: bash hack/deps.sh (make demo does)" >&2; exit 1; }
done
tools=${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}/bin
for b in etcd kube-apiserver kubectl; do
	[[ -x $tools/$b ]] || { echo "demo.sh: $tools/$b not found; build the tools first: bash hack/tools.sh (make demo does)" >&2; exit 1; }
done

mkdir -p _output/bin
if [[ -z ${NFTPOLICY_BIN:-} ]]; then
	go build -o _output/bin/nftpolicy ./cmd/nftpolicy
	export NFTPOLICY_BIN=$PWD/_output/bin/nftpolicy
fi
go build -o _output/bin/nftpolicy-demo ./tests/internal/cluster/cmd/demo
exec _output/bin/nftpolicy-demo -policies hack/demo/policies.yaml ${args[@]+"${args[@]}"}
