# shellcheck shell=bash
# hack/conformance/helm.sh: the "helm" suite of hack/conformance.sh (--suite
# helm), sourced by it; it uses the script's kc, innode, log, die, wait_for,
# node_name and its ROOT, OUT, NODES, STATE, HERE, MODE, KCFG, RELEASE_DIR,
# NEXT_RELEASE_DIR, and the rollout and uninstall suites' functions.
#
# The chart's life on the cluster, with the real helm binary and the
# releases' charts (images pinned by digest, imported from the releases'
# OCI archives):
#   install   helm install of RELEASE_DIR's chart (done by hack/conformance.sh
#             in place of install.yaml: helm_install);
#   upgrade   helm upgrade to NEXT_RELEASE_DIR's chart (the next version's
#             image) with logVerbosity 2, under the rollout suite's
#             connection loop: no allowed attempt may fail, no denied one be
#             admitted, and the DaemonSet must run the next image;
#   rollback  helm rollback to revision 1 under the same loop, back to the
#             first image and verbosity 1;
#   uninstall helm uninstall, then the uninstall suite's checks (a new pod
#             on each node reaches a selected pod within 30 s, no node keeps
#             the nftpolicy table);
#   cleanup   the release's cleanup.yaml on nodes whose agent is gone, one of
#             them holding a left-behind table inet nftpolicy that drops
#             forwarded traffic (what a killed agent's table does to new
#             pods): it must remove it, and a new pod there must connect.
# Each phase writes its files in $OUT/<phase>/; summary.txt joins them.

HELM_RELEASE=nftpolicy
HELM_PHASES=()

# helm_cmd ARGS...: the real helm in node 1, against the cluster, with its
# cache and configuration in the cluster's state directory.
helm_cmd() {
	innode 1 env HELM_CACHE_HOME="$STATE/helm/cache" HELM_CONFIG_HOME="$STATE/helm/config" \
		HELM_DATA_HOME="$STATE/helm/data" "$HELM" --kubeconfig "$KCFG" -n kube-system "$@"
}

