# shellcheck shell=bash
# hack/conformance/preview.sh: the "preview" suite of hack/conformance.sh
# (--suite preview), sourced by it once the cluster and the nftpolicy
# DaemonSet are up; it uses the script's kc, innode, log, die, wait_for,
# node_name and its ROOT, OUT, NODES, STATE, HERE, AGNHOST_IMAGE, KCFG.
#
# The rollout of a policy as an operator does it, on a real cluster: stage,
# watch, preview, enforce. A server pod echoes on two ports; two client pods
# on the other node each hold a connection to each port (four long-lived
# flows, a byte and its echo every half second, holdflows.py). With no
# policy all four are allowed. Then a NetworkPolicy admitting only client a
# on port 8080 is
#  1. applied staged (nftpolicy.io/staged: "true"): new connections from a
#     and b must all still succeed, and the agent logs "Staged verdict" for
#     b's (would deny) and not for a's to 8080;
#  2. previewed without the annotation (kubectl nftpolicy preview, through
#     pods/exec into each agent pod): the held flows it would cut;
#  3. enforced (the annotation removed), then kubectl nftpolicy wait: the
#     flows the holders see cut must be exactly those the preview listed (by
#     client port), and nothing may be cut before.
# Every command and its output go to walkthrough.txt.

PREVIEW_NS=preview

preview_objects() {
	local snode=$1 cnode=$2 p
	cat <<-EOF
	apiVersion: v1
	kind: Namespace
	metadata: {name: $PREVIEW_NS}
	EOF
	for p in server:$snode:server a:$cnode:client b:$cnode:client; do
		IFS=: read -r name node role <<<"$p"
		cat <<-EOF
		---
		apiVersion: v1
		kind: Pod
		metadata: {name: $name, namespace: $PREVIEW_NS, labels: {role: $role, name: $name}}
		spec:
		  nodeName: $node
		  terminationGracePeriodSeconds: 1
		  containers:
		  - {name: pause, image: $AGNHOST_IMAGE, imagePullPolicy: Never, args: [pause]}
		EOF
	done
}

# preview_policy [ANNOTATIONS]: the change; the server admits client a on
# 8080.
preview_policy() {
	cat <<-EOF
	apiVersion: networking.k8s.io/v1
	kind: NetworkPolicy
	metadata:
	  name: server-only-a-8080
	  namespace: $PREVIEW_NS
	  annotations: {${1:-}}
	spec:
	  podSelector: {matchLabels: {role: server}}
	  policyTypes: [Ingress]
	  ingress:
	  - from: [{podSelector: {matchLabels: {name: a}}}]
	    ports: [{protocol: TCP, port: 8080}]
	EOF
}

