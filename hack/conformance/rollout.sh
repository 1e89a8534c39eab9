# shellcheck shell=bash
# hack/conformance/rollout.sh: the "rollout" suite of hack/conformance.sh
# (--suite rollout, make rollout), sourced by it once the cluster and the
# nftpolicy DaemonSet are up; it uses the script's kc, innode, log, die,
# wait_for, node_name and its OUT, NODES, MODE, STATE, HERE.
#
# A rolling update of the agent's DaemonSet (kubectl rollout restart: a
# template change, so the DaemonSet controller surges a new pod next to each
# old one, maxSurge 1, maxUnavailable 0) while two client pods open a new TCP
# connection to a server pod every few milliseconds: the allowed client's
# must all succeed, the denied client's must all fail. See
# hack/conformance/README.md.

ROLLOUT_NS=rollout
ROLLOUT_PORT=8080
ROLLOUT_INTERVAL=${ROLLOUT_INTERVAL:-0.007} # seconds between attempts, per client
ROLLOUT_TIMEOUT=${ROLLOUT_TIMEOUT:-0.5}     # deadline of one attempt, seconds
ROLLOUT_AFTER=${ROLLOUT_AFTER:-5}           # seconds of connections after the rollout
ROLLOUT_BEFORE=${ROLLOUT_BEFORE:-3}         # seconds of connections before it
ROLLOUT_BG=()                               # background helpers to stop at the end

# rollout_objects SERVER_NODE CLIENT_NODE: the namespace, the pods and the
# policies. Ingress at the server admits only the allowed client; egress of
# both clients is limited to the server's port, so that on two nodes both
# nodes' agents decide every attempt (egress on the clients' node, ingress on
# the server's).
rollout_objects() {
	local snode=$1 cnode=$2
	cat <<-EOF
	apiVersion: v1
	kind: Namespace
	metadata: {name: $ROLLOUT_NS}
	---
	apiVersion: v1
	kind: Pod
	metadata: {name: server, namespace: $ROLLOUT_NS, labels: {role: server}}
	spec:
	  nodeName: $snode
	  terminationGracePeriodSeconds: 1
	  containers:
	  - name: netexec
	    image: $AGNHOST_IMAGE
	    imagePullPolicy: Never
	    args: [netexec, --http-port=$ROLLOUT_PORT]
	EOF
	local c
	for c in allowed denied; do
		cat <<-EOF
		---
		apiVersion: v1
		kind: Pod
		metadata: {name: $c, namespace: $ROLLOUT_NS, labels: {role: client, client: $c}}
		spec:
		  nodeName: $cnode
		  terminationGracePeriodSeconds: 1
		  containers:
		  - {name: pause, image: $AGNHOST_IMAGE, imagePullPolicy: Never, args: [pause]}
		EOF
	done
	rollout_policy server-from-allowed Ingress '{role: server}' '{client: allowed}'
	rollout_policy clients-to-server Egress '{role: client}' '{role: server}'
}

# rollout_policy NAME Ingress|Egress SELECTED PEER: a NetworkPolicy for the
# pods matching the labels SELECTED, admitting only the pods matching PEER
# (from, or to), on the server's port.
rollout_policy() {
	local dir peer=from
	dir=$(tr '[:upper:]' '[:lower:]' <<<"$2")
	[[ $2 == Egress ]] && peer=to
	cat <<-EOF
	---
	apiVersion: networking.k8s.io/v1
	kind: NetworkPolicy
	metadata: {name: $1, namespace: $ROLLOUT_NS}
	spec:
	  podSelector: {matchLabels: $3}
	  policyTypes: [$2]
	  $dir:
	  - $peer: [{podSelector: {matchLabels: $4}}]
	    ports: [{protocol: TCP, port: $ROLLOUT_PORT}]
	EOF
}

