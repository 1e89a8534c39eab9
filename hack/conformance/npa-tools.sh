#!/usr/bin/env bash
# hack/conformance/npa-tools.sh builds what `hack/conformance.sh --suite npa`
# needs beyond hack/conformance/tools.sh, into the same cache
# ${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}:
#
#   bin/npa-conformance.test   SIG Network's ClusterNetworkPolicy conformance
#       suite: `go test -c sigs.k8s.io/network-policy-api/conformance` at
#       v0.3.0 (Go module proxy), built in a copy of the module (src/npa) with
#       the two small, flag-gated changes of _npa/suite.patch and the added
#       _npa/nftpolicy_flags.go (the module cache stays untouched)
#
# (The CRD comes from hack/crd.sh: the module version in go.mod.)
# Idempotent (stamp file VERSION.npa, covering the pin and _npa/*) and
# serialised with hack/tools.sh's lock. Normally run as
#   bash hack/tools.sh npa
# which first builds (or checks) the default and conformance sets. Prints the
# tools dir.
set -euo pipefail

NPA_VERSION=v0.3.0
NPA_MODULE=sigs.k8s.io/network-policy-api
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

TOOLS=${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}
BIN=$TOOLS/bin
SRC=$TOOLS/src/npa
STAMP=$TOOLS/VERSION.npa

log() { printf '[conformance/npa-tools.sh] %s\n' "$*" >&2; }
# shellcheck source=toolslib.sh
source "$HERE/toolslib.sh"

command -v go >/dev/null 2>&1 || { log "go is not on PATH"; exit 1; }
command -v patch >/dev/null 2>&1 || { log "patch is missing (apt-get install patch)"; exit 1; }
mkdir -p "$BIN" "$SRC"

want_stamp() {
	printf 'network-policy-api=%s sources=%s\n' "$NPA_VERSION" \
		"$(cat "$HERE"/_npa/* | sha256sum | cut -c1-16)"
}
up_to_date() {
	[[ -f $STAMP && $(head -n1 "$STAMP") == "$(want_stamp)" && -x $BIN/npa-conformance.test ]]
}
done_() { log "NPA conformance tools up to date ($(head -n1 "$STAMP"))"; printf '%s\n' "$TOOLS"; exit 0; }
tools_begin

# The module's own directory in the module cache (read-only), copied to the
# cache's src/npa: go refuses overlays and edits of module-cache files, and the
# module as main module brings its own go.sum for the suite's dependencies.
dir=$(go mod download -json "$NPA_MODULE@$NPA_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[[ -n $dir && -d $dir/conformance ]] || { log "go mod download $NPA_MODULE@$NPA_VERSION gave no module directory"; exit 1; }
mod=$SRC/network-policy-api
rm -rf "$mod" && cp -r "$dir" "$mod" && chmod -R u+w "$mod"
patch -s -d "$mod" -p1 --no-backup-if-mismatch <"$HERE/_npa/suite.patch" ||
	{ log "_npa/suite.patch does not apply to $NPA_MODULE@$NPA_VERSION"; exit 1; }
cp "$HERE/_npa/nftpolicy_flags.go" "$mod/conformance/utils/flags/nftpolicy_flags.go"

log "building $NPA_MODULE/conformance $NPA_VERSION (test binary)"
(cd "$mod" && go test -c -trimpath -o "$BIN/.npa-conformance.test.tmp" ./conformance)
mv -f "$BIN/.npa-conformance.test.tmp" "$BIN/npa-conformance.test"

{
	want_stamp
	printf 'built=%s seconds=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(($(date +%s) - start))"
} >"$STAMP"
log "built in $(($(date +%s) - start))s"
printf '%s\n' "$TOOLS"
