#!/usr/bin/env bash
# hack/bench.sh measures nftpolicy on this machine and prints a markdown
# table, then machine-readable name=value lines (the headline ones last).
# docs/performance.md explains every number, the method and the targets.
#
#   bash hack/bench.sh            # `make bench`: full counts (~25 min on 2 cores, ~18 of them scale)
#   bash hack/bench.sh --quick    # `make bench-quick`: smaller counts, < 3 min
#
# Sections (each can be skipped: NFTPOLICY_BENCH_SKIP="scale delay"):
#   conn   real TCP connections between network namespaces: no agent
#          (control), hybrid mode (without and with the deny log: the
#          hybrid_conn_ratio_denylog line), hybrid without source validation (the
#          hybrid_sv_vs_nosv line), hybrid with 1% runtime verification (the
#          verify_conn_ratio_1pct line), hybrid with staged policies on
#          its pods and on other pods only (hybrid_staged_vs_hybrid,
#          hybrid_staged_other_vs_hybrid), queue mode, interleaved round by round
#          (tests/bench: the agents in process, compile + sets.Syncer +
#          queue.Runtime; the clients in a process of their own)
#   queues queue mode with 2 queues (CPU fanout) against 1, 2 client threads
#          (the queue_q2_* lines)
#   restart SIGKILL of a queue-mode agent process under load, 5 times: the
#          longest time allowed connections failed, denied ones admitted
#   sync   BenchmarkSync of pkg/sets: Build, Render and the transaction, full
#          and one-pod incremental, against knftables.Fake and the kernel
#          (BenchmarkPolicySync: one NetworkPolicy and one ClusterNetworkPolicy edit, tracker and rebuild)
#   eval   BenchmarkEvaluate* of pkg/evaluate at 10k policies
#   compile BenchmarkExceptCompile of pkg/compile: one policy with 16,000
#          scattered /32 exceptions, whole build (except_compile_ms_16000)
#          and BenchmarkCompileCommand of cmd/nftpolicy: the whole
#          `nftpolicy compile` of it (compile_cmd_ms_16000_except)
#   scale  a real kube-apiserver with 1k/10k/50k/100k/150k pods on fake nodes
#          and 1k policies, one real agent process; RSS, CPU, sync durations
#          (first sync on a node without the table, re-sync after a restart);
#          then 10k NetworkPolicies and 100 ClusterNetworkPolicies over the
#          150k pods: first sync, one policy change, one pod change, one
#          ClusterNetworkPolicy change with the deny log
#          (cnp_sync_ms_150k_denylog), one namespace label change
#          (namespace_sync_ms_150k); the evaluator's lag behind the kernel
#          (evaluator_lag_ms_p99); then the agent in queue mode: one pod
#          change (queue_incr_sync_ms_150k)
#   delay  API write -> first connection observing the new verdict, with a
#          real agent process (tests/internal/cluster)
#   faults outside changes of a real agent's table while a policy denies a
#          connection, 20 times each: `nft flush ruleset` in the node's
#          namespace and one verdict-map element deleted; from the change to
#          the first connection denied again (outside_flush_repair_ms_p99,
#          outside_element_repair_ms_p99), and the denied connections of a
#          loop (one every 2 ms) admitted meanwhile (outside_*_admitted_denied)
#          and after the repair (outside_*_admitted_after_repair, target 0);
#          then the control plane away, 50,000 pods in the API: the API
#          server stopped 5 minutes with a connection loop running
#          (apiserver_outage_admitted_denied, target 0), a policy written at
#          its return -> enforced (apiserver_outage_change_delay_ms), and one
#          forced relist (etcd compacted, 410 Gone): the agent's CPU
#          (relist_cpu_s_50k, beside relist_first_sync_cpu_s_50k)
#          then a node after a reboot, pods talking before its agent starts:
#          denied connections admitted for pods started through the boot
#          plugin (boot_window_admitted_denied, target 0) and without it
#          (boot_window_admitted_denied_unheld)
#   churn  another namespace's new policy (API write -> first connection
#          with the new verdict, as in delay) while one namespace's policy of
#          200 peers, each selecting every pod, is edited every 100 ms, at
#          5,000 pods and 1,000 policies, with a real API server and agent
#          (churn_other_policy_delay_ms_p99; churn_idle_* without the edits)
#   status NodeEnforcements (kubectl nftpolicy status/wait) against a real
#          kube-apiserver: 1,000 simulated nodes (agent pods, status.Reporters)
#          -> Gather + Evaluate of 100 policies, API writes per policy change
#          and per burst, propagation; then 2 real agents: policy create ->
#          status.Wait (wait_latency_*)
#   queueflood one pod floods the queue with connections held for pods that
#          never come, in both fail modes: the other pods' allowed connections
#          that succeed (queue_flood_other_allowed_ok) and the denied ones
#          admitted (queue_flood_admitted_denied)
#   dns    DNS learning (domainNames) in hybrid mode: hold time of a DNS
#          reply (dns_hold_us_p50/p99), queued_packets_per_dns_reply, and
#          that connections to a learned address are not queued;
#          BenchmarkLearn40kNames of pkg/fqdn (dns_learn_us_p99_40k_names)
#   staged the staged log's lag, connect(2) to its "Staged verdict" line,
#          connections paced under the kernel's per-source copy limit
#          (staged_log_lag_ms_p99)
#   revoke one connection-revocation pass over 200k conntrack entries: the
#          RSS it adds (revocation_extra_rss_mb_200k_conntrack) and its time
#   costamp issue 43's cost amplification (one NetworkPolicy of 2,300 peers,
#          each selecting every pod) at 20,000 pods: what it adds to the
#          agent's build, in process (cost_amp_build_ms_20k_pods,
#          cost_amp_rss_extra_mb_20k_pods)
#   fanout issue 48: N simulated agents (each the agent's watch-list requests:
#          every pod, namespace, NetworkPolicy and node; protobuf, HTTP/1.1)
#          against a real kube-apiserver, N = 100..1,000, and as many
#          simulated kube-proxies (EndpointSlices, Services, own Node): the
#          API server's CPU time (its process's, not wall time), bytes sent
#          and allocations per pod change and per client start; the watchall_
#          and kubeproxy_ lines, with a linear model to 5,000 clients and
#          150,000 pods (docs/scale-out.md)
#   podsource issue 48: one agent's pod store starting with --pod-source pods
#          (a watch-list of every Pod) and slices (PodAddressSlices the
#          section writes as the publisher would, the node's own Pods, the
#          publisher's Lease) at 3,000 pods of the fanout shape on a real
#          kube-apiserver: bytes received (uncompressed) and time to the
#          first sync (podsource_{pods,slices}_{start_bytes,first_sync_ms});
#          then, on two nodes, a remote pod's relabelling until enforced
#          with each source (podsource_*_remote_pod_delay_p50_ms; with
#          slices the section writes the Pod, then its slice; with
#          publisher the real `nftpolicy publish` writes the slices)
#   metricsauth 300 addresses send made-up tokens to a real agent's metrics
#          port (--metrics-auth=delegated, a real API server), then a new pod
#          scrapes with a valid token (metrics_scrape_ok_under_lockout)
#   size   the kubectl plugin's binary (plugin_size_mb) and its size over the
#          agent's (plugin_size_ratio), both built with -trimpath as
#          `make build` does
#
# Needs root (network namespaces, nftables, NFQUEUE), nft, and the control
# plane binaries of hack/tools.sh. Creates only its own network namespaces;
# never touches this namespace's firewall or routes. Results are kept in
# $NFTPOLICY_BENCH_OUT (default _output/bench): one name=value file per
# section, the raw `go test -bench` output, and report.md.
set -euo pipefail

