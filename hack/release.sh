#!/usr/bin/env bash
# hack/release.sh (make release) builds every artifact of a release into
# _output/release/<version>/ (RELEASE_OUT overrides), reproducibly: the same
# commit, Go toolchain and Debian packages give byte-identical files
# (hack/release-verify.sh builds twice and compares). Docker is not used.
#
#   nftpolicy-image.oci.tar   the agent image: one OCI image index for
#                             linux/amd64 and linux/arm64 (oci-archive;
#                             `ctr -n k8s.io images import --all-platforms`)
#   install.yaml              the release manifest: the ClusterNetworkPolicy
#                             CRD, then install.yaml with the image pinned by
#                             the index's digest
#   cleanup.yaml              deploy/cleanup.yaml (removes every node's table
#                             after an uninstall), its image pinned likewise
#   nftpolicy_<os>_<arch>     the agent binaries in the image
#   kubectl-nftpolicy_<os>_<arch>.tar.gz  the kubectl plugin
#   nftpolicy.yaml            krew's plugin manifest for those archives
#   nftpolicy-<semver>.tgz    the Helm chart, its image pinned by digest, with
#                             the ClusterNetworkPolicy CRD in crds/
#   *.spdx.json               SPDX 2.3 SBOM of the Go modules of each binary
#   image-packages_<arch>.txt the Debian packages of each image
#   SHA256SUMS                sha256sum -c checks all of the above
#
# Everything is built from HEAD's commit (uncommitted changes are left out):
# the version is its VERSION file's (RELEASE_VERSION overrides), the commit
# HEAD, and every recorded time SOURCE_DATE_EPOCH (default: HEAD's commit
# time). Each image carries nft and its libraries from Debian's packages for
# that architecture (hack/release/debs.sh), never the build machine's.
# RELEASE_REUSE_DEBS=1 reuses the packages unpacked by an earlier run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log() { printf '[release.sh] %s\n' "$*" >&2; }

VERSION=${RELEASE_VERSION:-$(git show HEAD:VERSION | tr -d '[:space:]')}
[[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || { log "version $VERSION: want vMAJOR.MINOR.PATCH[-PRE]"; exit 1; }
COMMIT=$(git rev-parse HEAD)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct HEAD)}
OUT=${RELEASE_OUT:-$ROOT/_output/release/$VERSION}
CACHE=${RELEASE_CACHE:-$ROOT/_output/release-cache}
IMAGE_REPO=${RELEASE_IMAGE_REPO:-ghcr.io/nftpolicy/nftpolicy}
URL_BASE=https://github.com/nftpolicy/nftpolicy/releases/download/$VERSION
VERSION_PKG=github.com/nftpolicy/nftpolicy/pkg/version

# The agent image's architectures.
IMAGE_ARCHES=(amd64 arm64)
# The kubectl plugin's platforms (GOOS/GOARCH), one a line, built from
# PLUGIN_PKG (windows binaries get .exe).
PLUGIN_PKG=./cmd/kubectl-nftpolicy
PLUGIN_PLATFORMS=(
	linux/amd64
	linux/arm64
	darwin/amd64
	darwin/arm64
	windows/amd64
	windows/arm64
)

# gobuild GOOS GOARCH PKG OUT: a static, reproducible build of the clone
# (-trimpath drops the machine's paths, -buildid= the build ID), stamped
# with the version twice: pkg/version's variables (what `nftpolicy version`
# prints) and the main module's version, which Go takes from the clone's tag
# and `go version -m` shows (with -trimpath, -ldflags are not recorded).
gobuild() {
	log "go build $3 for $1/$2"
	(cd "$SRC" && CGO_ENABLED=0 GOOS=$1 GOARCH=$2 GOWORK=off nice -n 10 go build -trimpath -buildvcs=true \
		-ldflags "-s -w -buildid= -X $VERSION_PKG.Version=$VERSION -X $VERSION_PKG.Commit=$COMMIT" \
		-o "$4" "$3")
}

