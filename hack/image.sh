#!/usr/bin/env bash
# hack/image.sh builds container images without Docker, as one-layer
# docker-archive tarballs (the layer, the image config and manifest.json) that
# `ctr -n k8s.io images import FILE` and `docker load -i FILE` accept.
#
# The agent image for this machine's architecture, quickly, for the lab
# (hack/conformance.sh): a static nftpolicy at /nftpolicy (the entrypoint)
# plus Debian's nft binary and the shared libraries it loads (found with
# ldd, copied from this machine's nftables package files). The Dockerfile
# and `make release` (hack/release.sh: both architectures, one OCI image
# index) take nft and its libraries from Debian's packages of the target
# architecture instead:
#   bash hack/image.sh [--tag IMAGE] [--out FILE]
#     IMAGE defaults to the image of install.yaml's DaemonSet
#     (ghcr.io/nftpolicy/nftpolicy:v0.1.0), FILE to _output/image/nftpolicy.tar.
#
# Any other root filesystem (hack/conformance.sh uses it for pause and agnhost):
#   bash hack/image.sh --rootfs DIR --tag IMAGE --out FILE --entrypoint ARG... [--cmd ARG]...
#     [--host-binary PATH]...
#   --host-binary copies this machine's PATH (e.g. /bin/bash) into DIR, with
#   the shared libraries ldd lists, in Debian's usr-merged layout (DIR is changed).
#
# Prints FILE. The tarball is reproducible (fixed times and owners).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[image.sh] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

TAG= OUT= ROOTFS= ENTRY=() CMD=() HOSTBIN=()
while (($#)); do
	case $1 in
	--tag) TAG=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--rootfs) ROOTFS=$2; shift 2 ;;
	--entrypoint) ENTRY+=("$2"); shift 2 ;;
	--cmd) CMD+=("$2"); shift 2 ;;
	--host-binary) HOSTBIN+=("$2"); shift 2 ;;
	-h | --help) sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
done

