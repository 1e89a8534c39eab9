#!/usr/bin/env bash
# hack/compare.sh runs nftpolicy side by side with kube-network-policies
# (the NetworkPolicy enforcer nftpolicy's design grew from) in the same
# real-API lab (tests/internal/cluster) and prints name=value figures.
# docs/comparison.md explains what is measured and what is not yet.
#
#   bash hack/compare.sh          # `make compare`: build the peer, then run the comparison
#   bash hack/compare.sh --out DIR  # the same, and keep in DIR the figures
#                                 # (compare.txt), the test log (compare.log)
#                                 # and the chart of connection rate and
#                                 # latency drawn from them (compare-conn.svg,
#                                 # `nftbench comparechart`)
#   bash hack/compare.sh build    # only build the peer; prints the binary's path
#
# The peer is built from the Go module proxy at a pinned version into a cache
# directory outside the repository, ${NFTPOLICY_COMPARE:-/var/cache/nftpolicy/compare}:
# the module source is copied to src/, and when this kernel lacks the native
# nftables queue expression the one patch hack/compare/knp-xt-nfqueue.patch
# (the queue statement as the xtables NFQUEUE target) is applied to that copy.
# The build is idempotent: the binary is rebuilt only when the version, the
# module checksum, the queue variant or the patch differ from the stamp.
# Concurrent runs are serialised with a lock file. Needs root (the lab), go,
# nft, unshare, patch, and the tools of hack/tools.sh.
#
# The figures (stdout; progress and test logs on stderr), from TestCompare*
# of tests/e2e and tests/bench, one package at a time:
#   knp_agreement, nftpolicy_agreement  fraction of the 48 upstream cases'
#        probes on real packets that matched the expected verdict (the peer,
#        then nftpolicy hybrid, one cluster each); *_disagreements, *_probes
#   knp_generated_agreement, nftpolicy_generated_agreement  the same on the
#        first generated NetworkPolicy-v1-only scenarios (generated_seeds)
#   knp_program_delay_p50_ms, nftpolicy_program_delay_p50_ms (also printed
#        as program_delay_p50_ms, the issue's name) (and _p99_ms,
#        _samples)  API write to the first probe that sees the new verdict
#   knp_conn_ratio, hybrid_vs_knp_conn_ratio, queue_vs_knp_conn_ratio,
#   queue_wide_vs_knp_conn_ratio (queue mode with --queue-source-rate out of
#        the one client's reach)
#        connection rate against no policy / nftpolicy's against the peer's,
#        medians over interleaved rounds (tests/bench RunConn); *_p50_us,
#        *_p99_us connect latency; *_failed allowed connections that failed;
#        conn_rounds; *_conn_ratio_same, _cross of the peer, hybrid_conn_ratio,
#        queue_conn_ratio, conntrack_conn_ratio;
#        per mode (control, conntrack, hybrid, queue, queue_wide, knp) and path (same,
#        cross) <mode>_rate_<path>, <mode>_p50_us_<path>, <mode>_p99_us_<path>,
#        which the chart of --out draws
#   knp_cpu_us_per_conn, queue_cpu_us_per_conn, hybrid_cpu_us_per_conn
#        agent process CPU (/proc/PID/stat) per new connection to a selected
#        pod, same node and cross node (tests/bench RunCPU);
#        queue_vs_knp_cpu_ratio; per enforcer/mode *_cpu_us_per_conn_same,
#        _cross, *_cpu_queued_per_conn, *_cpu_idle_ms_per_s, *_cpu_failed,
#        *_cpu_conns
#   <who>_restart_admitted_denied, _failed_allowed, _gap_ms (and
#        _gap_ms_median, _listen_ms, _ready_ms, _restarts)  SIGKILL of the
#        agent of the server's node under a connection loop (tests/bench
#        RunRestart), <who> one of knp, knp_failopen, queue, queue_failopen,
#        hybrid, hybrid_failopen: the peer and nftpolicy queue and hybrid
#        mode, each in its default (fail-closed) mode and with --fail-open
#   knp_new_pod_leaked_packets, new_pod_leaked_packets (and _allowed_failed,
#        _first_packet_delay_ms_p50/_p99, _pods)  new pods that connect 30 ms
#        before their API object exists, half of them denied by policy:
#        denied connections admitted plus conntrack entries of denied pods,
#        the peer and nftpolicy hybrid (tests/bench RunNewPodWindow)
#   knp_rss_mb_1k, knp_rss_mb_10k, rss_mb_1k, rss_mb_10k (and *_peak_mb_*)
#        VmRSS (VmHWM) of one node's agent, the peer and nftpolicy hybrid,
#        started with 1k and 10k pods (of fake nodes) in the API, programmed,
#        then idle 5 s (tests/bench RunRSS)
#   knp_version, kernel, loadavg_before, loadavg_after  the peer's version,
#        uname -r, and the load averages (1, 5, 15 min) when the tests began
#        and ended (the machine may be shared)
#
# On stderr, after the figures: every probe of either enforcer that did not
# get the expected verdict, with `nftpolicy explain`'s explanation of that
# flow (the compare_disagreement lines of tests/e2e), or "none".
set -euo pipefail