# pod_pid NODE POD: the host PID of the pod's (only) container, through
# containerd on the pod's node.
pod_pid() {
	local n=$1 pod=$2 id
	id=$(kc -n "$ROLLOUT_NS" get pod "$pod" -o jsonpath='{.status.containerStatuses[0].containerID}')
	id=${id#containerd://}
	[[ -n $id ]] || return 1
	innode "$n" ctr -a /run/containerd/containerd.sock -n k8s.io tasks ls 2>/dev/null | awk -v id="$id" '$1 == id && $3 == "RUNNING" {print $2}'
}

# connloop PID OUTFILE [ARGS...]: hack/conformance/connloop.py in the network
# namespace of process PID (a client pod), to the server.
connloop() {
	local pid=$1 out=$2
	shift 2
	nsenter -t "$pid" -n -- "$ROLLOUT_PYTHON" "$HERE/connloop.py" --target "$ROLLOUT_SERVER:$ROLLOUT_PORT" \
		--interval "$ROLLOUT_INTERVAL" --timeout "$ROLLOUT_TIMEOUT" --out "$out" "$@"
}

# tally FILE RESULT: how many attempts of FILE had RESULT ("ok"), or, with
# !ok, any other result.
tally() {
	awk -v r="$2" '(r == "!ok" ? $2 != "ok" : $2 == r) {c++} END {print c + 0}' "$1"
}

# during FILE: the attempts of FILE that started during the update (from
# rollout restart to the end of rollout status).
during() {
	awk -v a="$ROLLOUT_T_RESTART" -v b="$ROLLOUT_T_DONE" '$1 >= a && $1 <= b' "$1" | wc -l
}

# latency FILE FROM TO: percentiles of the successful attempts of FILE that
# started between the Unix times FROM and TO.
latency() {
	awk -v a="$2" -v b="$3" '$2 == "ok" && $1 >= a && $1 <= b {print $3}' "$1" | sort -g | awk '
		{ v[++n] = $1 }
		END {
			if (!n) { print "none"; exit }
			printf "%d ok, p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", n, v[int(n * 0.5) + (n * 0.5 > int(n * 0.5))],
				v[int(n * 0.99) + (n * 0.99 > int(n * 0.99))], v[n]
		}'
}

# queue_stats TAG: each node's kernel queue table (listener, queued, dropped
# because full, dropped by the user side) to $OUT/queues-TAG.txt.
queue_stats() {
	local n
	for n in $(seq 1 "$NODES"); do
		echo "node$n (queue portid queued copy_mode copy_range queue_dropped user_dropped id_sequence 1):"
		innode "$n" cat /proc/net/netfilter/nfnetlink_queue 2>&1 | sed 's/^/  /'
	done >"$OUT/queues-$1.txt"
}

# policies_enforced: one short burst per client, the allowed one all
# through, the denied one never.
policies_enforced() {
	connloop "$ALLOWED_PID" "$STATE/probe-allowed" --duration 0.3 2>/dev/null &&
		connloop "$DENIED_PID" "$STATE/probe-denied" --duration 0.3 2>/dev/null &&
		[[ $(tally "$STATE/probe-allowed" '!ok') == 0 && $(tally "$STATE/probe-allowed" ok) -gt 0 &&
			$(tally "$STATE/probe-denied" ok) == 0 ]]
}

# watch_agents FILE: every change of an agent pod as a line "UNIXTIME NAME
# node=N phase=P ready=R deleting=D" until killed (kubectl get --watch).
watch_agents() {
	kc -n kube-system get pods -l app.kubernetes.io/name=nftpolicy --watch -o \
		jsonpath='{.metadata.name} node={.spec.nodeName} phase={.status.phase} ready={.status.conditions[?(@.type=="Ready")].status} deleting={.metadata.deletionTimestamp}{"\n"}' |
		while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"$1"
}

# follow_agent_logs: `kubectl logs -f` of every agent pod once its container
# runs, to $OUT/agent-<pod>.log, so that an old pod's log is complete even
# after the pod is deleted.
follow_agent_logs() {
	local -A seen=()
	local pod
	while :; do
		for pod in $(kc -n kube-system get pods -l app.kubernetes.io/name=nftpolicy \
			-o jsonpath='{range .items[?(@.status.containerStatuses[0].state.running)]}{.metadata.name}{"\n"}{end}' 2>/dev/null); do
			[[ -n ${seen[$pod]:-} ]] && continue
			seen[$pod]=1
			kc -n kube-system logs -f "$pod" >"$OUT/agent-$pod.log" 2>&1 &
		done
		sleep 0.5
	done
}

# kill_tree PID: PID and its descendants, by process id: each process is
# stopped before its children are listed (so that it starts no new one),
# then killed.
kill_tree() {
	local c
	kill -STOP "$1" 2>/dev/null || return 0
	for c in $(pgrep -P "$1"); do kill_tree "$c"; done
	kill -TERM "$1" 2>/dev/null || true
	kill -CONT "$1" 2>/dev/null || true
}

# suite_cleanup: hack/conformance.sh calls it on exit, before the teardown.
suite_cleanup() {
	local p
	for p in "${ROLLOUT_BG[@]}"; do kill_tree "$p"; done
	ROLLOUT_BG=()
}

# rollout_restart: the update the rollout suite makes (the helm suite sets
# ROLLOUT_UPDATE to its helm upgrade or rollback instead).
rollout_restart() {
	kc -n kube-system rollout restart ds/nftpolicy >/dev/null
	log "rollout: kubectl rollout restart daemonset/nftpolicy; waiting for kubectl rollout status"
}

# fmt_time UNIXTIME: UTC time of day with milliseconds.
fmt_time() { date -u -d "@$1" +%H:%M:%S.%3N; }

run_rollout() {
	local snode cnode snode_n cnode_n
	snode_n=1 cnode_n=$NODES
	snode=$(node_name "$snode_n") cnode=$(node_name "$cnode_n")
	log "rollout: server on $snode, clients on $cnode; policies: ingress from the allowed client, egress of both clients to the server"
	rollout_objects "$snode" "$cnode" | kc apply -f - >/dev/null
	kc -n "$ROLLOUT_NS" wait --for=condition=Ready pod --all --timeout=120s >/dev/null ||
		die "the rollout pods did not become ready"
	# The interpreter itself, not a wrapper (a pyenv shim takes seconds to
	# start on a loaded machine).
	ROLLOUT_PYTHON=$(python3 -c 'import sys; print(sys.executable)')
	ROLLOUT_SERVER=$(kc -n "$ROLLOUT_NS" get pod server -o jsonpath='{.status.podIP}')
	wait_for 30 "the allowed client's container" pod_pid "$cnode_n" allowed
	ALLOWED_PID=$(pod_pid "$cnode_n" allowed) DENIED_PID=$(pod_pid "$cnode_n" denied)
	[[ -n $ALLOWED_PID && -n $DENIED_PID ]] || die "cannot find the client pods' processes"
	wait_for 60 "the policies to be enforced (allowed client admitted, denied client not)" policies_enforced

	# Evidence collectors: the agents' pods over time and their complete logs.
	watch_agents "$OUT/agent-pods.txt" &
	ROLLOUT_BG+=($!)
	follow_agent_logs &
	ROLLOUT_BG+=($!)

	log "rollout: connections every ${ROLLOUT_INTERVAL}s from each client (deadline ${ROLLOUT_TIMEOUT}s), ${ROLLOUT_BEFORE}s before the update"
	local stopfile=$STATE/connloop.stop
	rm -f "$stopfile" "$STATE"/connloop-*.ready
	connloop "$ALLOWED_PID" "$OUT/connections-allowed.txt" --stop-file "$stopfile" \
		--ready-file "$STATE/connloop-allowed.ready" 2>>"$OUT/connloop.log" &
	local la=$!
	connloop "$DENIED_PID" "$OUT/connections-denied.txt" --stop-file "$stopfile" \
		--ready-file "$STATE/connloop-denied.ready" 2>>"$OUT/connloop.log" &
	local ld=$!
	ROLLOUT_BG+=("$la" "$ld") # killed only if the script dies before they stop
	wait_for 60 "the connection loops to start" test -e "$STATE/connloop-allowed.ready" -a -e "$STATE/connloop-denied.ready"
	sleep "$ROLLOUT_BEFORE"
	queue_stats before
	local t_restart t_done
	t_restart=$(date +%s.%N)
	"${ROLLOUT_UPDATE:-rollout_restart}"
	local status_rc=0
	kc -n kube-system rollout status ds/nftpolicy --timeout=300s >"$OUT/rollout-status.txt" 2>&1 || status_rc=$?
	t_done=$(date +%s.%N)
	log "rollout: rollout status returned $status_rc after $(awk -v a="$t_restart" -v b="$t_done" 'BEGIN {printf "%.1f", b - a}')s; ${ROLLOUT_AFTER}s more of connections"
	sleep "$ROLLOUT_AFTER"
	touch "$stopfile"
	wait "$la" "$ld" || true
	ROLLOUT_BG=("${ROLLOUT_BG[@]:0:2}")
	sleep 1 # the last log lines
	suite_cleanup
	queue_stats after

	ROLLOUT_T_RESTART=$t_restart ROLLOUT_T_DONE=$t_done ROLLOUT_STATUS_RC=$status_rc
	log "rollout: connection loops stopped; $(head -c 300 "$OUT/connloop.log" | tr '\n' ' ')"
	local a_fail d_ok a_during d_during
	a_fail=$(tally "$OUT/connections-allowed.txt" '!ok')
	d_ok=$(tally "$OUT/connections-denied.txt" ok)
	a_during=$(during "$OUT/connections-allowed.txt")
	d_during=$(during "$OUT/connections-denied.txt")
	SUITE_RC=0
	((status_rc == 0 && a_fail == 0 && d_ok == 0)) || SUITE_RC=1
	# A loop that did not run proves nothing: at least one attempt every
	# 100 ms of the update, from each client.
	ROLLOUT_MIN=$(awk -v a="$t_restart" -v b="$t_done" 'BEGIN {printf "%d", (b - a) * 10}')
	if ((a_during < ROLLOUT_MIN || d_during < ROLLOUT_MIN)); then
		log "rollout: too few attempts during the update ($a_during allowed, $d_during denied; at least $ROLLOUT_MIN each)"
		SUITE_RC=1
	fi
}

# summarize_rollout: summary.txt: counts, the failed allowed and admitted
# denied attempts with their times, the agents' timeline and hand-overs.
summarize_rollout() {
	local fa=$OUT/connections-allowed.txt fd=$OUT/connections-denied.txt
	{
		echo "suite: rolling update of the nftpolicy DaemonSet under connections (${ROLLOUT_WHAT:-kubectl rollout restart}), mode: $MODE, nodes: $NODES"
		echo "connections: a new TCP connection every ${ROLLOUT_INTERVAL}s from each client, deadline ${ROLLOUT_TIMEOUT}s;" \
			"${ROLLOUT_BEFORE}s before the update, ${ROLLOUT_AFTER}s after kubectl rollout status returned"
		echo "${ROLLOUT_WHAT:-rollout restart} at $(fmt_time "$ROLLOUT_T_RESTART"), rollout status returned (exit $ROLLOUT_STATUS_RC) at $(fmt_time "$ROLLOUT_T_DONE")" \
			"($(awk -v a="$ROLLOUT_T_RESTART" -v b="$ROLLOUT_T_DONE" 'BEGIN {printf "%.1f", b - a}')s)"
		echo "allowed client: $(wc -l <"$fa") attempts, $(tally "$fa" ok) ok, $(tally "$fa" '!ok') failed" \
			"($(awk '$2 != "ok" {print $2}' "$fa" | sort | uniq -c | awk '{printf "%s%s=%s", s, $2, $1; s=" "}'))"
		echo "denied client:  $(wc -l <"$fd") attempts, $(tally "$fd" ok) admitted" \
			"($(awk '{print $2}' "$fd" | sort | uniq -c | awk '{printf "%s%s=%s", s, $2, $1; s=" "}'))"
		echo "during the update: $(during "$fa") allowed and $(during "$fd") denied attempts (at least $ROLLOUT_MIN each required)"
		echo "allowed connect times before the update: $(latency "$fa" 0 "$ROLLOUT_T_RESTART")"
		echo "                       during the update: $(latency "$fa" "$ROLLOUT_T_RESTART" "$ROLLOUT_T_DONE")"
		echo "                        after the update: $(latency "$fa" "$ROLLOUT_T_DONE" 9999999999)"
		if (($(tally "$fa" '!ok') > 0)); then
			echo "failed allowed attempts (start time UTC, result, ms):"
			awk '$2 != "ok"' "$fa" | while read -r t r ms; do echo "  $(fmt_time "$t") $r $ms"; done | head -n 200
		fi
		if (($(tally "$fd" ok) > 0)); then
			echo "admitted denied attempts (start time UTC, ms):"
			awk '$2 == "ok"' "$fd" | while read -r t r ms; do echo "  $(fmt_time "$t") $ms"; done | head -n 200
		fi
		echo "agent pods (first seen, ready, deletion started, last seen; UTC; what each old agent handed over):"
		awk '{
			delete f
			for (i = 3; i <= NF; i++) { k = $i; sub(/=.*/, "", k); v = $i; sub(/^[^=]*=/, "", v); f[k] = v }
			if (!($2 in first)) { first[$2] = $1; node[$2] = "-"; order[++n] = $2 }
			last[$2] = $1
			if (f["node"] != "") node[$2] = f["node"]
			if (f["ready"] == "True" && !($2 in ready)) ready[$2] = $1
			if (f["deleting"] != "" && !($2 in del)) del[$2] = $1
		}
		END { for (i = 1; i <= n; i++) { p = order[i]; print p, node[p], first[p], (p in ready ? ready[p] : "-"), (p in del ? del[p] : "-"), last[p] } }' \
			"$OUT/agent-pods.txt" | while read -r p nd f r d l; do
			# What an old agent handed over to its successor, by chain.
			h=
			[[ $d == - ]] || h="  handed over: $(grep -o 'Handed the queues over to the successor.*chain="[a-z-]*"' "$OUT/agent-$p.log" 2>/dev/null |
				sed 's/.*chain="//; s/"$//' | paste -sd, -)"
			[[ $h == "  handed over: " ]] && h="  handed over: nothing"
			printf '  %-18s %-6s %s  ready %s  deleting %s  last %s%s\n' "$p" "$nd" "$(fmt_time "$f")" \
				"$([[ $r == - ]] && echo - || fmt_time "$r")" "$([[ $d == - ]] && echo - || fmt_time "$d")" "$(fmt_time "$l")" "$h"
		done
		echo "agent events (from the agents' logs):"
		local f
		for f in "$OUT"/agent-nftpolicy-*.log; do
			grep -hE 'Handed the queues|alternate range|Listening on NFQUEUE|Address in use|Shutting down|Agent failed|Cannot point' "$f" |
				sed "s|^|  $(basename "$f" .log): |" | cut -c1-400 || true
		done
		echo "kernel queues after the update (queue_dropped and user_dropped must be 0):"
		sed 's/^/  /' "$OUT/queues-after.txt"
		echo "rollout: $( ((SUITE_RC == 0)) && echo PASS || echo FAIL)"
	} >"$OUT/summary.txt"
	echo "------------------------------------------------------------------"
	cat "$OUT/summary.txt"
	echo "attempts: $fa $fd  agent logs: $OUT/agent-nftpolicy-*.log ($((SECONDS - T0))s in all)"
	echo "------------------------------------------------------------------"
}
