#!/usr/bin/env bash
# hack/release-check.sh checks a release directory that hack/release.sh made
# (default: _output/release/<VERSION>), from its files alone:
#   - SHA256SUMS matches every file (sha256sum -c);
#   - `go version -m` of every binary (the agent's and, in each archive, the
#     plugin's) shows -X ...pkg/version.Version=<version>, and its GOOS/GOARCH
#     are the ones its name says;
#   - the oci-archive's image index has linux/amd64 and linux/arm64, each
#     with the entrypoint /nftpolicy, and each image's nft and dynamic loader
#     are ELF files of that architecture (`file`), its /nftpolicy the binary
#     of the release;
#   - install.yaml and cleanup.yaml pin the image by the index's digest,
#     and install.yaml has the ClusterNetworkPolicy CRD;
#   - krew's manifest has every archive's sha256; every binary has an SBOM;
#   - the chart archive renders the objects of install.yaml (with helm);
#   - as root, the image of this machine's architecture runs nft and the
#     agent in a chroot of its layer; skopeo, when installed, reads the index.
# Usage: bash hack/release-check.sh [DIR]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSION=${RELEASE_VERSION:-$(tr -d '[:space:]' <"$ROOT/VERSION")}
DIR=$(cd "${1:-$ROOT/_output/release/$VERSION}" && pwd)
fails=0
ok() { printf 'ok   %s\n' "$*"; }
bad() { printf 'FAIL %s\n' "$*"; fails=$((fails + 1)); }
check() { # check DESCRIPTION COMMAND...
	local what=$1
	shift
	if "$@" >/dev/null 2>&1; then ok "$what"; else bad "$what"; fi
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$ROOT" && GOWORK=off go build -o "$work/release" ./hack/release)

check "SHA256SUMS matches every file" bash -c "cd '$DIR' && sha256sum --quiet -c SHA256SUMS"
missing=$(cd "$DIR" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | sort | comm -23 - <(cut -c67- SHA256SUMS | sort))
[[ -z $missing ]] && ok "SHA256SUMS lists every file" || bad "SHA256SUMS lacks: $missing"

# The commit the release was built from (install.yaml's first line).
COMMIT=$(sed -n '1s/.*(commit \([0-9a-f]\{40\}\)).*/\1/p' "$DIR/install.yaml")
[[ -n $COMMIT ]] && ok "install.yaml names commit $COMMIT" || bad "install.yaml names no commit"
# binary FILE OS ARCH: the version (the main module's), the commit and the
# platform in its build information.
binary() {
	local info
	info=$(go version -m "$1")
	grep -q "^	mod	github.com/nftpolicy/nftpolicy	$VERSION	" <<<"$info" &&
		grep -q "^	build	vcs.revision=$COMMIT\$" <<<"$info" && grep -q "^	build	vcs.modified=false\$" <<<"$info" &&
		grep -q "^	build	GOOS=$2\$" <<<"$info" && grep -q "^	build	GOARCH=$3\$" <<<"$info" &&
		grep -q "^	build	-trimpath=true\$" <<<"$info" && grep -q "^	build	CGO_ENABLED=0\$" <<<"$info"
}
for f in "$DIR"/nftpolicy_*_*; do
	[[ $f == *.json ]] && continue
	n=$(basename "$f") os=${n#nftpolicy_} && arch=${os#*_} && os=${os%%_*}
	check "$n: go version -m shows $VERSION, the commit, $os/$arch, trimpath, no cgo" binary "$f" "$os" "$arch"
	check "$n: SBOM names its modules" grep -q '"pkg:golang/k8s.io/client-go@' "$DIR/$n.spdx.json"
done
for a in "$DIR"/kubectl-nftpolicy_*.tar.gz; do
	n=$(basename "$a" .tar.gz) os=${n#kubectl-nftpolicy_} && arch=${os#*_} && os=${os%%_*}
	bin=kubectl-nftpolicy
	[[ $os == windows ]] && bin+=.exe
	mkdir -p "$work/$n" && tar -xzf "$a" -C "$work/$n"
	check "$n: go version -m of $bin shows $VERSION, the commit, $os/$arch" binary "$work/$n/$bin" "$os" "$arch"
	check "$n: krew manifest has its sha256" grep -q "sha256: $(sha256sum "$a" | cut -d' ' -f1)" "$DIR/nftpolicy.yaml"
	check "$n: SBOM" test -s "$DIR/$n.spdx.json"
done

mkdir "$work/layout"
tar -xf "$DIR/nftpolicy-image.oci.tar" -C "$work/layout"
inspect=$("$work/release" inspect -layout "$work/layout") || bad "the image's layout does not read: $inspect"
printf '%s\n' "$inspect" | sed 's/^/     /'
digest=$(awk '$1 == "index" {print $2}' <<<"$inspect")
# elf PLATFORM PATH PATTERN: `file` of PATH of the platform's image.
elf() {
	"$work/release" inspect -layout "$work/layout" -platform "$1" -extract "$2" -out "$work/x" &&
		file -b "$work/x" | grep -q "$3"
}
for p in amd64:x86-64:x86_64-linux-gnu:lib64/ld-linux-x86-64.so.2 arm64:'ARM aarch64':aarch64-linux-gnu:lib/ld-linux-aarch64.so.1; do
	IFS=: read -r arch machine triplet loader <<<"$p"
	check "index has linux/$arch with entrypoint /nftpolicy" grep -q "^platform linux/$arch.* entrypoint /nftpolicy\$" <<<"$inspect"
	check "linux/$arch image: usr/sbin/nft is an ELF for $machine" elf "linux/$arch" usr/sbin/nft "ELF 64-bit LSB .*$machine"
	check "linux/$arch image: usr/$loader is an ELF for $machine" elf "linux/$arch" "usr/$loader" "ELF 64-bit LSB .*$machine"
	check "linux/$arch image: libnftables.so.1 is an ELF for $machine" elf "linux/$arch" "usr/lib/$triplet/libnftables.so.1" "$machine"
	check "linux/$arch image: /nftpolicy is nftpolicy_linux_$arch" bash -c \
		"'$work/release' inspect -layout '$work/layout' -platform linux/$arch -extract nftpolicy -out '$work/y' && cmp -s '$work/y' '$DIR/nftpolicy_linux_$arch'"
done
# The image of this machine's architecture runs: its nft starts with only
# the image's libraries, in a chroot of its unpacked layer (root only).
host=$(go env GOARCH)
if [[ $(id -u) == 0 ]]; then
	d=$(awk -v p="linux/$host" '$1 == "platform" && index($2, p) == 1 {print $6}' <<<"$inspect")
	mkdir "$work/rootfs"
	tar -xzf "$work/layout/blobs/sha256/${d#sha256:}" -C "$work/rootfs"
	check "linux/$host image: nft --version runs in a chroot of the image" chroot "$work/rootfs" /usr/sbin/nft --version
	check "linux/$host image: /nftpolicy --help runs in a chroot of the image" chroot "$work/rootfs" /nftpolicy --help
else
	printf 'skip running the linux/%s image: not root\n' "$host"
fi
# An independent reader of OCI images, when installed (apt-get install
# skopeo): it resolves each platform through the index to its layer.
if command -v skopeo >/dev/null; then
	for arch in amd64 arm64; do
		check "skopeo reads linux/$arch of the archive under index $digest" bash -c \
			"skopeo --override-os linux --override-arch $arch inspect oci-archive:'$DIR/nftpolicy-image.oci.tar' | grep -q '\"Digest\": \"$digest\"'"
	done
else
	printf 'skip skopeo: not installed\n'
fi
check "install.yaml pins ghcr.io/nftpolicy/nftpolicy:$VERSION@$digest" \
	grep -q "image: ghcr.io/nftpolicy/nftpolicy:$VERSION@$digest\$" "$DIR/install.yaml"
# The chart of the release renders the same pinned image (with helm, when
# hack/helm.sh built it).
if helm=$(bash "$ROOT/hack/helm.sh" --built 2>/dev/null); then
	chart=$(ls "$DIR"/nftpolicy-*.tgz)
	check "$(basename "$chart"): helm template pins the image by the same digest" bash -c \
		"'$helm' template nftpolicy '$chart' | grep -q 'image: ghcr.io/nftpolicy/nftpolicy:$VERSION@$digest\$'"
	check "$(basename "$chart"): helm lint --strict" "$helm" lint --strict "$chart"
	if (cd "$ROOT" && NFTPOLICY_RELEASE_DIR=$DIR NFTPOLICY_HELM=$helm go test -count=1 -run '^TestReleaseChart$' ./tests/chart) >"$work/charttest" 2>&1; then
		ok "$(basename "$chart"): helm template --include-crds renders install.yaml's objects (tests/chart)"
	else
		bad "$(basename "$chart"): helm template --include-crds differs from install.yaml: $(cat "$work/charttest")"
	fi
else
	printf 'skip the chart archive: helm is not built (bash hack/helm.sh)\n'
fi
check "cleanup.yaml pins ghcr.io/nftpolicy/nftpolicy:$VERSION@$digest" \
	grep -q "image: ghcr.io/nftpolicy/nftpolicy:$VERSION@$digest\$" "$DIR/cleanup.yaml"
check "install.yaml has the ClusterNetworkPolicy CRD" grep -q "name: clusternetworkpolicies.policy.networking.k8s.io" "$DIR/install.yaml"
printf '%s\n' "image size: $(du -k "$DIR/nftpolicy-image.oci.tar" | cut -f1) KiB (oci-archive, both platforms)"
for arch in amd64 arm64; do
	l=$(awk -v p="linux/$arch" '$1 == "platform" && index($2, p) == 1 {print $7}' <<<"$inspect")
	printf 'layer linux/%s: %s bytes compressed\n' "$arch" "$l"
done
if ((fails)); then
	printf '%d check(s) failed\n' "$fails"
	exit 1
fi
printf 'release %s checked\n' "$DIR"