rm -rf "$OUT"
mkdir -p "$OUT" "$CACHE"
OUT=$(cd "$OUT" && pwd) CACHE=$(cd "$CACHE" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
TOOL=$work/release
GOWORK=off go build -o "$TOOL" ./hack/release

# The release is built from the commit, not from uncommitted changes: a
# clone of HEAD, tagged with the version unless HEAD already is (a version
# tag on another commit, or another version's tag on HEAD, is refused).
[[ -z $(git status --porcelain --untracked-files=no) ]] || log "uncommitted changes are not in the release (it builds $COMMIT)"
at=$(git rev-parse -q --verify "refs/tags/$VERSION^{commit}" || true)
[[ -z $at || $at == "$COMMIT" ]] || { log "tag $VERSION names $at, not HEAD ($COMMIT)"; exit 1; }
other=$(git tag --points-at HEAD | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+' | grep -vxF "$VERSION" || true)
[[ -z $other ]] || { log "HEAD is tagged $other, but VERSION says $VERSION"; exit 1; }
SRC=$work/src
git clone -q --shared --no-checkout "$ROOT" "$SRC"
git -C "$SRC" checkout -q --detach "$COMMIT"
[[ -n $at ]] || git -C "$SRC" tag "$VERSION" "$COMMIT"

# --- the agent image -------------------------------------------------------
platforms=()
for arch in "${IMAGE_ARCHES[@]}"; do
	staging=$CACHE/$arch/staging
	if [[ ${RELEASE_REUSE_DEBS:-} != 1 || ! -f $CACHE/$arch/packages.txt ]]; then
		staging=$(bash hack/release/debs.sh "$arch" "$CACHE")
	fi
	cp "$CACHE/$arch/packages.txt" "$OUT/image-packages_$arch.txt"
	gobuild linux "$arch" ./cmd/nftpolicy "$OUT/nftpolicy_linux_$arch"
	"$TOOL" rootfs -arch "$arch" -staging "$staging" -out "$work/rootfs-$arch" \
		-elf /usr/sbin/nft -file /etc/protocols -file /etc/services \
		-add "/nftpolicy=$OUT/nftpolicy_linux_$arch"
	platforms+=(-platform "linux/$arch=$work/rootfs-$arch")
done
digest=$("$TOOL" image -ref "$IMAGE_REPO:$VERSION" -epoch "$SOURCE_DATE_EPOCH" -entrypoint /nftpolicy \
	-annotation "org.opencontainers.image.version=$VERSION" \
	-annotation "org.opencontainers.image.revision=$COMMIT" \
	-annotation "org.opencontainers.image.source=https://github.com/nftpolicy/nftpolicy" \
	"${platforms[@]}" -layout "$work/image" -archive "$OUT/nftpolicy-image.oci.tar")
log "image $IMAGE_REPO:$VERSION@$digest"

# --- the release manifest --------------------------------------------------
crd=$(bash "$SRC/hack/crd.sh" standard)
pinned="image: $IMAGE_REPO:$VERSION@$digest"
{
	printf '# nftpolicy %s (commit %s): kubectl apply --server-side -f install.yaml\n' "$VERSION" "$COMMIT"
	printf '# The ClusterNetworkPolicy CRD (sigs.k8s.io/network-policy-api, standard channel),\n'
	printf '# then the agent with its image pinned by digest.\n---\n'
	sed '/^---$/d' "$crd"
	printf -- '---\n'
	sed "s|^\([[:space:]]*\)image: ghcr.io/nftpolicy/nftpolicy:.*|\1$pinned|" "$SRC/install.yaml"
} >"$OUT/install.yaml"
# Every container of the agent's image (the agent, the boot plugin's
# cni-install init container) gets the pinned image.
want=$(grep -c '^[[:space:]]*image: ghcr.io/nftpolicy/nftpolicy:' "$SRC/install.yaml")
n=$(grep -c "$pinned" "$OUT/install.yaml")
((want >= 1 && n == want)) || { log "install.yaml: the agent's image lines were replaced $n times, want $want (at least 1)"; exit 1; }
{
	printf '# nftpolicy %s (commit %s): after deleting install.yaml, see docs/uninstall.md\n' "$VERSION" "$COMMIT"
	sed "s|^\([[:space:]]*\)image: ghcr.io/nftpolicy/nftpolicy:.*|\1$pinned|" "$SRC/deploy/cleanup.yaml"
} >"$OUT/cleanup.yaml"
n=$(grep -c "$pinned" "$OUT/cleanup.yaml")
((n == 1)) || { log "cleanup.yaml: the cleanup image line was replaced $n times, want 1"; exit 1; }

# --- the kubectl plugin ----------------------------------------------------
archives=()
for p in "${PLUGIN_PLATFORMS[@]}"; do
	os=${p%/*} arch=${p#*/} bin=kubectl-nftpolicy
	[[ $os == windows ]] && bin+=.exe
	gobuild "$os" "$arch" "$PLUGIN_PKG" "$work/plugin-${os}_$arch/$bin"
	"$TOOL" sbom -epoch "$SOURCE_DATE_EPOCH" -name "kubectl-nftpolicy_${os}_$arch" \
		-out "$OUT/kubectl-nftpolicy_${os}_$arch.spdx.json" "$work/plugin-${os}_$arch/$bin"
	a=$OUT/kubectl-nftpolicy_${os}_$arch.tar.gz
	"$TOOL" targz -epoch "$SOURCE_DATE_EPOCH" -out "$a" "$bin=$work/plugin-${os}_$arch/$bin"
	archives+=("$a")
done
"$TOOL" krew -version "$VERSION" -url-base "$URL_BASE" -out "$OUT/nftpolicy.yaml" "${archives[@]}"

# --- the Helm chart: the release's version, the image pinned by digest ------
cp -r "$SRC/charts/nftpolicy" "$work/chart"
rm -f "$work/chart/.helmignore"
# helm installs crds/ before the templates (and never upgrades or deletes
# them): the ClusterNetworkPolicy CRD of install.yaml.
mkdir "$work/chart/crds"
cp "$crd" "$work/chart/crds/clusternetworkpolicies.yaml"
sed -i -e "s/^version: .*/version: ${VERSION#v}/" -e "s/^appVersion: .*/appVersion: $VERSION/" "$work/chart/Chart.yaml"
sed -i "s/^  digest: \"\"\$/  digest: \"$digest\"/" "$work/chart/values.yaml"
grep -q "digest: \"$digest\"" "$work/chart/values.yaml" || { log "values.yaml: no image digest set"; exit 1; }
"$TOOL" targz -epoch "$SOURCE_DATE_EPOCH" -out "$OUT/nftpolicy-${VERSION#v}.tgz" "nftpolicy=$work/chart"

# --- SBOMs of the agent binaries, checksums --------------------------------
for arch in "${IMAGE_ARCHES[@]}"; do
	"$TOOL" sbom -epoch "$SOURCE_DATE_EPOCH" -name "nftpolicy_linux_$arch" \
		-out "$OUT/nftpolicy_linux_$arch.spdx.json" "$OUT/nftpolicy_linux_$arch"
done
"$TOOL" sums -dir "$OUT"
log "$OUT: image $(du -k "$OUT/nftpolicy-image.oci.tar" | cut -f1) KiB ($digest)"
printf '%s\n' "$OUT"