KNP_MODULE=sigs.k8s.io/kube-network-policies
KNP_VERSION=v0.8.0

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PATCH=$HERE/compare/knp-xt-nfqueue.patch
CACHE=${NFTPOLICY_COMPARE:-/var/cache/nftpolicy/compare}
BIN=$CACHE/bin/kube-network-policies
STAMP=$CACHE/VERSION

log() { printf '[compare.sh] %s\n' "$*" >&2; }

# native_queue succeeds when the kernel has the native nft queue expression:
# the statement pkg/queuerule.ProbeNativeQueue checks, with `nft -c` (nothing
# is committed) in a network namespace of its own (the caller's ruleset is
# never looked at). It fails with a message when nft could not tell.
native_queue() {
	local def out
	def=$'table inet knp-compare-probe {\n\tchain probe {\n\t\tqueue flags bypass to 0\n\t}\n}\n'
	if out=$(printf '%s' "$def" | unshare --net nft -c -f - 2>&1); then
		return 0
	fi
	if [[ $out == *"Could not process rule"* && ($out == *"No such file or directory"* || $out == *"Operation not supported"*) ]]; then
		return 1
	fi
	log "cannot tell whether the kernel has the nft queue expression: $out"
	exit 1
}

want_stamp() {
	local variant=$1 sum=$2 patchsum=none
	[[ $variant == xt-compat ]] && patchsum=$(sha256sum "$PATCH" | cut -d' ' -f1)
	printf '%s=%s sum=%s queue=%s patch=%s\n' "$KNP_MODULE" "$KNP_VERSION" "$sum" "$variant" "$patchsum"
}