# preview_pid NODE POD: the host PID of the pod's container.
preview_pid() {
	local id
	id=$(kc -n "$PREVIEW_NS" get pod "$2" -o jsonpath='{.status.containerStatuses[0].containerID}')
	id=${id#containerd://}
	[[ -n $id ]] || return 1
	innode "$1" ctr -a /run/containerd/containerd.sock -n k8s.io tasks ls 2>/dev/null | awk -v id="$id" '$1 == id && $3 == "RUNNING" {print $2}'
}

# flows_up: every held flow has its "up" line.
flows_up() { [[ $(grep -c ' up ' "$OUT/flows.txt" 2>/dev/null) == 4 ]]; }

# cut_ports: the client ports of the flows the holders saw cut, sorted.
cut_ports() {
	awk '$3 == "up" { port[$2] = $4 } $3 == "cut" { print port[$2] }' "$OUT/flows.txt" | sort -n
}

run_preview() {
	local snode_n=1 cnode_n=$NODES snode cnode py server_ip pid_a pid_b pid_s
	snode=$(node_name "$snode_n") cnode=$(node_name "$cnode_n")
	log "preview: server on $snode, clients a and b on $cnode, each holding a connection to ports 8080 and 9090"
	PLUGIN=$STATE/kubectl-nftpolicy
	(cd "$ROOT" && go build -o "$PLUGIN" ./cmd/nftpolicy) || die "building the plugin"
	preview_objects "$snode" "$cnode" | kc apply -f - >/dev/null
	kc -n "$PREVIEW_NS" wait --for=condition=Ready pod --all --timeout=120s >/dev/null || die "the preview pods did not become ready"
	py=$(python3 -c 'import sys; print(sys.executable)')
	server_ip=$(kc -n "$PREVIEW_NS" get pod server -o jsonpath='{.status.podIP}')
	wait_for 30 "the pods' containers" preview_pid "$cnode_n" b
	pid_s=$(preview_pid "$snode_n" server) pid_a=$(preview_pid "$cnode_n" a) pid_b=$(preview_pid "$cnode_n" b)
	[[ -n $pid_s && -n $pid_a && -n $pid_b ]] || die "cannot find the preview pods' processes"
	local host=$server_ip
	[[ $host == *:* ]] && host="[$host]"
	PREVIEW_STOP=$STATE/preview.stop
	rm -f "$PREVIEW_STOP" "$OUT/flows.txt"
	nsenter -t "$pid_s" -n -- "$py" "$HERE/holdflows.py" serve 8080 9090 2>>"$OUT/holdflows.log" &
	PREVIEW_BG=($!)
	sleep 1
	nsenter -t "$pid_a" -n -- "$py" "$HERE/holdflows.py" hold --out "$OUT/flows.txt" --stop-file "$PREVIEW_STOP" \
		"a-8080=$host:8080" "a-9090=$host:9090" 2>>"$OUT/holdflows.log" &
	PREVIEW_BG+=($!)
	nsenter -t "$pid_b" -n -- "$py" "$HERE/holdflows.py" hold --out "$OUT/flows.txt" --stop-file "$PREVIEW_STOP" \
		"b-8080=$host:8080" "b-9090=$host:9090" 2>>"$OUT/holdflows.log" &
	PREVIEW_BG+=($!)
	wait_for 30 "four flows up" flows_up
	sleep 2

	: >"$OUT/walkthrough.txt"
	# 1. Stage.
	preview_policy 'nftpolicy.io/staged: "true"' >"$OUT/policy-staged.yaml"
	preview_policy >"$OUT/policy.yaml"
	walk kubectl apply -f policy-staged.yaml -- kc apply -f "$OUT/policy-staged.yaml"
	sleep 3
	walk "# new connections while the policy is staged" -- true
	local p
	for p in a b; do
		local pid=$pid_a
		[[ $p == b ]] && pid=$pid_b
		walk "$p: new connections to the server's ports 8080 and 9090" -- \
			nsenter -t "$pid" -n -- "$py" "$HERE/holdflows.py" probe "$p-8080=$host:8080" "$p-9090=$host:9090"
	done
	sleep 2
	walk 'kubectl -n kube-system logs -l app.kubernetes.io/name=nftpolicy | grep "Staged verdict"' -- staged_lines
	PREVIEW_PROBES_FAILED=$(grep -c ' fail$' "$OUT/walkthrough.txt" || true)
	PREVIEW_STAGED_LINES=$(staged_lines | grep -c 'would="deny"' || true)
	# 2. Preview.
	walk kubectl nftpolicy preview -f policy.yaml -- innode 1 "$PLUGIN" preview -f "$OUT/policy.yaml" --kubeconfig "$KCFG"
	awk '/^\$ kubectl nftpolicy preview/ { on = 1; next } /^\$ / { on = 0 } on' "$OUT/walkthrough.txt" >"$OUT/preview.txt"
	grep -q 'would cut' "$OUT/preview.txt" || log "preview: no line says would cut (see $OUT/walkthrough.txt)"
	# Seconds of traffic after the preview: it must not cut anything.
	sleep 4
	PREVIEW_CUT_BEFORE_APPLY=$(cut_ports | wc -l)
	# 3. Enforce.
	walk kubectl apply -f policy.yaml -- kc apply -f "$OUT/policy.yaml"
	walk kubectl nftpolicy wait networkpolicy/server-only-a-8080 -n $PREVIEW_NS -- \
		innode 1 "$PLUGIN" wait networkpolicy/server-only-a-8080 -n "$PREVIEW_NS" --kubeconfig "$KCFG" --timeout=60s
	# A holder sees a cut within its 3 s echo deadline.
	sleep 6
	touch "$PREVIEW_STOP"
	kill "${PREVIEW_BG[@]}" 2>/dev/null || true
	wait "${PREVIEW_BG[@]}" 2>/dev/null || true
	walk "# the held flows (holdflows.py's events)" -- cat "$OUT/flows.txt"
}

# walk TITLE... -- CMD...: run CMD, writing "$ TITLE" and its output to
# walkthrough.txt (and stderr).
walk() {
	local title=()
	while [[ $1 != -- ]]; do title+=("$1"); shift; done
	shift
	{
		echo "\$ ${title[*]}"
		"$@" 2>&1 || echo "(exit $?)"
	} | tee -a "$OUT/walkthrough.txt" >&2
}

# staged_lines: the agents' "Staged verdict" lines.
staged_lines() {
	local pod
	for pod in $(kc -n kube-system get pods -l app.kubernetes.io/name=nftpolicy -o name); do
		kc -n kube-system logs "$pod" 2>/dev/null | grep '"Staged verdict"' || true
	done
}

# The listing also holds the staged step's probe connections, closed but
# still in conntrack (TIME_WAIT): revocation deletes those entries too, as
# it must (a pair of pods could keep sending through one). So the preview
# must list exactly the held flows that are cut and the probe connections
# the policy denies (all but a's to 8080).
summarize_preview() {
	local listed cut want revoked
	listed=$(awk '$1 == "would" && $2 == "cut" { split($4, a, ":"); print a[length(a)] }' "$OUT/preview.txt" | sort -n | tr '\n' ' ')
	cut=$(cut_ports | tr '\n' ' ')
	want=$({ cut_ports; awk '$2 == "ok" && $1 ~ /^[ab]-[0-9]+$/ && $1 != "a-8080" { print $3 }' "$OUT/walkthrough.txt"; } | sort -n | tr '\n' ' ')
	# The agents' own count of what revocation deleted (their metrics, read
	# after the run).
	revoked=$(awk '/^nftpolicy_revoked_flows_total\{/ { s += $NF } END { print s + 0 }' "$OUT"/metrics-node*.txt 2>/dev/null)
	PREVIEW_OK=0
	[[ -n $cut && $listed == "$want" && $PREVIEW_CUT_BEFORE_APPLY == 0 && $PREVIEW_PROBES_FAILED == 0 &&
		$PREVIEW_STAGED_LINES -gt 0 && $revoked == "$(wc -w <<<"$listed")" ]] && PREVIEW_OK=1
	{
		echo "suite: preview (kubectl nftpolicy preview against revocation), ip family: $IP_FAMILY, nodes: $NODES"
		echo "flows held (name, client port):"
		awk '$3 == "up" { printf "  %s %s\n", $2, $4 }' "$OUT/flows.txt"
		echo "preview listed as would cut (client ports): ${listed:-none}"
		echo "held flows cut after the policy was applied (client ports): ${cut:-none}"
		echo "expected in the preview (those, and the staged step's denied probe connections): ${want:-none}"
		echo "conntrack entries revoked (nftpolicy_revoked_flows_total, all nodes): $revoked; listed as would cut: $(wc -w <<<"$listed")"
		echo "staged: new connections failed: $PREVIEW_PROBES_FAILED (must be 0); staged log lines would=deny: $PREVIEW_STAGED_LINES"
		echo "cut before the policy was enforced: $PREVIEW_CUT_BEFORE_APPLY"
		((PREVIEW_OK)) && echo "preview: PASS (the flows listed are exactly those revocation cut)" ||
			echo "preview: FAIL"
	} >"$OUT/summary.txt"
	echo "------------------------------------------------------------------"
	cat "$OUT/summary.txt"
	echo "walk-through: $OUT/walkthrough.txt  flows: $OUT/flows.txt"
	echo "------------------------------------------------------------------"
	((PREVIEW_OK)) || SUITE_RC=1
}
