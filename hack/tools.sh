#!/usr/bin/env bash
# hack/tools.sh builds the real Kubernetes binaries that the integration tests
# (tests/internal/kubeenv) run: kube-apiserver, kubectl and etcd.
#
# They are built from the Go module proxy into a cache directory outside the
# repository: ${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}/bin. The script is
# idempotent: when the binaries and the version stamp already exist it only
# prints their paths. Concurrent runs are serialised with a lock file. The
# first (cold) build takes several minutes (about 10-17 min on 2 cores).
#
# Usage: bash hack/tools.sh            # build if needed, print the tools dir
#        NFTPOLICY_TOOLS=/some/dir bash hack/tools.sh
#        bash hack/tools.sh conformance   # the default set, then what
#                                         # hack/conformance.sh needs on top
#                                         # (hack/conformance/tools.sh)
#        bash hack/tools.sh npa           # conformance, then what
#                                         # hack/conformance.sh --suite npa
#                                         # needs (hack/conformance/npa-tools.sh)
set -euo pipefail

# Optional target sets; without an argument the default set below is built.
case ${1:-} in
'') ;;
conformance)
	bash "${BASH_SOURCE[0]}" >&2
	exec bash "$(dirname "${BASH_SOURCE[0]}")/conformance/tools.sh"
	;;
npa)
	bash "${BASH_SOURCE[0]}" conformance >&2
	exec bash "$(dirname "${BASH_SOURCE[0]}")/conformance/npa-tools.sh"
	;;
*) printf '[tools.sh] unknown target %q (known: conformance, npa)\n' "$1" >&2; exit 2 ;;
esac

KUBE_VERSION=v1.37.2     # k8s.io/kubernetes
STAGING_VERSION=v0.37.2  # k8s.io/<staging module> matching KUBE_VERSION
# etcd server versions to try, first one the proxy serves wins.
ETCD_VERSIONS=(v3.6.16 v3.6.15 v3.6.14 v3.6.13 v3.6.12 v3.6.8 v3.6.5 v3.6.4 v3.6.0)

TOOLS=${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}
BIN=$TOOLS/bin
SRC=$TOOLS/src
STAMP=$TOOLS/VERSION
BINARIES=(kube-apiserver kubectl etcd)

log() { printf '[tools.sh] %s\n' "$*" >&2; }

command -v go >/dev/null 2>&1 || { log "go is not on PATH"; exit 1; }

mkdir -p "$BIN" "$SRC"

# want_stamp prints the first stamp line expected for this script's pins.
want_stamp() { printf 'kubernetes=%s staging=%s\n' "$KUBE_VERSION" "$STAGING_VERSION"; }

up_to_date() {
	[[ -f $STAMP ]] || return 1
	[[ $(head -n1 "$STAMP") == "$(want_stamp)" ]] || return 1
	grep -q '^etcd=' "$STAMP" || return 1
	local b
	for b in "${BINARIES[@]}"; do [[ -x $BIN/$b ]] || return 1; done
}

print_done() {
	local b
	for b in "${BINARIES[@]}"; do printf '%s\n' "$BIN/$b"; done
	printf '%s\n' "$TOOLS"
}

# --- etcd -----------------------------------------------------------------
build_etcd() {
	local v dir=$SRC/etcd
	# Keep an etcd from an earlier, interrupted run if it is one we pin.
	if [[ -x $BIN/etcd && -f $TOOLS/etcd.version ]]; then
		v=$(cat "$TOOLS/etcd.version")
		if [[ " ${ETCD_VERSIONS[*]} " == *" $v "* ]]; then
			log "etcd $v already built"
			ETCD_VERSION=$v
			return 0
		fi
	fi
	for v in "${ETCD_VERSIONS[@]}"; do
		rm -rf "$dir" && mkdir -p "$dir"
		cat >"$dir/go.mod" <<-GOMOD
		module nftpolicy.local/tools/etcd

		go 1.24

		require go.etcd.io/etcd/server/v3 $v
		GOMOD
		log "building etcd $v"
		if (cd "$dir" && go mod download go.etcd.io/etcd/server/v3 &&
			go build -trimpath -o "$BIN/.etcd.tmp" go.etcd.io/etcd/server/v3); then
			mv -f "$BIN/.etcd.tmp" "$BIN/etcd"
			printf '%s\n' "$v" >"$TOOLS/etcd.version"
			ETCD_VERSION=$v
			return 0
		fi
		log "etcd $v failed, trying the next version"
	done
	log "could not build any etcd version of: ${ETCD_VERSIONS[*]}"
	return 1
}

