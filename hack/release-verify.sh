#!/usr/bin/env bash
# hack/release-verify.sh builds the release twice into two directories and
# compares them byte for byte (their SHA256SUMS and every file): a release
# must be reproducible. The second build reuses the Debian packages the first
# one fetched (RELEASE_REUSE_DEBS), so a mirror update between the two cannot
# make them differ. Then hack/release-check.sh checks the first.
# Usage: bash hack/release-verify.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base=$ROOT/_output/release-verify
rm -rf "$base"
RELEASE_OUT=$base/a bash "$ROOT/hack/release.sh" >/dev/null
RELEASE_OUT=$base/b RELEASE_REUSE_DEBS=1 bash "$ROOT/hack/release.sh" >/dev/null
if ! diff -r "$base/a" "$base/b"; then
	diff "$base/a/SHA256SUMS" "$base/b/SHA256SUMS" || true
	echo "release-verify: two builds of the same commit differ"
	exit 1
fi
echo "release-verify: two builds are identical ($(wc -l <"$base/a/SHA256SUMS") files)"
bash "$ROOT/hack/release-check.sh" "$base/a"
