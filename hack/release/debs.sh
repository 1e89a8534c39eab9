#!/usr/bin/env bash
# hack/release/debs.sh downloads the Debian packages of hack/release/debs.txt
# for one architecture with apt (its own lists and cache under CACHE: the
# build machine's dpkg state and architectures are not changed, and its own
# nft is never used), verified by apt against Debian's signed archive, and
# unpacks them with dpkg-deb -x into CACHE/<arch>/staging.
#
# Usage: bash hack/release/debs.sh ARCH CACHE   (ARCH: amd64 or arm64)
# Prints the staging directory; CACHE/<arch>/packages.txt lists
# "package version architecture sha256" of each package.
set -euo pipefail

arch=${1:?usage: debs.sh ARCH CACHE}
cache=${2:?usage: debs.sh ARCH CACHE}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The suite of the Dockerfile's base images (debian:bookworm-slim).
SUITE=${NFTPOLICY_DEBIAN_SUITE:-bookworm}
MIRROR=${NFTPOLICY_DEBIAN_MIRROR:-http://deb.debian.org}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
log() { printf '[debs.sh] %s\n' "$*" >&2; }

[[ -f $KEYRING ]] || { log "$KEYRING is missing: apt-get install debian-archive-keyring"; exit 1; }
command -v dpkg-deb >/dev/null || { log "dpkg-deb is missing"; exit 1; }

dir=$cache/$arch
rm -rf "$dir/staging" "$dir/debs"
mkdir -p "$dir/lists/partial" "$dir/archives/partial" "$dir/parts" "$dir/debs" "$dir/staging"
: >"$dir/status"
cat >"$dir/sources.list" <<SRC
deb [signed-by=$KEYRING] $MIRROR/debian $SUITE main
deb [signed-by=$KEYRING] $MIRROR/debian $SUITE-updates main
deb [signed-by=$KEYRING] $MIRROR/debian-security $SUITE-security main
SRC
opts=(
	-o "Dir::Etc::SourceList=$dir/sources.list" -o "Dir::Etc::SourceParts=$dir/parts"
	-o "Dir::State::Lists=$dir/lists" -o "Dir::State::status=$dir/status"
	-o "Dir::Cache=$dir" -o "Dir::Cache::Archives=$dir/archives"
	-o "APT::Architecture=$arch" -o "APT::Architectures::=$arch"
	-o Debug::NoLocking=1 -o APT::Sandbox::User=root -q
)
log "apt-get update ($SUITE, $arch)"
apt-get "${opts[@]}" update >&2
mapfile -t pkgs < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/debs.txt")
specs=()
for p in "${pkgs[@]}"; do specs+=("$p:$arch"); done
# netbase is Architecture: all; apt takes p:arch for it too.
(cd "$dir/debs" && apt-get "${opts[@]}" download "${specs[@]}" >&2)
: >"$dir/packages.txt.tmp"
for deb in "$dir"/debs/*.deb; do
	dpkg-deb -x "$deb" "$dir/staging"
	printf '%s %s %s %s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)" \
		"$(dpkg-deb -f "$deb" Architecture)" "$(sha256sum "$deb" | cut -d' ' -f1)" >>"$dir/packages.txt.tmp"
done
sort "$dir/packages.txt.tmp" >"$dir/packages.txt"
rm "$dir/packages.txt.tmp"
printf '%s\n' "$dir/staging"