QUICK=0
case ${1:-} in
--quick) QUICK=1 ;;
'') ;;
*) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${NFTPOLICY_BENCH_OUT:-$ROOT/_output/bench}
SKIP=" ${NFTPOLICY_BENCH_SKIP:-} "
GO=${GO:-go}
log() { printf '[bench.sh %s] %s\n' "$(date +%T)" "$*" >&2; }

if [[ $EUID -ne 0 ]]; then
	log "needs root (network namespaces, nftables, NFQUEUE)"
	exit 1
fi
command -v nft >/dev/null || { log "nft is missing: bash hack/deps.sh"; exit 1; }

began=$(date +%s)
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/*.bench "$OUT"/report.md

if ((QUICK)); then
	CONN_ARGS=(--rounds 12 --duration 100ms)
	QUEUES_ARGS=(--rounds 6 --duration 100ms)
	RESTART_ARGS=(--restarts 3)
	SYNC_BENCH='BenchmarkSync/(fake|kernel)/pods=(1000|10000)$/'
	SYNC_TIME=300ms
	POLICY_SYNC_PODS=10000
	EVAL_COUNT=3
	EVAL_TIME=300ms
	SCALE_ARGS=(--pods 2000 --incremental 5 --settle 2s --policy-scale 200:4)
	DELAY_ARGS=(--cycles 4)
	FAULTS_ARGS=(--repeats 5 --outage 30s --relist-pods 5000)
	CHURN_ARGS=(--pods 2000 --policies 400 --changes 8)
	STATUS_ARGS=(--runs 3 --wait-rounds 8)
	FANOUT_ARGS=(--agents 50,100,200 --changes 30 --start-pods 2000 --start-agents 3)
	DNS_ARGS=(--lookups 200 --conns 20)
else
	CONN_ARGS=(--rounds 40 --duration 150ms)
	QUEUES_ARGS=(--rounds 20 --duration 150ms)
	RESTART_ARGS=(--restarts 5)
	SYNC_BENCH='BenchmarkSync/'
	SYNC_TIME=1s
	POLICY_SYNC_PODS=10000,50000
	EVAL_COUNT=5
	EVAL_TIME=1s
	SCALE_ARGS=(--pods 1000,10000,50000,100000,150000 --incremental 10 --settle 10s --policy-scale 10000:100)
	DELAY_ARGS=(--cycles 8)
	FAULTS_ARGS=(--repeats 20 --outage 5m --relist-pods 50000)
	CHURN_ARGS=(--pods 5000 --policies 1000 --changes 40)
	STATUS_ARGS=(--runs 9 --wait-rounds 20)
	FANOUT_ARGS=(--agents 100,250,500,1000 --changes 100 --start-pods 10000 --start-agents 5)
	DNS_ARGS=(--lookups 2000 --conns 100)
	STAGED_ARGS=(--conns 200)
fi

# Build everything first: compiling must not overlap the measurements.
log "building the agent, nftbench and the test binaries"
BIN=${NFTPOLICY_BIN:-$ROOT/_output/bin/nftpolicy}
if [[ -z ${NFTPOLICY_BIN:-} ]]; then
	mkdir -p "$(dirname "$BIN")"
	$GO build -o "$BIN" ./cmd/nftpolicy
fi
export NFTPOLICY_BIN=$BIN
$GO build -o "$OUT/nftbench" ./tests/bench/cmd/nftbench
$GO test -c -o "$OUT/sets.test" ./pkg/sets
$GO test -c -o "$OUT/evaluate.test" ./pkg/evaluate
$GO test -c -o "$OUT/fqdn.test" ./pkg/fqdn
$GO test -c -o "$OUT/compile.test" ./pkg/compile
$GO test -c -o "$OUT/nftpolicy.test" ./cmd/nftpolicy
mkdir -p "$OUT/size"
$GO build -trimpath -o "$OUT/size/nftpolicy" ./cmd/nftpolicy
$GO build -trimpath -o "$OUT/size/kubectl-nftpolicy" ./cmd/kubectl-nftpolicy
NFTBENCH=$OUT/nftbench

# The machine, and how much of a CPU a thread gets right now (wall/CPU of a
# fixed loop; 1 = idle machine). Recorded before every section that reports
# times rather than ratios against an interleaved control.
{
	echo "machine_cpus=$(nproc)"
	echo "machine_cpu_model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo | tr -s ' ' | tr ' ' '_')"
	echo "machine_mem_gib=$(awk '/^MemTotal/ {printf "%.1f", $2/1048576}' /proc/meminfo)"
	echo "machine_kernel=$(uname -r)"
	echo "machine_nft=$(nft --version | awk '{print $2}')"
	echo "machine_go=$($GO env GOVERSION)"
	echo "machine_load_start=$(cut -d' ' -f1 /proc/loadavg)"
	echo "bench_quick=$QUICK"
} >"$OUT/machine.txt"

contention() { "$NFTBENCH" contention --name "contention_$1" --duration 500ms >>"$OUT/machine.txt"; }

section() { [[ $SKIP != *" $1 "* ]]; }

# The CPU's speed can change between runs with nothing else running in the
# guest (a VM's host), and so can the cost of waking a thread:
# cpu_speed_start and wakeup_rtt_us_start let runs be compared.
contention start

if section conn; then
	log "conn: connections between namespaces, control / hybrid / hybrid with the deny log / queue interleaved (${CONN_ARGS[*]})"
	"$NFTBENCH" conn "${CONN_ARGS[@]}" >"$OUT/conn.txt"
fi

if section queues; then
	log "queues: queue mode, 2 queues against 1, 2 client threads (${QUEUES_ARGS[*]})"
	"$NFTBENCH" conn --workers 2 --modes queue,queue_q2 "${QUEUES_ARGS[@]}" | grep '^queue_q2' >"$OUT/queues.txt"
fi

if section restart; then
	log "restart: SIGKILL of a queue-mode agent under load (${RESTART_ARGS[*]})"
	bash hack/tools.sh >/dev/null
	"$NFTBENCH" restart "${RESTART_ARGS[@]}" >"$OUT/restart.txt"
fi

if section sync; then
	contention sync
	log "sync: $SYNC_BENCH (benchtime $SYNC_TIME)"
	"$OUT/sets.test" -test.run '^$' -test.bench "$SYNC_BENCH" -test.benchtime "$SYNC_TIME" -test.timeout 30m | tee "$OUT/sync.bench" >&2
	"$NFTBENCH" gobench "$OUT/sync.bench" >"$OUT/sync.txt"
	# One NetworkPolicy edit: policy_sync_ms_<pods> through Tracker.ApplyPolicy
	# and Syncer.Sync, policy_sync_refreshed_ms_<pods> the same right after a
	# program refresh (as in the agent), policy_sync_rebuild_ms_<pods> through
	# a full rebuild; one ClusterNetworkPolicy edit: policy_sync_cluster_ms_<pods>
	# through Tracker.ApplyClusterPolicy, policy_sync_cluster_rebuild_ms_<pods>.
	"$OUT/sets.test" -test.run '^$' -test.bench 'BenchmarkPolicySync/fake/' -test.benchtime "$SYNC_TIME" -test.timeout 30m \
		-sync-bench-pods "$POLICY_SYNC_PODS" | tee "$OUT/policysync.bench" >&2
	awk '$1 ~ /^BenchmarkPolicySync\// { split($1, f, "/"); sub(/^pods=/, "", f[3]); sub(/-[0-9]+$/, "", f[4]);
		for (i = 3; i < NF; i++) if ($(i+1) == "total-ms") ms = $i
		path = f[4] == "rebuild" ? "_rebuild" : f[4] == "cluster-rebuild" ? "_cluster_rebuild" : f[4] == "cluster-tracker" ? "_cluster" : f[4] == "tracker-refreshed" ? "_refreshed" : ""
		printf "policy_sync%s_ms_%dk=%s\n", path, f[3] / 1000, ms }' \
		"$OUT/policysync.bench" >>"$OUT/sync.txt"
fi

if section eval; then
	contention eval
	log "eval: BenchmarkEvaluate at 10k policies (count $EVAL_COUNT)"
	"$OUT/evaluate.test" -test.run '^$' -test.bench 'BenchmarkEvaluate(|Hot|Worst)/policies=10000$' \
		-test.benchtime "$EVAL_TIME" -test.count "$EVAL_COUNT" -test.timeout 10m | tee "$OUT/eval.bench" >&2
	"$NFTBENCH" gobench "$OUT/eval.bench" >"$OUT/eval.txt"
fi

if section compile; then
	contention compile
	log "compile: BenchmarkExceptCompile, 16,000 exceptions"
	"$OUT/compile.test" -test.run '^$' -test.bench 'BenchmarkExceptCompile/excepts=16000$' \
		-test.benchtime 5x -test.count 3 -test.timeout 10m | tee "$OUT/compile.bench" >&2
	log "compile: BenchmarkCompileCommand, nftpolicy compile of 16,000 exceptions"
	"$OUT/nftpolicy.test" -test.run '^$' -test.bench 'BenchmarkCompileCommand/excepts=16000$' \
		-test.benchtime 5x -test.count 3 -test.timeout 10m | tee -a "$OUT/compile.bench" >&2
	"$NFTBENCH" gobench "$OUT/compile.bench" >"$OUT/compile.txt"
fi

if section scale; then
	log "scale: kube-apiserver + one agent process (${SCALE_ARGS[*]})"
	bash hack/tools.sh >/dev/null
	contention scale
	"$NFTBENCH" scale "${SCALE_ARGS[@]}" >"$OUT/scale.txt"
	# docs/scale.svg is this chart from the run the docs quote.
	"$NFTBENCH" chart "$OUT/scale.txt" >"$OUT/scale.svg" || log "scale: no chart (fewer than two sizes measured)"
fi

if section delay; then
	log "delay: API write -> first connection with the new verdict (${DELAY_ARGS[*]})"
	bash hack/tools.sh >/dev/null
	contention delay
	"$NFTBENCH" delay "${DELAY_ARGS[@]}" >"$OUT/delay.txt"
fi

if section faults; then
	log "faults: outside changes of the table repaired, the boot window, the control plane away (${FAULTS_ARGS[*]})"
	bash hack/tools.sh >/dev/null
	contention faults
	"$NFTBENCH" faults "${FAULTS_ARGS[@]}" >"$OUT/faults.txt"
fi

if section churn; then
	log "churn: another namespace's new policy while one policy is edited every 100 ms (${CHURN_ARGS[*]})"
	bash hack/tools.sh >/dev/null
	contention churn
	"$NFTBENCH" churn "${CHURN_ARGS[@]}" >"$OUT/churn.txt"
fi

if section status; then
	log "status: NodeEnforcements of 1,000 simulated nodes, then create -> wait with 2 agents (${STATUS_ARGS[*]})"
	bash hack/tools.sh >/dev/null
	contention status
	"$NFTBENCH" status "${STATUS_ARGS[@]}" >"$OUT/status.txt"
fi

if section newpod; then
	log "newpod: pods sending before the agents know them; flows a policy change denies"
	contention newpod
	"$NFTBENCH" newpod >"$OUT/newpod.txt"
fi

if section queueflood; then
	log "queueflood: one pod floods the queue; other pods' allowed connections, denied ones admitted (both fail modes)"
	contention queueflood
	"$NFTBENCH" queueflood >"$OUT/queueflood.txt"
fi

if section dns; then
	log "dns: DNS replies held while learned (${DNS_ARGS[*]})"
	contention dns
	"$NFTBENCH" dns "${DNS_ARGS[@]}" >"$OUT/dns.txt"
	# One pod holding 40k learned names: the p99 of one more reply's Learn.
	"$OUT/fqdn.test" -test.run '^$' -test.bench 'BenchmarkLearn40kNames$' -test.benchtime 20000x -test.timeout 10m | tee "$OUT/dnslearn.bench" >&2
	awk '$1 ~ /^BenchmarkLearn40kNames/ { for (i = 3; i < NF; i++) if ($(i+1) == "us-p99") v = $i } END { if (v != "") print "dns_learn_us_p99_40k_names=" v }' \
		"$OUT/dnslearn.bench" >>"$OUT/dns.txt"
fi

if section staged; then
	log "staged: staged log lag (${STAGED_ARGS[*]})"
	"$NFTBENCH" stagedlag "${STAGED_ARGS[@]}" >"$OUT/staged.txt"
fi

if section revoke; then
	log "revoke: one revocation pass over 200k conntrack entries"
	"$NFTBENCH" revoke --entries 200000 >"$OUT/revoke.txt"
fi

if section costamp; then
	log "costamp: one policy of 2,300 peers each selecting every pod, 20,000 pods"
	contention costamp
	"$NFTBENCH" costamp --pods 20000 >"$OUT/costamp.txt"
fi

if section fanout; then
	log "fanout: simulated agents and kube-proxies against a real kube-apiserver (${FANOUT_ARGS[*]})"
	bash hack/tools.sh >/dev/null
	contention fanout
	"$NFTBENCH" fanout "${FANOUT_ARGS[@]}" >"$OUT/fanout.txt"
fi

if section podsource; then
	log "podsource: one agent's start reading every Pod vs PodAddressSlices, 3,000 pods"
	bash hack/tools.sh >/dev/null
	"$NFTBENCH" podsource --pods 3000 --remote-changes 20 >"$OUT/podsource.txt"
fi

if section metricsauth; then
	log "metricsauth: 300 addresses with made-up tokens, then a valid scrape from a new pod"
	"$NFTBENCH" metricsauth --sources 300 >"$OUT/metricsauth.txt"
fi

if section size; then
	log "size: the kubectl plugin's binary beside the agent's"
	agent_bytes=$(stat -c %s "$OUT/size/nftpolicy")
	plugin_bytes=$(stat -c %s "$OUT/size/kubectl-nftpolicy")
	awk -v a="$agent_bytes" -v p="$plugin_bytes" 'BEGIN {
		printf "agent_size_mb=%.1f\nplugin_size_mb=%.1f\nplugin_size_ratio=%.3f\n", a / 1e6, p / 1e6, p / a
	}' >"$OUT/size.txt"
fi

{
	echo "machine_load_end=$(cut -d' ' -f1 /proc/loadavg)"
	echo "bench_wall_s=$(($(date +%s) - began))"
} >>"$OUT/machine.txt"

quick=()
((QUICK)) && quick=(--quick)
"$NFTBENCH" report "${quick[@]}" "$OUT"/machine.txt $(ls "$OUT"/{conn,queues,restart,sync,eval,compile,scale,delay,faults,churn,status,newpod,queueflood,dns,staged,revoke,metricsauth,costamp,size,fanout,podsource}.txt 2>/dev/null) | tee "$OUT/report.md"
log "done in $(($(date +%s) - began)) s; results in $OUT"