# helm_chart DIR: the chart archive of the release in DIR.
helm_chart() {
	local c=("$1"/nftpolicy-*.tgz)
	((${#c[@]} == 1)) || die "$1 holds ${#c[@]} chart archives, want 1"
	echo "${c[0]}"
}

# helm_prepare: the helm binary and the next release (built when it is the
# default one and missing), whose image every node imports too.
helm_prepare() {
	local version
	HELM=$(bash "$ROOT/hack/helm.sh" --built) || die "helm is not built: bash hack/helm.sh"
	version=$(tr -d '[:space:]' <"$ROOT/VERSION")
	if [[ -z $NEXT_RELEASE_DIR ]]; then
		NEXT_RELEASE_DIR=$ROOT/_output/release/$version-next
		release_build "$NEXT_RELEASE_DIR" "$version-next"
	fi
	NEXT_RELEASE_DIR=$(cd "$NEXT_RELEASE_DIR" && pwd) || die "no release directory $NEXT_RELEASE_DIR"
	NEXT_IMAGE=$(release_check "$NEXT_RELEASE_DIR") || exit 1
	[[ $NEXT_IMAGE != "$AGENT_IMAGE" ]] || die "$NEXT_RELEASE_DIR holds the same image as $RELEASE_DIR: not an upgrade"
	RELEASE_IMPORTS+=("$NEXT_RELEASE_DIR/nftpolicy-image.oci.tar=$NEXT_IMAGE")
	log "helm: $HELM; upgrade to $NEXT_RELEASE_DIR ($NEXT_IMAGE)"
}

# HELM_NODE_VALUES: the boot plugin's CNI directories, each node's own
# (holder.sh binds them), never the machine's (a chart older than the boot
# plugin ignores them).
HELM_NODE_VALUES=(--set "bootPlugin.cniBinDir=$NODE_CNI_DIR/bin" --set "bootPlugin.cniConfDir=$NODE_CNI_DIR/net.d")

# helm_check_paths: the release's objects as helm applied them mount none of
# the machine's CNI directories.
helm_check_paths() {
	helm_cmd get manifest "$HELM_RELEASE" >"$STATE/helm-manifest.yaml" || die "helm get manifest failed"
	! grep -qE "path: (/opt/cni/bin|/etc/cni/net.d)\$" "$STATE/helm-manifest.yaml" ||
		die "the chart mounts the machine's CNI directories (bootPlugin values not applied)"
}

# helm_install: the first release's chart, as install.yaml would be applied.
helm_install() {
	mkdir -p "$STATE/helm"
	helm_cmd install "$HELM_RELEASE" "$(helm_chart "$RELEASE_DIR")" --set mode="$MODE" "${HELM_NODE_VALUES[@]}" \
		>"$OUT/helm-install.txt" 2>&1 || { cat "$OUT/helm-install.txt" >&2; die "helm install failed"; }
	helm_check_paths
}

# ds_state: the digest of the DaemonSet's image and the ConfigMap's
# verbosity, one line.
ds_state() {
	local image
	image=$(kc -n kube-system get ds nftpolicy -o jsonpath='{.spec.template.spec.containers[0].image}')
	echo "image=${image##*@}" \
		"$(kc -n kube-system get configmap nftpolicy-config -o jsonpath='{.data.config\.yaml}' | grep -o 'verbosity: [0-9]*' | tr -d ' ')"
}

helm_upgrade() {
	helm_cmd upgrade "$HELM_RELEASE" "$(helm_chart "$NEXT_RELEASE_DIR")" --set mode="$MODE" --set logVerbosity=2 \
		"${HELM_NODE_VALUES[@]}" >"$OUT/helm-upgrade.txt" 2>&1 || { cat "$OUT/helm-upgrade.txt" >&2; die "helm upgrade failed"; }
	helm_check_paths
	log "helm: helm upgrade to $(basename "$(helm_chart "$NEXT_RELEASE_DIR")") (logVerbosity 2); waiting for kubectl rollout status"
}

helm_rollback() {
	helm_cmd rollback "$HELM_RELEASE" 1 >"$OUT/helm-rollback.txt" 2>&1 ||
		{ cat "$OUT/helm-rollback.txt" >&2; die "helm rollback failed"; }
	helm_check_paths
	log "helm: helm rollback $HELM_RELEASE 1; waiting for kubectl rollout status"
}

helm_uninstall() { helm_cmd uninstall "$HELM_RELEASE"; }

# helm_phase NAME FUNC WANT: FUNC's update under the connection loop in
# $OUT/NAME; then the DaemonSet must be in state WANT (ds_state).
helm_phase() {
	local top=$OUT got rc
	OUT=$top/$1
	mkdir -p "$OUT"
	ROLLOUT_UPDATE=$2 ROLLOUT_WHAT="helm $1"
	run_rollout
	rc=$SUITE_RC
	got=$(ds_state)
	summarize_rollout >&2
	{
		echo "after helm $1: $got (want $3)"
		echo "agents' versions at start: $(grep -hoE 'version"?[=:]"[^"]*"' "$OUT"/agent-nftpolicy-*.log 2>/dev/null | sort | uniq -c | paste -sd, -)"
		helm_cmd history "$HELM_RELEASE" 2>&1
	} >>"$OUT/summary.txt"
	[[ $got == "$3" ]] || { log "helm: after $1 the DaemonSet is $got, want $3"; rc=1; }
	OUT=$top
	HELM_PHASES+=("$1")
	((rc == 0)) || HELM_RC=1
}

# helm_cleanup_phase: cleanup.yaml once every agent is gone. The last node
# gets a table inet nftpolicy dropping forwarded traffic (as a table left by
# a killed agent fails new pods) and a new client pod that must not connect
# until cleanup ran, then must.
helm_cleanup_phase() {
	local top=$OUT n=$NODES host r t0 ok=1 i serve
	OUT=$top/cleanup
	mkdir -p "$OUT"
	host=$(kc -n "$UNINSTALL_NS" get pod server -o jsonpath='{.status.podIP}')
	[[ $host == *:* ]] && host="[$host]"
	# The uninstall phase stopped the server's listener: start it again.
	nsenter -t "$(preview_pid 1 server)" -n -- "$UNINSTALL_PY" "$HERE/holdflows.py" serve 8080 2>>"$OUT/holdflows.log" &
	serve=$!
	ROLLOUT_BG+=("$serve") # stopped by suite_cleanup if the script dies first
	sleep 1
	innode "$n" nft -f - <<-EOF
	table inet nftpolicy {
	  chain left-behind {
	    type filter hook forward priority 0; policy drop;
	  }
	}
	EOF
	innode "$n" nft list tables >"$OUT/tables-before-node$n.txt" 2>&1
	kc -n "$UNINSTALL_NS" delete pod "client-node$n" --wait=true >/dev/null 2>&1 || true
	uninstall_client "$n" | kc apply -f - >/dev/null
	kc -n "$UNINSTALL_NS" wait --for=condition=Ready "pod/client-node$n" --timeout=60s >/dev/null || die "client-node$n did not start"
	wait_for 30 "client-node$n's container" preview_pid "$n" "client-node$n"
	r=$(uninstall_probe "$n" "$host")
	echo "before cleanup: $r" >"$OUT/probes.txt"
	[[ $r == *" ok "* ]] && { log "helm: the left-behind table did not drop the probe: the check proves nothing"; ok=0; }
	cp "$RELEASE_DIR/cleanup.yaml" "$STATE/cleanup.yaml"
	node_cni_paths "$STATE/cleanup.yaml"
	diff -u "$RELEASE_DIR/cleanup.yaml" "$STATE/cleanup.yaml" >"$OUT/cleanup.diff" || true
	kc apply --server-side -f "$STATE/cleanup.yaml" >"$OUT/apply.txt" 2>&1 || { cat "$OUT/apply.txt" >&2; ok=0; }
	t0=$SECONDS
	kc -n kube-system rollout status ds/nftpolicy-cleanup --timeout=120s >"$OUT/rollout-status.txt" 2>&1 || ok=0
	kc -n kube-system logs -l app.kubernetes.io/name=nftpolicy-cleanup -c cleanup --prefix >"$OUT/cleanup.log" 2>&1 || true
	for i in $(seq 1 20); do
		r=$(uninstall_probe "$n" "$host")
		echo "$((SECONDS - t0))s after cleanup.yaml: $r" >>"$OUT/probes.txt"
		[[ $r == *" ok "* ]] && break
		sleep 0.5
	done
	[[ $r == *" ok "* ]] || ok=0
	for i in $(seq 1 "$NODES"); do
		innode "$i" nft list tables >"$OUT/tables-after-node$i.txt" 2>&1 || true
		grep -q 'table inet nftpolicy' "$OUT/tables-after-node$i.txt" && ok=0
	done
	kc delete -f "$STATE/cleanup.yaml" --wait=false >>"$OUT/apply.txt" 2>&1 || true
	kill "$serve" 2>/dev/null || true
	wait "$serve" 2>/dev/null || true
	{
		echo "cleanup: the release's cleanup.yaml after helm uninstall; node$n held a left-behind table inet nftpolicy (forward, policy drop)"
		sed 's/^/  /' "$OUT/probes.txt"
		sed 's/^/  log: /' "$OUT/cleanup.log"
		for i in $(seq 1 "$NODES"); do
			echo "  node$i after: $(grep -c 'table inet nftpolicy' "$OUT/tables-after-node$i.txt" || true) nftpolicy table(s)"
		done
		((ok)) && echo "cleanup: PASS" || echo "cleanup: FAIL"
	} >"$OUT/summary.txt"
	OUT=$top
	HELM_PHASES+=(cleanup)
	((ok)) || HELM_RC=1
}

run_helm() {
	local first
	HELM_RC=0
	rm -rf "$OUT"/{upgrade,rollback,uninstall,cleanup}
	source "$HERE/rollout.sh"
	source "$HERE/uninstall.sh"
	first="image=${AGENT_IMAGE##*@} verbosity:1"
	helm_cmd list >"$OUT/helm-list.txt" 2>&1 || true
	[[ $(ds_state) == "$first" ]] || { log "helm: after helm install the DaemonSet is $(ds_state), want $first"; HELM_RC=1; }
	helm_phase upgrade helm_upgrade "image=${NEXT_IMAGE##*@} verbosity:2"
	helm_phase rollback helm_rollback "$first"
	# The uninstall suite's checks, with helm uninstall as the removal.
	local top=$OUT
	OUT=$top/uninstall
	mkdir -p "$OUT"
	UNINSTALL_DELETE=helm_uninstall UNINSTALL_WHAT="helm uninstall"
	SUITE_RC=0
	run_uninstall
	summarize_uninstall >&2
	((SUITE_RC == 0)) || HELM_RC=1
	helm_cmd list -a >>"$OUT/summary.txt" 2>&1 || true
	OUT=$top
	HELM_PHASES+=(uninstall)
	helm_cleanup_phase
	SUITE_RC=$HELM_RC
}

summarize_helm() {
	local p
	{
		echo "suite: helm (install $(basename "$(helm_chart "$RELEASE_DIR")"), upgrade to $(basename "$(helm_chart "$NEXT_RELEASE_DIR")")," \
			"rollback, uninstall, cleanup.yaml), mode: $MODE, nodes: $NODES"
		for p in "${HELM_PHASES[@]}"; do
			echo "=== $p"
			cat "$OUT/$p/summary.txt" 2>/dev/null || echo "(no summary)"
		done
		echo "helm: $( ((SUITE_RC == 0)) && echo PASS || echo FAIL)"
	} >"$OUT/summary.txt"
	echo "------------------------------------------------------------------"
	grep -E '^(suite|===|allowed client|denied client|during|after helm|node[0-9]|cleanup|  node|  before|  [0-9]+s after|uninstall:|rollout:|helm:)' "$OUT/summary.txt"
	echo "full summary: $OUT/summary.txt ($((SECONDS - T0))s in all)"
	echo "------------------------------------------------------------------"
}
