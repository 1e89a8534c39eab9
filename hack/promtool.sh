#!/usr/bin/env bash
# hack/promtool.sh builds the real promtool from the Go module proxy (not a
# downloaded release binary) into a cache outside the repository and prints
# its path: ${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}/promtool-<version>/promtool.
# Idempotent: an existing binary of the pinned version is only printed. The
# cold build takes several minutes on 2 cores (it runs under nice). promtool
# checks and unit-tests the alert rules in deploy/monitoring (make monitoring-test).
#
# Usage: bash hack/promtool.sh           # builds if needed, prints the binary's path
#        bash hack/promtool.sh --built   # prints it if it is built, else exits 1
set -euo pipefail

PROMTOOL_VERSION=v0.316.0 # github.com/prometheus/prometheus (Prometheus 3.x module tag)
TOOLS=${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}
DIR=$TOOLS/promtool-$PROMTOOL_VERSION
log() { printf '[promtool.sh] %s\n' "$*" >&2; }

if [[ ${1:-} == --built ]]; then
	[[ -x $DIR/promtool ]] || { log "promtool $PROMTOOL_VERSION is not built: bash hack/promtool.sh"; exit 1; }
	printf '%s\n' "$DIR/promtool"
	exit 0
fi
command -v go >/dev/null 2>&1 || { log "go is not on PATH"; exit 1; }
mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9
if [[ ! -x $DIR/promtool ]]; then
	log "building promtool $PROMTOOL_VERSION into $DIR (several minutes cold)"
	# Outside this module: go.mod stays untouched.
	(cd "$DIR" && GOWORK=off GOFLAGS=-mod=mod GOBIN=$DIR nice -n 10 \
		go install "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION") >&2
fi
printf '%s\n' "$DIR/promtool"
