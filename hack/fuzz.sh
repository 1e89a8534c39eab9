#!/usr/bin/env bash
# hack/fuzz.sh runs every fuzz target of the repository for FUZZTIME each
# (`make fuzz`; CI: 5s), one target at a time, or only the targets named
# (bash hack/fuzz.sh FuzzCompile), and prints how many inputs each
# executed as name=value lines:
#
#   fuzz_execs_<Target>=N       every execution, the baseline's included
#   fuzz_new_execs_<Target>=N   executions after the baseline (the corpus
#                               and the seeds): inputs the fuzzer made
#
# It fails when go test fails (a crasher is kept under the package's
# testdata/fuzz/<Target>/) and when a target executed no input of its own:
# such a run checked nothing beyond plain `go test`.
#
# FUZZMINIMIZETIME bounds how long a worker minimizes an input that found
# new coverage (go's default, 60 s, outlasts a short run: the worker
# minimizes while its count stays still, and a 5 s run of a slow target
# ended with 3 inputs of its own). A crasher is minimized within the same
# bound; run the target alone with a longer one to shrink it further.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10s}
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-50x}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# Target, package.
targets=(
	"FuzzParseReply ./pkg/fqdn"
	"FuzzDNSPayload ./pkg/fqdn"
	"FuzzStream ./pkg/fqdn"
	"FuzzHandlePacket ./pkg/fqdn"
	"FuzzParsePacket ./pkg/queue"
	"FuzzParseQueueMsg ./pkg/queue"
	"FuzzCompile ./pkg/compile"
	"FuzzDecodeKey ./pkg/nftnl"
	"FuzzDecodePod ./pkg/slim"
	"FuzzWatchEvent ./pkg/slim"
	"FuzzEventReader ./pkg/slim"
	"FuzzSnapshotDecoding ./pkg/evaluate"
	"FuzzSnapshotPodEncoding ./pkg/evaluate"
	"FuzzRun ./pkg/bootcni"
)

# Go keeps every input that found new coverage in its fuzz cache and
# replays them first in each later run: on a machine kept across CI runs
# that replay grows until it fills a short FUZZTIME. CI starts from the
# repository's corpus alone.
if [[ ${CI:-} == true ]]; then
	$GO clean -fuzzcache
fi

failed=()
results=()
for t in "${targets[@]}"; do
	read -r name pkg <<<"$t"
	if (($# > 0)) && [[ " $* " != *" $name "* ]]; then
		continue
	fi
	log=$OUT/$name.log
	rc=0
	$GO test -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" "$pkg" >"$log" 2>&1 || rc=$?
	cat "$log"
	# The last "execs: N" line is the run's total; the baseline's size is
	# the Y of "gathering baseline coverage: X/Y".
	execs=$(grep -o 'execs: [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$' || true)
	base=$(grep -o 'baseline coverage: [0-9]*/[0-9]*' "$log" | tail -n 1 | sed 's|.*/||' || true)
	execs=${execs:-0}
	base=${base:-0}
	new=$((execs - base))
	((new < 0)) && new=0
	results+=("fuzz_execs_$name=$execs" "fuzz_new_execs_$name=$new")
	if ((rc != 0)); then
		failed+=("$name: go test failed ($rc)")
	elif ((new == 0)); then
		failed+=("$name: no input of its own executed in $FUZZTIME (baseline $base, execs $execs)")
	fi
done
if ((${#results[@]} == 0)); then
	echo "hack/fuzz.sh: no target named $*" >&2
	exit 2
fi
printf '%s\n' "${results[@]}"
if ((${#failed[@]} > 0)); then
	printf 'hack/fuzz.sh: %s\n' "${failed[@]}" >&2
	exit 1
fi
