#!/usr/bin/env bash
# hack/diff.sh runs the differential tester: generated scenarios on the real
# kernel (network namespaces, nftables, NFQUEUE) against the userspace
# evaluator. Needs root; never touches the host's own firewall or routes.
#
# Usage: hack/diff.sh --seeds A-B [--mode hybrid|queue|kernel] [--out DIR]
#                     [--queue-variant native|xt-compat] [--timeout 1.5s]
#                     [--no-minimize] [-v]
#
# One line per seed, then "scenarios=N probes=M disagreements=D". Exits
# non-zero on any disagreement; each disagreeing scenario is minimized on the
# kernel and written to DIR/npdiff-seed-N.yaml (DIR defaults to $TMPDIR or
# /tmp). Replay one with: go test ./tests/kernel -run TestScenarios after
# copying it to tests/kernel/testdata/, or nftpolicy eval --scenario FILE.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${NPDIFF_BIN:-${TMPDIR:-/tmp}/npdiff}

if [[ $# -eq 0 ]]; then
  sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
(cd "$ROOT" && go build -o "$BIN" ./tests/kernel/cmd/npdiff)
if [[ $(id -u) -ne 0 ]]; then
  echo "hack/diff.sh: needs root (network namespaces, nftables, NFQUEUE)" >&2
  exit 1
fi
exec "$BIN" "$@"