# --- kube-apiserver + kubectl ---------------------------------------------
build_kube() {
	local dir=$SRC/kubernetes gomod
	mkdir -p "$dir"
	log "downloading k8s.io/kubernetes $KUBE_VERSION metadata"
	gomod=$(cd "$dir" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
	[[ -f $gomod ]] || { log "could not find go.mod of k8s.io/kubernetes@$KUBE_VERSION"; return 1; }
	{
		printf 'module nftpolicy.local/tools/kubernetes\n\ngo 1.26\n\n'
		printf 'require k8s.io/kubernetes %s\n\nreplace (\n' "$KUBE_VERSION"
		# every staging module (k8s.io/X => ./staging/src/k8s.io/X) -> k8s.io/X vSTAGING
		sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$gomod" |
			sort -u | while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$STAGING_VERSION"; done
		printf ')\n'
	} >"$dir/go.mod.new"
	if ! cmp -s "$dir/go.mod.new" "$dir/go.mod.base" 2>/dev/null; then
		cp "$dir/go.mod.new" "$dir/go.mod"
		cp "$dir/go.mod.new" "$dir/go.mod.base"
		rm -f "$dir/go.sum"
	fi
	rm -f "$dir/go.mod.new"
	local ld="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
	ld+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
	ld+=" -X k8s.io/component-base/version.gitTreeState=clean"
	log "building kube-apiserver and kubectl $KUBE_VERSION (slow the first time)"
	rm -rf "$BIN/.kube.tmp" && mkdir -p "$BIN/.kube.tmp"
	(cd "$dir" && go build -trimpath -ldflags "$ld" -o "$BIN/.kube.tmp/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl)
	mv -f "$BIN/.kube.tmp/kube-apiserver" "$BIN/kube-apiserver"
	mv -f "$BIN/.kube.tmp/kubectl" "$BIN/kubectl"
	rmdir "$BIN/.kube.tmp"
}

main() {
	if up_to_date; then
		log "tools up to date ($(tr '\n' ' ' <"$STAMP"))"
		print_done
		exit 0
	fi

	# --- lock: only one build at a time -------------------------------------
	LOCK=$TOOLS/.lock
	if command -v flock >/dev/null 2>&1; then
		exec 9>"$LOCK"
		if ! flock -n 9; then
			log "another hack/tools.sh is building in $TOOLS; waiting for it"
			flock 9
		fi
	else
		until mkdir "$LOCK.d" 2>/dev/null; do
			pid=$(cat "$LOCK.d/pid" 2>/dev/null || true)
			if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
				log "removing stale lock of pid $pid"
				rm -rf "$LOCK.d"
				continue
			fi
			log "another hack/tools.sh (pid ${pid:-?}) is building; waiting"
			sleep 5
		done
		echo $$ >"$LOCK.d/pid"
		trap 'rm -rf "$LOCK.d"' EXIT
	fi
	# Someone else may have finished the build while we waited.
	if up_to_date; then
		log "tools up to date ($(tr '\n' ' ' <"$STAMP"))"
		print_done
		exit 0
	fi

	# --- Go settings: build outside any repository/workspace, no cgo ----------
	export GOWORK=off
	export GOFLAGS="-mod=mod -buildvcs=false"
	export CGO_ENABLED=0   # no C toolchain needed; matches Kubernetes' release builds
	export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
	start=$(date +%s)

	rm -f "$STAMP"
	ETCD_VERSION=
	build_etcd
	build_kube

	{
		want_stamp
		printf 'etcd=%s\n' "$ETCD_VERSION"
		printf 'built=%s seconds=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(($(date +%s) - start))"
	} >"$STAMP"
	log "built in $(($(date +%s) - start))s"
	print_done
}

# Everything runs from main so that bash has parsed the whole file before
# building (editing this file while it runs is then harmless).
main "$@"
exit