# json_str prints $1 as a JSON string.
json_str() {
	local s=$1
	s=${s//\\/\\\\}; s=${s//\"/\\\"}
	printf '"%s"' "$s"
}
json_list() {
	local first=1 a
	printf '['
	for a in "$@"; do
		((first)) || printf ','
		first=0
		json_str "$a"
	done
	printf ']'
}

# mkimage ROOTFS TAG OUT ENTRYPOINT... writes the docker-archive; the image's
# Cmd is the global CMD array.
mkimage() {
	local rootfs=$1 tag=$2 out=$3 cmd=
	shift 3
	((${#CMD[@]})) && cmd=",\"Cmd\":$(json_list "${CMD[@]}")"
	local work layer_sha config_sha config
	work=$(mktemp -d)
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
		-C "$rootfs" -cf "$work/layer.tar" .
	layer_sha=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
	mkdir "$work/$layer_sha"
	mv "$work/layer.tar" "$work/$layer_sha/layer.tar"
	config=$(printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z",'
		printf '"config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],'
		printf '"Entrypoint":%s%s,"WorkingDir":"/"},' "$(json_list "$@")" "$cmd"
		printf '"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},' "$layer_sha"
		printf '"history":[{"created":"1970-01-01T00:00:00Z","created_by":"hack/image.sh"}]}')
	printf '%s' "$config" >"$work/config.json"
	config_sha=$(sha256sum "$work/config.json" | cut -d' ' -f1)
	mv "$work/config.json" "$work/$config_sha.json"
	printf '[{"Config":"%s.json","RepoTags":[%s],"Layers":["%s/layer.tar"]}]' \
		"$config_sha" "$(json_str "$tag")" "$layer_sha" >"$work/manifest.json"
	mkdir -p "$(dirname "$out")"
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
		-C "$work" -cf "$out.tmp" manifest.json "$config_sha.json" "$layer_sha"
	mv -f "$out.tmp" "$out"
	rm -rf "$work"
	log "$tag -> $out ($(du -h "$out" | cut -f1), layer sha256:${layer_sha:0:12})"
}

# usr_merge ROOT: Debian's usr-merged layout, /lib, /lib64, /bin and /sbin
# being links into /usr.
usr_merge() {
	local d
	mkdir -p "$1"/usr/{lib,lib64,bin,sbin}
	for d in lib lib64 bin sbin; do [[ -e $1/$d ]] || ln -s "usr/$d" "$1/$d"; done
}
# copy ROOT PATH: into ROOT's usr-merged tree, the file's content (not links).
copy() {
	local root=$1 p=$2 dst
	dst=$p
	case $p in /lib/* | /lib64/* | /bin/* | /sbin/*) dst=/usr$p ;; esac
	mkdir -p "$root$(dirname "$dst")"
	cp -L "$p" "$root$dst"
}
# copy_with_libs ROOT BINARY: the binary and the shared libraries it loads.
copy_with_libs() {
	local root=$1 bin=$2 lib
	[[ -x $bin ]] || die "$bin is not an executable"
	copy "$root" "$bin"
	while read -r lib; do
		copy "$root" "$lib"
	done < <(ldd "$bin" | sed -n 's/.*=> \(\/[^ ]*\) (.*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (.*/\1/p' | sort -u)
}

if [[ -n $ROOTFS ]]; then
	[[ -d $ROOTFS && -n $TAG && -n $OUT ]] || die "--rootfs needs an existing DIR, --tag and --out"
	((${#ENTRY[@]})) || die "--rootfs needs --entrypoint"
	if ((${#HOSTBIN[@]})); then
		usr_merge "$ROOTFS"
		for b in "${HOSTBIN[@]}"; do copy_with_libs "$ROOTFS" "$b"; done
	fi
	mkimage "$ROOTFS" "$TAG" "$OUT" "${ENTRY[@]}"
	printf '%s\n' "$OUT"
	exit 0
fi

# --- the agent image --------------------------------------------------------
if [[ -z $TAG ]]; then
	TAG=$(sed -n 's/^[[:space:]]*image:[[:space:]]*\([^[:space:]]*nftpolicy[^[:space:]]*\).*/\1/p' "$ROOT/install.yaml" 2>/dev/null | head -n1)
	TAG=${TAG:-ghcr.io/nftpolicy/nftpolicy:v0.1.0}
fi
OUT=${OUT:-$ROOT/_output/image/nftpolicy.tar}
NFT=$(command -v nft || true)
[[ -x $NFT ]] || die "nft not found: apt-get install nftables"
command -v go >/dev/null || die "go is not on PATH"

rootfs=$(mktemp -d)
chmod 755 "$rootfs"
trap 'rm -rf "$rootfs"' EXIT
log "building a static nftpolicy"
(cd "$ROOT" && CGO_ENABLED=0 GOWORK=off go build -trimpath -ldflags "-s -w" -o "$rootfs/nftpolicy" ./cmd/nftpolicy)

usr_merge "$rootfs"
mkdir -p "$rootfs"/{etc,tmp,run,proc,sys,dev,var}
chmod 1777 "$rootfs/tmp"
copy_with_libs "$rootfs" "$NFT"
# nft reads these for names of protocols, services and marks; harmless when absent.
for f in /etc/protocols /etc/services /etc/iproute2/rt_marks /etc/iproute2/rt_realms; do
	[[ -f $f ]] && copy "$rootfs" "$f"
done
printf 'root:x:0:0:root:/:/nftpolicy\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\n' >"$rootfs/etc/group"
# Smoke test: the copied nft must start with only the copied libraries.
if [[ $(id -u) == 0 ]]; then
	chroot "$rootfs" /usr/sbin/nft --version >/dev/null 2>&1 || die "nft does not run inside the image's root filesystem"
fi
mkimage "$rootfs" "$TAG" "$OUT" /nftpolicy
printf '%s\n' "$OUT"
