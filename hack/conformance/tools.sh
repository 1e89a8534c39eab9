#!/usr/bin/env bash
# hack/conformance/tools.sh builds what hack/conformance.sh needs beyond the
# default set of hack/tools.sh (kube-apiserver, kubectl, etcd), into the same
# cache ${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}/bin:
#
#   kube-controller-manager kube-scheduler kubelet kube-proxy agnhost e2e.test
#       v1.37.2, in hack/tools.sh's wrapper module (src/kubernetes); e2e.test
#       is a slim build linking only test/e2e/network/netpol (_gosrc/e2enetpol)
#   ginkgo          the v2 CLI, at the version k8s.io/kubernetes requires
#   containerd containerd-shim-runc-v2 ctr   v2.4.2 from the Go module proxy
#   pause           a static pause (_gosrc/pause) for registry.k8s.io/pause
#
# and installs Debian's runc, containernetworking-plugins, iptables, conntrack
# and nftables when missing. Idempotent (stamp file VERSION.conformance) and
# serialised with hack/tools.sh's lock. Normally run as
#   bash hack/tools.sh conformance
# which first builds (or checks) the default set. Prints the tools dir.
set -euo pipefail

KUBE_VERSION=v1.37.2
CONTAINERD_VERSION=v2.4.2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

TOOLS=${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}
BIN=$TOOLS/bin
SRC=$TOOLS/src
STAMP=$TOOLS/VERSION.conformance
BINARIES=(kube-controller-manager kube-scheduler kubelet kube-proxy agnhost e2e.test ginkgo
	containerd containerd-shim-runc-v2 ctr pause)
APT_PACKAGES=(runc containernetworking-plugins iptables conntrack nftables)

log() { printf '[conformance/tools.sh] %s\n' "$*" >&2; }
# shellcheck source=toolslib.sh
source "$HERE/toolslib.sh"

command -v go >/dev/null 2>&1 || { log "go is not on PATH"; exit 1; }
[[ -x $BIN/kube-apiserver && -f $SRC/kubernetes/go.mod ]] ||
	{ log "run 'bash hack/tools.sh' first (the wrapper module and kube-apiserver are missing)"; exit 1; }

# Debian packages ----------------------------------------------------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	log "apt-get install ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq "${missing[@]}" >&2 || { apt-get update -qq >&2 && apt-get install -y -qq "${missing[@]}" >&2; }
fi

# The stamp covers the pins and our Go sources.
want_stamp() {
	printf 'kubernetes=%s containerd=%s sources=%s\n' "$KUBE_VERSION" "$CONTAINERD_VERSION" \
		"$(cat "$HERE"/_gosrc/*/*.go | sha256sum | cut -c1-16)"
}
up_to_date() {
	[[ -f $STAMP && $(head -n1 "$STAMP") == "$(want_stamp)" ]] || return 1
	local b
	for b in "${BINARIES[@]}"; do [[ -x $BIN/$b ]] || return 1; done
}
done_() { log "conformance tools up to date ($(head -n1 "$STAMP"))"; printf '%s\n' "$TOOLS"; exit 0; }
tools_begin

KLD="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
KLD+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
KLD+=" -X k8s.io/component-base/version.gitTreeState=clean"

# containerd (own module: its go.mod is not k8s.io/kubernetes') ---------------
build_containerd() {
	local dir=$SRC/containerd t0=$SECONDS
	mkdir -p "$dir"
	printf 'module nftpolicy.local/tools/containerd\n\ngo 1.24\n\nrequire github.com/containerd/containerd/v2 %s\n' \
		"$CONTAINERD_VERSION" >"$dir/go.mod.new"
	cmp -s "$dir/go.mod.new" "$dir/go.mod.base" 2>/dev/null ||
		{ cp "$dir/go.mod.new" "$dir/go.mod"; cp "$dir/go.mod.new" "$dir/go.mod.base"; rm -f "$dir/go.sum"; }
	rm -f "$dir/go.mod.new"
	log "building containerd $CONTAINERD_VERSION"
	rm -rf "$BIN/.ctd.tmp" && mkdir -p "$BIN/.ctd.tmp"
	(cd "$dir" && go build -trimpath -tags "no_btrfs no_devmapper no_zfs no_aufs" \
		-ldflags "-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
		-o "$BIN/.ctd.tmp/" github.com/containerd/containerd/v2/cmd/containerd \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr)
	mv -f "$BIN/.ctd.tmp"/* "$BIN/" && rmdir "$BIN/.ctd.tmp"
	log "containerd built in $((SECONDS - t0))s"
}

# ginkgo CLI at the library version that e2e.test links ----------------------
build_ginkgo() {
	local dir=$SRC/ginkgo v t0=$SECONDS
	v=$(cd "$SRC/kubernetes" && go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)
	mkdir -p "$dir"
	printf 'module nftpolicy.local/tools/ginkgo\n\ngo 1.24\n\nrequire github.com/onsi/ginkgo/v2 %s\n' "$v" >"$dir/go.mod.new"
	cmp -s "$dir/go.mod.new" "$dir/go.mod.base" 2>/dev/null ||
		{ cp "$dir/go.mod.new" "$dir/go.mod"; cp "$dir/go.mod.new" "$dir/go.mod.base"; rm -f "$dir/go.sum"; }
	rm -f "$dir/go.mod.new"
	log "building ginkgo $v"
	(cd "$dir" && go build -trimpath -o "$BIN/.ginkgo.tmp" github.com/onsi/ginkgo/v2/ginkgo)
	mv -f "$BIN/.ginkgo.tmp" "$BIN/ginkgo"
	log "ginkgo built in $((SECONDS - t0))s"
}

build_pause() {
	local dir=$SRC/pause
	mkdir -p "$dir"
	cp "$HERE/_gosrc/pause/main.go" "$dir/main.go"
	printf 'module nftpolicy.local/tools/pause\n\ngo 1.24\n' >"$dir/go.mod"
	(cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$BIN/.pause.tmp" .)
	mv -f "$BIN/.pause.tmp" "$BIN/pause"
}

# Kubernetes binaries, agnhost and the slim e2e.test, in the wrapper module ---
build_kube() {
	local dir=$SRC/kubernetes t0=$SECONDS
	log "building kube-controller-manager kube-scheduler kubelet kube-proxy agnhost $KUBE_VERSION (slow the first time)"
	rm -rf "$BIN/.kube2.tmp" && mkdir -p "$BIN/.kube2.tmp"
	(cd "$dir" && go build -trimpath -ldflags "$KLD" -o "$BIN/.kube2.tmp/" \
		k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/test/images/agnhost)
	mv -f "$BIN/.kube2.tmp"/* "$BIN/" && rmdir "$BIN/.kube2.tmp"
	log "kubernetes binaries built in $((SECONDS - t0))s"
	t0=$SECONDS
	log "building e2e.test (test/e2e/network/netpol only)"
	mkdir -p "$dir/e2enetpol"
	cp "$HERE/_gosrc/e2enetpol/e2e_test.go" "$dir/e2enetpol/e2e_test.go"
	(cd "$dir" && go test -c -trimpath -ldflags "$KLD" -o "$BIN/.e2e.test.tmp" ./e2enetpol)
	mv -f "$BIN/.e2e.test.tmp" "$BIN/e2e.test"
	log "e2e.test built in $((SECONDS - t0))s"
}

build_containerd
build_pause
build_ginkgo
build_kube

{
	want_stamp
	printf 'built=%s seconds=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(($(date +%s) - start))"
} >"$STAMP"
log "built in $(($(date +%s) - start))s"
printf '%s\n' "$TOOLS"