build() {
	command -v go >/dev/null 2>&1 || { log "go is not on PATH"; exit 1; }
	mkdir -p "$CACHE/bin"
	exec 9>"$CACHE/.lock"
	if ! flock -n 9; then
		log "another hack/compare.sh is building in $CACHE; waiting for it"
		flock 9
	fi
	export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0

	local variant=native json dir sum
	native_queue || variant=xt-compat
	json=$(cd "$CACHE" && GOFLAGS= go mod download -json "$KNP_MODULE@$KNP_VERSION")
	dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")
	sum=$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")
	[[ -d $dir && -n $sum ]] || { log "go mod download $KNP_MODULE@$KNP_VERSION gave no source directory: $json"; exit 1; }

	if [[ -x $BIN && -f $STAMP && $(head -n1 "$STAMP") == "$(want_stamp "$variant" "$sum")" ]]; then
		log "kube-network-policies up to date ($(tr '\n' ' ' <"$STAMP"))"
		printf '%s\n' "$BIN"
		return 0
	fi

	local src=$CACHE/src/kube-network-policies@$KNP_VERSION start
	start=$(date +%s)
	rm -rf "$src" && mkdir -p "$(dirname "$src")"
	cp -r "$dir" "$src" && chmod -R u+w "$src"
	[[ -f $src/LICENSE ]] || { log "$dir has no LICENSE file"; exit 1; }
	if [[ $variant == xt-compat ]]; then
		log "this kernel has no native nft queue expression: applying $(basename "$PATCH")"
		(cd "$src" && patch -p1 --quiet <"$PATCH")
	else
		log "this kernel has the native nft queue expression: building $KNP_VERSION unpatched"
	fi
	log "building $KNP_MODULE/cmd $KNP_VERSION ($sum) into $BIN"
	(cd "$src" && go build -trimpath -o "$BIN.tmp" ./cmd)
	mv -f "$BIN.tmp" "$BIN"
	{
		want_stamp "$variant" "$sum"
		printf 'built=%s seconds=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(($(date +%s) - start))"
	} >"$STAMP"
	log "built in $(($(date +%s) - start))s ($(tr '\n' ' ' <"$STAMP"))"
	printf '%s\n' "$BIN"
}

main() {
	local outdir=
	case ${1:-} in
	build)
		build
		return
		;;
	--out)
		[[ -n ${2:-} ]] || { printf '[compare.sh] --out needs a directory\n' >&2; exit 2; }
		outdir=$2
		mkdir -p "$outdir"
		;;
	'') ;;
	*) printf '[compare.sh] unknown argument %q (known: build, --out DIR)\n' "$1" >&2; exit 2 ;;
	esac
	local knp
	knp=$(build)
	log "building nftpolicy and the lab's tools"
	(cd "$ROOT" && bash hack/tools.sh >/dev/null && go build -o _output/bin/nftpolicy ./cmd/nftpolicy)
	# One package at a time (-p 1): the connection rates must not share the
	# CPUs with the correctness run.
	local load_before
	load_before=$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' ,)
	log "running the comparison (TestCompare* of tests/e2e and tests/bench); load average $load_before"
	OUT=$(mktemp)
	FIG=$(mktemp)
	trap 'rm -f "$OUT" "$FIG"' EXIT
	local rc=0
	(cd "$ROOT" && NFTPOLICY_REQUIRE_TOOLS=1 NFTPOLICY_COMPARE_RUN=1 NFTPOLICY_KNP_BIN=$knp NFTPOLICY_BIN=$ROOT/_output/bin/nftpolicy \
		go test -p 1 -count=1 -timeout 60m -v -run '^TestCompare' ./tests/e2e ./tests/bench) 2>&1 | tee "$OUT" >&2 || rc=$?
	{
		printf 'knp_version=%s\nkernel=%s\nloadavg_before=%s\nloadavg_after=%s\n' "$KNP_VERSION" "$(uname -r)" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' ,)"
		sed -n 's/^compare_figure: \([a-z0-9_]*=.*\)$/\1/p' "$OUT"
	} >"$FIG"
	cat "$FIG"
	# Every probe of either enforcer that disagreed with the expected
	# verdict, with the evaluator's explanation (tests/e2e prints them).
	if grep -q '^compare_disagreement: ' "$OUT"; then
		log "disagreements:"
		sed -n 's/^compare_disagreement: //p' "$OUT" >&2
	else
		log "disagreements: none"
	fi
	if [[ -n $outdir ]]; then
		cp "$FIG" "$outdir/compare.txt"
		cp "$OUT" "$outdir/compare.log"
		(cd "$ROOT" && go run ./tests/bench/cmd/nftbench comparechart "$outdir/compare.txt") >"$outdir/compare-conn.svg" ||
			{ log "no chart: the run gave no connection figures"; rm -f "$outdir/compare-conn.svg"; }
		log "figures, log and chart in $outdir"
	fi
	return "$rc"
}

main "$@"
exit
