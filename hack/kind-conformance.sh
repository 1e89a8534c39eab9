#!/usr/bin/env bash
# hack/kind-conformance.sh runs Kubernetes' own e2e NetworkPolicy suite
# against nftpolicy on a kind cluster, for users who have Docker.
# (This machine has no Docker; hack/conformance.sh builds a real cluster in a
# network namespace instead.)
#
# Needs: docker, kind, kubectl, go. Usage:
#   hack/kind-conformance.sh [--mode hybrid|queue] [--focus REGEX] [--keep]
set -euo pipefail

MODE=hybrid
FOCUS='Netpol|NetworkPolicy'
KEEP=false
K8S_VERSION=${K8S_VERSION:-v1.37.2}
CLUSTER=${CLUSTER:-nftpolicy}
IMAGE=${IMAGE:-ghcr.io/nftpolicy/nftpolicy:dev}
OUT=${OUT:-_output/kind-conformance}

while (($#)); do
	case $1 in
	--mode) MODE=$2; shift 2 ;;
	--focus) FOCUS=$2; shift 2 ;;
	--keep) KEEP=true; shift ;;
	-h | --help) sed -n '2,9p' "$0"; exit 0 ;;
	*) echo "unknown argument: $1" >&2; exit 2 ;;
	esac
done
case $MODE in hybrid | queue) ;; *) echo "--mode must be hybrid or queue" >&2; exit 2 ;; esac
for t in docker kind kubectl go; do
	command -v "$t" >/dev/null || { echo "$t is required" >&2; exit 1; }
done

cd "$(dirname "$0")/.."
mkdir -p "$OUT"

# kind's default CNI (kindnet) does not enforce NetworkPolicy; keep it for
# pod networking and add nftpolicy as the enforcer. One control plane and two
# workers, as upstream's jobs use.
cat >"$OUT/kind.yaml" <<KIND
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
  - role: worker
KIND

cleanup() {
	if ! $KEEP; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

kind create cluster --name "$CLUSTER" --image "kindest/node:$K8S_VERSION" --config "$OUT/kind.yaml" --wait 2m
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"
sed -e "s#image: .*nftpolicy:.*#image: $IMAGE#" -e "s#--mode=hybrid#--mode=$MODE#" install.yaml | kubectl apply -f -
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
