#!/usr/bin/env bash
# hack/kind-conformance.sh runs Kubernetes' own e2e NetworkPolicy suite
# against nftpolicy on a kind cluster, for users who have Docker.
# (This machine has no Docker; hack/conformance.sh builds a real cluster in a
# network namespace instead.)
#
# Needs: docker, kind, kubectl, go. Usage:
#   hack/kind-conformance.sh [--mode hybrid|queue] [--focus REGEX] [--keep] [--kindnet]
#
# Two enforcers of NetworkPolicy on one cluster make every result
# meaningless (a connection one denies the other may deny too). kindnet, kind's
# default CNI, enforces NetworkPolicy itself in current kind releases (it
# embeds kube-network-policies; its ClusterRole lists and watches
# networkpolicies). So by default the cluster is made without it
# (networking.disableDefaultCNI) and this script gives the nodes a plain pod
# network instead: the ptp and host-local CNI plugins of the node image (the
# plugins kindnet itself configures) and a route per peer node, which
# enforce nothing. --kindnet keeps kindnet, and the script then refuses to
# run while kindnet may read NetworkPolicies (checked with kubectl auth
# can-i): disable kindnet's network policy controller first (in kindnet
# releases that embed it, the kindnetd flag --network-policies=false; check
# `kindnetd --help` of your kindnetd image) and remove networkpolicies from
# its ClusterRole.
set -euo pipefail

MODE=hybrid
FOCUS='Netpol|NetworkPolicy'
KEEP=false
KINDNET=false
K8S_VERSION=${K8S_VERSION:-v1.37.2}
CLUSTER=${CLUSTER:-nftpolicy}
IMAGE=${IMAGE:-ghcr.io/nftpolicy/nftpolicy:dev}
OUT=${OUT:-_output/kind-conformance}

while (($#)); do
	case $1 in
	--mode) MODE=$2; shift 2 ;;
	--focus) FOCUS=$2; shift 2 ;;
	--keep) KEEP=true; shift ;;
	--kindnet) KINDNET=true; shift ;;
	-h | --help) sed -n '2,24p' "$0"; exit 0 ;;
	*) echo "unknown argument: $1" >&2; exit 2 ;;
	esac
done
case $MODE in hybrid | queue) ;; *) echo "--mode must be hybrid or queue" >&2; exit 2 ;; esac
for t in docker kind kubectl go; do
	command -v "$t" >/dev/null || { echo "$t is required" >&2; exit 1; }
done

cd "$(dirname "$0")/.."
mkdir -p "$OUT"

# One control plane and two workers, as upstream's jobs use; without kindnet
# unless --kindnet (see the top of this file).
cat >"$OUT/kind.yaml" <<KIND
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  disableDefaultCNI: $($KINDNET && echo false || echo true)
nodes:
  - role: control-plane
  - role: worker
  - role: worker
KIND

# plainPodNetwork gives every node a ptp CNI configuration for its podCIDR
# and routes to the other nodes' podCIDRs: pod networking with no policy
# enforcement (what kindnet does, minus its embedded NetworkPolicy enforcer).
plainPodNetwork() {
	local nodes node cidr other
	nodes=$(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
	declare -A cidrs ips
	for node in $nodes; do
		# The controller manager assigns the podCIDRs shortly after the
		# nodes register.
		for _ in $(seq 120); do
			cidr=$(kubectl get node "$node" -o jsonpath='{.spec.podCIDR}')
			[[ -z $cidr ]] || break
			sleep 0.5
		done
		[[ -n $cidr ]] || { echo "node $node has no podCIDR" >&2; exit 1; }
		cidrs[$node]=$cidr
		ips[$node]=$(kubectl get node "$node" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
	done
	for node in $nodes; do
		docker exec -i "$node" sh -c 'mkdir -p /etc/cni/net.d && cat >/etc/cni/net.d/10-ptp.conflist' <<CNI
{"cniVersion": "0.4.0", "name": "ptp",
 "plugins": [
  {"type": "ptp", "ipMasq": true, "mtu": 1500,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "${cidrs[$node]}"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
CNI
		for other in $nodes; do
			[[ $other != "$node" ]] || continue
			docker exec "$node" ip route replace "${cidrs[$other]}" via "${ips[$other]}"
		done
	done
	kubectl wait --for=condition=Ready nodes --all --timeout=2m
}

# refuseOtherEnforcers stops the run while kindnet may read NetworkPolicies:
# it would enforce them next to nftpolicy.
refuseOtherEnforcers() {
	if kubectl -n kube-system get serviceaccount kindnet >/dev/null 2>&1 &&
		[[ $(kubectl auth can-i list networkpolicies.networking.k8s.io --all-namespaces --as=system:serviceaccount:kube-system:kindnet 2>/dev/null) == yes ]]; then
		cat >&2 <<MSG
kind-conformance.sh: kindnet can read NetworkPolicies on this cluster: it enforces them
itself (it embeds kube-network-policies), and two enforcers make the suite meaningless.
Run without --kindnet (the cluster then has a plain ptp pod network), or disable
kindnet's network policy controller (kindnetd --network-policies=false in the releases
that have it; check kindnetd --help) and remove networkpolicies from the kindnet ClusterRole.
MSG
		exit 1
	fi
}

cleanup() {
	if ! $KEEP; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

if $KINDNET; then
	kind create cluster --name "$CLUSTER" --image "kindest/node:$K8S_VERSION" --config "$OUT/kind.yaml" --wait 2m
else
	kind create cluster --name "$CLUSTER" --image "kindest/node:$K8S_VERSION" --config "$OUT/kind.yaml"
	plainPodNetwork
fi
refuseOtherEnforcers
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"
sed -e "s#image: .*nftpolicy:.*#image: $IMAGE#" -e "s#^    mode: hybrid\$#    mode: $MODE#" install.yaml | kubectl apply -f -
kubectl -n kube-system rollout status ds/nftpolicy --timeout=3m

# Upstream's e2e binary and ginkgo, at the cluster's version.
GOBIN=$PWD/$OUT/bin go install github.com/onsi/ginkgo/v2/ginkgo@latest
if [[ ! -x $OUT/bin/e2e.test ]]; then
	tmp=$(mktemp -d)
	git clone --depth 1 --branch "$K8S_VERSION" https://github.com/kubernetes/kubernetes "$tmp/kubernetes"
	(cd "$tmp/kubernetes" && go test -c -o "$PWD/../../$OUT/bin/e2e.test" ./test/e2e) || (cd "$tmp/kubernetes" && make WHAT=test/e2e/e2e.test && cp _output/bin/e2e.test "$OLDPWD/$OUT/bin/")
fi

"$OUT/bin/ginkgo" --procs=4 --focus="$FOCUS" --skip='SCTPConnectivity' \
	--junit-report="$PWD/$OUT/junit.xml" "$OUT/bin/e2e.test" -- \
	--kubeconfig="$HOME/.kube/config" --provider=skeleton --report-dir="$PWD/$OUT"
