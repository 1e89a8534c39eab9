# shellcheck shell=bash
# hack/conformance/uninstall.sh: the "uninstall" suite of hack/conformance.sh
# (--suite uninstall), sourced by it once the cluster and the nftpolicy
# DaemonSet are up; it uses the script's kc, innode, log, die, wait_for,
# node_name, preview_pid (hack/conformance/preview.sh) and its ROOT, OUT,
# NODES, STATE, HERE, AGNHOST_IMAGE.
#
# Removing nftpolicy must leave no node dropping traffic. A server pod on
# node 1 is selected by a NetworkPolicy admitting pods labelled
# role=client on port 8080. Then `kubectl delete -f install.yaml` (the
# file the script applied: ServiceAccount and RBAC first, the DaemonSet
# last), and at once a new client pod on every node: each must connect to
# the server within 30 s of the delete, and afterwards no node may hold
# the table inet nftpolicy. An agent that kept its table would leave the
# new pods' connections held for a queue nobody reads (fail-closed: they
# time out). --agent-arg=--remove-on-uninstall=false shows that.

UNINSTALL_NS=uninstall
UNINSTALL_DEADLINE=30

uninstall_objects() {
	local snode=$1 n
	cat <<-EOF
	apiVersion: v1
	kind: Namespace
	metadata: {name: $UNINSTALL_NS}
	---
	apiVersion: v1
	kind: Pod
	metadata: {name: server, namespace: $UNINSTALL_NS, labels: {role: server}}
	spec:
	  nodeName: $snode
	  terminationGracePeriodSeconds: 1
	  containers:
	  - {name: pause, image: $AGNHOST_IMAGE, imagePullPolicy: Never, args: [pause]}
	---
	apiVersion: networking.k8s.io/v1
	kind: NetworkPolicy
	metadata: {name: server-from-clients, namespace: $UNINSTALL_NS}
	spec:
	  podSelector: {matchLabels: {role: server}}
	  policyTypes: [Ingress]
	  ingress:
	  - from: [{podSelector: {matchLabels: {role: client}}}]
	    ports: [{protocol: TCP, port: 8080}]
	EOF
}

# uninstall_client N: the new client pod of node N.
uninstall_client() {
	cat <<-EOF
	apiVersion: v1
	kind: Pod
	metadata: {name: client-node$1, namespace: $UNINSTALL_NS, labels: {role: client}}
	spec:
	  nodeName: $(node_name "$1")
	  terminationGracePeriodSeconds: 1
	  containers:
	  - {name: pause, image: $AGNHOST_IMAGE, imagePullPolicy: Never, args: [pause]}
	EOF
}

# uninstall_probe N HOST: one connection from node N's client to the
# server (2 s timeout); prints "client-nodeN ok PORT" or "client-nodeN fail".
uninstall_probe() {
	local pid
	pid=$(preview_pid "$1" "client-node$1" 2>/dev/null) || true
	[[ -n $pid ]] || { echo "client-node$1 not-started"; return; }
	nsenter -t "$pid" -n -- "$UNINSTALL_PY" "$HERE/holdflows.py" probe "client-node$1=$2:8080" 2>/dev/null
}

# uninstall_delete: the removal the uninstall suite makes (the helm suite
# sets UNINSTALL_DELETE to its helm uninstall instead).
uninstall_delete() { kc delete -f "$STATE/install.yaml" --wait=false; }

