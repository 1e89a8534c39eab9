#!/usr/bin/env bash
# hack/helm.sh builds the real helm binary from the Go module proxy (not a
# downloaded release binary) into a cache outside the repository and prints
# its path: ${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}/helm-<version>/helm.
# Idempotent: an existing binary of the pinned version is only printed. The
# cold build takes several minutes on 2 cores (it runs under nice).
#
# Usage: bash hack/helm.sh           # builds if needed, prints the binary's path
#        bash hack/helm.sh --built   # prints it if it is built, else exits 1
set -euo pipefail

HELM_VERSION=v4.3.2 # helm.sh/helm/v4
TOOLS=${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}
DIR=$TOOLS/helm-$HELM_VERSION
log() { printf '[helm.sh] %s\n' "$*" >&2; }

if [[ ${1:-} == --built ]]; then
	[[ -x $DIR/helm ]] || { log "helm $HELM_VERSION is not built: bash hack/helm.sh"; exit 1; }
	printf '%s\n' "$DIR/helm"
	exit 0
fi
command -v go >/dev/null 2>&1 || { log "go is not on PATH"; exit 1; }
mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9
if [[ ! -x $DIR/helm ]]; then
	log "building helm $HELM_VERSION into $DIR (several minutes cold)"
	# Outside this module: go.mod stays untouched.
	(cd "$DIR" && GOWORK=off GOFLAGS=-mod=mod GOBIN=$DIR nice -n 10 \
		go install "helm.sh/helm/v4/cmd/helm@$HELM_VERSION") >&2
fi
printf '%s\n' "$DIR/helm"