run_uninstall() {
	local snode pid_s host n start now pod
	# preview_pid lives there.
	source "$HERE/preview.sh"
	PREVIEW_NS=$UNINSTALL_NS
	snode=$(node_name 1)
	UNINSTALL_PY=$(python3 -c 'import sys; print(sys.executable)')
	uninstall_objects "$snode" | kc apply -f - >/dev/null
	kc -n "$UNINSTALL_NS" wait --for=condition=Ready pod/server --timeout=120s >/dev/null || die "the server pod did not become ready"
	wait_for 30 "the server's container" preview_pid 1 server
	pid_s=$(preview_pid 1 server)
	host=$(kc -n "$UNINSTALL_NS" get pod server -o jsonpath='{.status.podIP}')
	[[ $host == *:* ]] && host="[$host]"
	nsenter -t "$pid_s" -n -- "$UNINSTALL_PY" "$HERE/holdflows.py" serve 8080 2>>"$OUT/holdflows.log" &
	UNINSTALL_BG=($!)
	# Every agent's log to the end (the pods are deleted with the DaemonSet).
	for pod in $(kc -n kube-system get pods -l app.kubernetes.io/name=nftpolicy -o name); do
		kc -n kube-system logs -f "$pod" >"$OUT/agent-${pod#pod/}.log" 2>&1 &
		UNINSTALL_BG+=($!)
	done
	for n in $(seq 1 "$NODES"); do innode "$n" nft list tables >"$OUT/tables-before-node$n.txt" 2>&1 || true; done
	sleep 2

	: >"$OUT/probes.txt"
	log "uninstall: ${UNINSTALL_WHAT:-kubectl delete -f install.yaml}, then a new client pod on each node must reach the server within ${UNINSTALL_DEADLINE}s"
	start=$SECONDS
	"${UNINSTALL_DELETE:-uninstall_delete}" >"$OUT/delete.txt" 2>&1 || true
	for n in $(seq 1 "$NODES"); do uninstall_client "$n"; echo ---; done | kc apply -f - >/dev/null
	declare -gA UNINSTALL_OK=()
	while :; do
		now=$((SECONDS - start))
		for n in $(seq 1 "$NODES"); do
			[[ -n ${UNINSTALL_OK[$n]:-} ]] && continue
			local r
			r=$(uninstall_probe "$n" "$host")
			echo "${now}s $r" >>"$OUT/probes.txt"
			[[ $r == *" ok "* ]] && UNINSTALL_OK[$n]=$now
		done
		((${#UNINSTALL_OK[@]} == NODES || now >= UNINSTALL_DEADLINE)) && break
		sleep 0.5
	done
	# The agents are gone once their pods are (grace period 10 s).
	local end=$((SECONDS + 90))
	while [[ -n $(kc -n kube-system get pods -l app.kubernetes.io/name=nftpolicy -o name 2>/dev/null) ]] && ((SECONDS < end)); do
		sleep 0.5
	done
	for n in $(seq 1 "$NODES"); do innode "$n" nft list tables >"$OUT/tables-after-node$n.txt" 2>&1 || true; done
	kill "${UNINSTALL_BG[@]}" 2>/dev/null || true
	wait "${UNINSTALL_BG[@]}" 2>/dev/null || true
}

summarize_uninstall() {
	local n ok=1 tables
	{
		echo "suite: uninstall (${UNINSTALL_WHAT:-kubectl delete -f install.yaml}), mode: $MODE, nodes: $NODES${AGENT_ARGS[*]:+, agent args: ${AGENT_ARGS[*]}}"
		for n in $(seq 1 "$NODES"); do
			tables=unknown
			[[ -e $OUT/tables-after-node$n.txt ]] &&
				tables=$(grep -c 'table inet nftpolicy' "$OUT/tables-after-node$n.txt" || true)
			if [[ -n ${UNINSTALL_OK[$n]:-} ]]; then
				echo "node$n: a new pod connected ${UNINSTALL_OK[$n]} s after the delete"
			else
				echo "node$n: a new pod did not connect within ${UNINSTALL_DEADLINE} s of the delete"
				ok=0
			fi
			if [[ $tables == unknown ]]; then
				echo "node$n: nft list tables was not read"
				ok=0
			elif [[ $tables != 0 ]]; then
				echo "node$n: table inet nftpolicy still there after the agent's exit"
				ok=0
			else
				echo "node$n: no nftpolicy table"
			fi
			# The boot plugin (install.yaml's install-cni) chained itself
			# into the node's CNI configuration: the agent takes it out
			# before it removes its table.
			if grep -qs '"nftpolicy-boot"' "$STATE/node$n/cni/"*.conflist; then
				echo "node$n: the boot plugin is still in the node's CNI configuration"
				ok=0
			elif [[ -e $STATE/node$n/cni-bin/nftpolicy-boot ]]; then
				echo "node$n: the boot plugin's executable is still in the node's CNI directory"
				ok=0
			else
				echo "node$n: no boot plugin configured or installed"
			fi
		done
		grep -h 'removed the nftables table\|Keeping the nftables table\|Cannot read the agent' "$OUT"/agent-*.log 2>/dev/null | sed 's/^/agent: /' || true
		((ok)) && echo "uninstall: PASS" || echo "uninstall: FAIL"
	} >"$OUT/summary.txt"
	echo "------------------------------------------------------------------"
	cat "$OUT/summary.txt"
	echo "probes: $OUT/probes.txt  agent logs: $OUT/agent-*.log"
	echo "------------------------------------------------------------------"
	((ok)) || SUITE_RC=1
}
