#!/usr/bin/env bash
# hack/conformance.sh runs Kubernetes' own e2e NetworkPolicy suite (upstream
# e2e.test v1.37.2, ginkgo focus "Netpol|NetworkPolicy") against a real
# Kubernetes cluster whose NetworkPolicy enforcer is nftpolicy, deployed from
# a release (make release) as an operator deploys it: the release's image index
# imported into the nodes' containerd, its install.yaml (image pinned by
# digest) applied with kubectl apply --server-side, only --mode changed
# (--image-build: the repository's install.yaml with hack/image.sh's image).
#
# The cluster is built from source (hack/tools.sh conformance: the Go module
# proxy and Debian's packages; no Docker, no registry) and lives entirely in
# network namespaces ("nodes") of this machine: nothing touches the machine's
# own firewall, routes or global sysctls, and everything is torn down at the
# end (processes, mounts, cgroups, namespaces, state). hack/conformance/README.md
# lists what it relies on from the kernel and the machine.
#
# With --suite npa (make conformance-npa) it runs SIG Network's
# ClusterNetworkPolicy conformance suite instead (sigs.k8s.io/network-policy-api
# v0.3.0, conformance/, profile ClusterNetworkPolicy with --all-features) on
# two nodes, with the module's experimental CRD installed; see
# hack/conformance/README.md.
#
# With --suite rollout (make rollout) it runs no suite but a rolling update of
# the nftpolicy DaemonSet (kubectl rollout restart) while a client pod the
# policies admit and one they deny each open a new TCP connection to a server
# pod every 7 ms: it fails if one allowed attempt fails or one denied attempt
# is admitted (hack/conformance/rollout.sh; default --mode queue, 2 nodes).
#
# With --suite preview it runs `kubectl nftpolicy preview` against live
# flows, then applies the previewed policy: the flows listed as "would cut"
# must be exactly those revocation cuts (hack/conformance/preview.sh; 2 nodes).
#
# With --suite uninstall it deletes install.yaml (kubectl delete -f) and
# checks that a new pod on each node reaches a pod a policy selects within
# 30 s and that no node keeps the nftpolicy table
# (hack/conformance/uninstall.sh; 2 nodes).
#
# With --suite helm it installs the release's chart with the real helm,
# upgrades it to the next release's chart under the rollout suite's
# connection loop, rolls back under it, uninstalls with the uninstall
# suite's checks, and runs the release's cleanup.yaml on a node holding a
# left-behind table (hack/conformance/helm.sh; 2 nodes, queue mode).
#
# Usage: bash hack/conformance.sh [options]      (root; make conformance)
#   --suite e2e|npa|rollout|preview|uninstall|helm  Kubernetes' e2e
#                    NetworkPolicy specs (default), SIG Network's
#                    ClusterNetworkPolicy suite, a rolling update of the agent
#                    under connections, a preview of a policy against what it
#                    then cuts, the removal of nftpolicy, or the chart's
#                    install, upgrade and rollback under connections,
#                    uninstall and cleanup.yaml
#   --mode hybrid|queue|kernel  the agent's --mode (default hybrid; rollout
#                    and helm: queue)
#   --focus REGEX    ginkgo focus instead of 'Netpol|NetworkPolicy', e.g. one spec;
#                    with --suite npa: run only the tests whose name matches
#                    (the others are reported as skipped); --run is the same
#   --skip REGEX     extra ginkgo skip regex
#   --no-agent       do not deploy nftpolicy: the suite must fail (it bites);
#                    the script succeeds when it does fail and the cluster works
#   --nodes 1|2      one node, or two linked by a veth (default 1; npa: 2 only;
#                    rollout: 2)
#   --ip-family ipv4|ipv6|dual|dual-ipv6  the cluster's families (default
#                    ipv4): node addresses, pod CIDRs and Service CIDRs of
#                    IPv4, of IPv6, or of both (dual-stack: pods get both
#                    addresses; Services default to the primary family, IPv4
#                    with dual, IPv6 with dual-ipv6)
#   --agent-arg ARG  one more argument for the agent (repeatable), e.g.
#                    --agent-arg=--verify-rate=1: the summary then counts
#                    the verdicts runtime verification re-decided and its
#                    disagreements (from every node's metrics)
#   --procs N        ginkgo parallel processes (default 4)
#   --keep           leave the cluster up afterwards (then: --down)
#   --down           tear down a cluster left by --keep (or by a crash), exit
#   --no-build       do not run hack/tools.sh (use what is in the tools dir)
#   --release DIR    the release directory to deploy (default
#                    _output/release/<VERSION>, built by make release when
#                    missing): its image index imported into every node's
#                    containerd (ctr import --all-platforms), its install.yaml
#                    (image pinned by digest) applied with kubectl apply
#                    --server-side; only the ConfigMap's mode and --agent-arg
#                    flags are changed (install.diff)
#   --next-release DIR  with --suite helm: the release helm upgrades to
#                    (default _output/release/<VERSION>-next, built by
#                    hack/release.sh with that version when missing)
#   --image-build    deploy the repository's install.yaml with an image made by
#                    hack/image.sh from the build host's nft instead (the path
#                    before releases existed)
# Environment: NFTPOLICY_TOOLS (tools cache, default /var/cache/nftpolicy/tools),
#   NFTPOLICY_CONFORMANCE_STATE (cluster state, default /var/cache/nftpolicy/conformance),
#   NFTPOLICY_CONFORMANCE_OUT (reports, default <repo>/_output/conformance,
#   <repo>/_output/conformance-npa with --suite npa, <repo>/_output/rollout
#   with --suite rollout).
# Output: <out>/junit_01.xml (ginkgo JUnit report), e2e.log, summary.txt,
#   logs/ (every component), agent-<node>.log, ruleset-<node>.nft,
#   metrics-<node>.txt (the agent's metrics at the end); with
#   --suite npa: report.yaml (the suite's conformance report), npa.log (go
#   test -v output), results.tsv (test, result, seconds, SCTP probes skipped),
#   failures.txt (what each failed probe tried, expected and saw); with
#   --suite rollout: summary.txt, connections-{allowed,denied}.txt (one line
#   per attempt), agent-pods.txt (the agent pods' changes), the complete log
#   of every agent pod (agent-nftpolicy-*.log).
set -euo pipefail
shopt -s nullglob

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=$ROOT/hack/conformance
TOOLS=${NFTPOLICY_TOOLS:-/var/cache/nftpolicy/tools}
BIN=$TOOLS/bin
STATE=${NFTPOLICY_CONFORMANCE_STATE:-/var/cache/nftpolicy/conformance}
PREFIX=nftpc                 # netns names, cgroup roots
KUBE_VERSION=v1.37.2
PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
AGNHOST_IMAGE=registry.k8s.io/e2e-test-images/agnhost:2.66.1
DEFAULT_FOCUS='Netpol|NetworkPolicy'
# The NPA suite's manifests name this agnhost; the harness's own agnhost
# (v1.37.2's, 2.66.1) has every command they use (connect, serve-hostname,
# netexec, porter, pause) and is imported under this name too, with bash.
NPA_AGNHOST_IMAGE=registry.k8s.io/e2e-test-images/agnhost:2.45
NPA_VERSION=v0.3.0
NPA_PROFILE=ClusterNetworkPolicy
NPA_SCTP_TESTS=CNPAdminTierEgressSCTP,CNPAdminTierIngressSCTP,CNPBaselineTierEgressSCTP,CNPBaselineTierIngressSCTP

RELEASE_DIR= NEXT_RELEASE_DIR= IMAGE_BUILD= RELEASE_IMPORTS=() SUITE=e2e MODE= FOCUS= SKIP= NO_AGENT=0 KEEP=0 NODES= PROCS=4 DOWN=0 BUILD=1 IP_FAMILY=ipv4 AGENT_ARGS=()
while (($#)); do
	case $1 in
	--suite) SUITE=$2; shift 2 ;;
	--suite=*) SUITE=${1#*=}; shift ;;
	--run) FOCUS=$2; shift 2 ;;
	--run=*) FOCUS=${1#*=}; shift ;;
	--mode) MODE=$2; shift 2 ;;
	--mode=*) MODE=${1#*=}; shift ;;
	--focus) FOCUS=$2; shift 2 ;;
	--focus=*) FOCUS=${1#*=}; shift ;;
	--skip) SKIP=$2; shift 2 ;;
	--skip=*) SKIP=${1#*=}; shift ;;
	--no-agent) NO_AGENT=1; shift ;;
	--nodes) NODES=$2; shift 2 ;;
	--nodes=*) NODES=${1#*=}; shift ;;
	--ip-family) IP_FAMILY=$2; shift 2 ;;
	--ip-family=*) IP_FAMILY=${1#*=}; shift ;;
	--agent-arg) AGENT_ARGS+=("$2"); shift 2 ;;
	--agent-arg=*) AGENT_ARGS+=("${1#*=}"); shift ;;
	--procs) PROCS=$2; shift 2 ;;
	--procs=*) PROCS=${1#*=}; shift ;;
	--keep) KEEP=1; shift ;;
	--down) DOWN=1; shift ;;
	--no-build) BUILD=0; shift ;;
	--release) RELEASE_DIR=$2; shift 2 ;;
	--release=*) RELEASE_DIR=${1#*=}; shift ;;
	--image-build) IMAGE_BUILD=1; shift ;;
	--next-release) NEXT_RELEASE_DIR=$2; shift 2 ;;
	--next-release=*) NEXT_RELEASE_DIR=${1#*=}; shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "hack/conformance.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
MODE_SET=$MODE
[[ -n $MODE ]] || { [[ $SUITE == rollout ]] && MODE=queue || MODE=hybrid; }
case $MODE in hybrid | queue | kernel) ;; *) echo "--mode must be hybrid, queue or kernel" >&2; exit 2 ;; esac
case $SUITE in
e2e) NODES=${NODES:-1} FOCUS=${FOCUS:-$DEFAULT_FOCUS} OUT=${NFTPOLICY_CONFORMANCE_OUT:-$ROOT/_output/conformance} ;;
npa)
	# The suite's host-network StatefulSet (2 replicas, fixed host ports)
	# needs a node per replica.
	NODES=${NODES:-2} OUT=${NFTPOLICY_CONFORMANCE_OUT:-$ROOT/_output/conformance-npa}
	[[ $NODES == 2 ]] || { echo "--suite npa needs --nodes 2 (one host-network server pod per node)" >&2; exit 2; }
	[[ -z $SKIP ]] || { echo "--skip is for --suite e2e (ginkgo); --suite npa has --focus/--run" >&2; exit 2; }
	;;
rollout)
	NODES=${NODES:-2} OUT=${NFTPOLICY_CONFORMANCE_OUT:-$ROOT/_output/rollout}
	((!NO_AGENT)) || { echo "--suite rollout updates the agent: --no-agent does not apply" >&2; exit 2; }
	[[ -z $FOCUS && -z $SKIP ]] || { echo "--focus/--run/--skip do not apply to --suite rollout" >&2; exit 2; }
	;;
preview)
	NODES=${NODES:-2} OUT=${NFTPOLICY_CONFORMANCE_OUT:-$ROOT/_output/preview}
	((!NO_AGENT)) || { echo "--suite preview needs the agent: --no-agent does not apply" >&2; exit 2; }
	[[ -z $FOCUS && -z $SKIP ]] || { echo "--focus/--run/--skip do not apply to --suite preview" >&2; exit 2; }
	;;
uninstall)
	NODES=${NODES:-2} OUT=${NFTPOLICY_CONFORMANCE_OUT:-$ROOT/_output/uninstall}
	((!NO_AGENT)) || { echo "--suite uninstall removes the agent: --no-agent does not apply" >&2; exit 2; }
	[[ -z $FOCUS && -z $SKIP ]] || { echo "--focus/--run/--skip do not apply to --suite uninstall" >&2; exit 2; }
	;;
helm)
	NODES=${NODES:-2} MODE=${MODE_SET:-queue} OUT=${NFTPOLICY_CONFORMANCE_OUT:-$ROOT/_output/helm}
	((!NO_AGENT)) || { echo "--suite helm installs the agent: --no-agent does not apply" >&2; exit 2; }
	[[ -z $FOCUS && -z $SKIP ]] || { echo "--focus/--run/--skip do not apply to --suite helm" >&2; exit 2; }
	[[ -z $IMAGE_BUILD ]] || { echo "--suite helm installs the releases' charts: --image-build does not apply" >&2; exit 2; }
	((${#AGENT_ARGS[@]} == 0)) || { echo "--agent-arg does not apply to --suite helm" >&2; exit 2; }
	;;
*) echo "--suite must be e2e, npa, rollout, preview, uninstall or helm" >&2; exit 2 ;;
esac
case $NODES in 1 | 2) ;; *) echo "--nodes must be 1 or 2" >&2; exit 2 ;; esac

# Address plan per family: node N is 10.250.0.N and fd00:10:250::N, its pod
# CIDR 10.244.(N-1).0/24 and fd00:10:244:(N-1)::/64; Services 10.96.0.0/16
# and fd00:10:96::/112 (the API server takes at most 20 bits of IPv6 Service
# range). FAMILIES lists the cluster's families, the primary one first.
case $IP_FAMILY in
ipv4) FAMILIES=(4) ;;
ipv6) FAMILIES=(6) ;;
dual) FAMILIES=(4 6) ;;
dual-ipv6) FAMILIES=(6 4) ;;
*) echo "--ip-family must be ipv4, ipv6, dual or dual-ipv6" >&2; exit 2 ;;
esac
# per_family FUNC ARGS...: FUNC's output for each family, comma-separated,
# the primary family first (FUNC takes the family as its first argument).
per_family() {
	local f fn=$1 out=()
	shift
	for f in "${FAMILIES[@]}"; do out+=("$("$fn" "$f" "$@")"); done
	(IFS=,; echo "${out[*]}")
}
fam_service_cidr() { [[ $1 == 4 ]] && echo 10.96.0.0/16 || echo fd00:10:96::/112; }
fam_service_ip() { [[ $1 == 4 ]] && echo 10.96.0.1 || echo fd00:10:96::1; }
fam_cluster_cidr() { [[ $1 == 4 ]] && echo 10.244.0.0/16 || echo fd00:10:244::/56; }
fam_node_ip() { [[ $1 == 4 ]] && echo "10.250.0.$2" || echo "fd00:10:250::$2"; }
fam_node_prefix() { [[ $1 == 4 ]] && echo 24 || echo 64; }
fam_gateway() { [[ $1 == 4 ]] && echo 10.250.0.254 || echo fd00:10:250::fe; }
# (RFC 5952 form: the API server warns about fd00:10:244:0::/64.)
fam_podcidr() {
	if [[ $1 == 4 ]]; then echo "10.244.$(($2 - 1)).0/24"
	elif (($2 == 1)); then echo "fd00:10:244::/64"
	else printf 'fd00:10:244:%x::/64\n' "$(($2 - 1))"; fi
}
fam_default_route() { [[ $1 == 4 ]] && echo 0.0.0.0/0 || echo ::/0; }
SERVICE_CIDR=$(per_family fam_service_cidr)
SERVICE_IP=$(fam_service_ip "${FAMILIES[0]}")
CLUSTER_CIDR=$(per_family fam_cluster_cidr)

T0=$SECONDS
log() { printf '[conformance %4ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ $(id -u) == 0 ]] || die "must run as root"

node_ns() { echo "$PREFIX-node$1"; }
node_name() { echo "node$1"; }
# node_ip N: node N's address of the primary family; node_ips N: all of
# them, comma-separated; node_podcidrs N: its pod CIDRs, comma-separated.
node_ip() { fam_node_ip "${FAMILIES[0]}" "$1"; }
node_ips() { per_family fam_node_ip "$1"; }
node_podcidrs() { per_family fam_podcidr "$1"; }
# url_host ADDR: ADDR as the host of a URL (an IPv6 address in brackets).
url_host() { [[ $1 == *:* ]] && echo "[$1]" || echo "$1"; }
node_dir() { echo "$STATE/node$1"; }
holder_pid() { cat "$(node_dir "$1")/holder.pid" 2>/dev/null; }
# innode N CMD...: run CMD in node N's network and mount namespaces.
innode() {
	local n=$1
	shift
	nsenter -t "$(holder_pid "$n")" -m -n -- env PATH="$BIN:$PATH" "$@"
}
KCFG=$STATE/pki/admin.kubeconfig
# Whether this script made /run/netns (to undo): next to the state, so that
# --down finds it whichever suite made the cluster.
NETNS_MARK=$(dirname "$STATE")/.conformance-netns-created
kc() { innode 1 kubectl --kubeconfig "$KCFG" "$@"; }

# ---------------------------------------------------------------------------
# teardown: every process of the nodes, their cgroups, netns and state.
# ---------------------------------------------------------------------------
# node_pids N: processes in node N's netns or mount namespace, or in its cgroups.
node_pids() {
	local n=$1 netns h p cg=() mntns=/nonexistent
	netns=/run/netns/$(node_ns "$n")
	[[ -e $netns ]] || netns=/nonexistent
	h=$(holder_pid "$n" || true)
	[[ -n $h && -e /proc/$h/ns/mnt ]] && mntns=/proc/$h/ns/mnt
	for p in /proc/[0-9]*; do
		p=${p#/proc/}
		[[ $p == "$$" || $p == "$BASHPID" ]] && continue
		# -ef: same namespace (device and inode); builtins only, this loops over every process
		if [[ /proc/$p/ns/net -ef $netns || /proc/$p/ns/mnt -ef $mntns ]]; then
			echo "$p"
			continue
		fi
		mapfile -t cg 2>/dev/null <"/proc/$p/cgroup" || continue
		[[ ${cg[*]} == *":/$PREFIX-node$n/"* || ${cg[*]} == *":/$PREFIX-node$n" || ${cg[*]} == *":/$PREFIX-node$n "* ]] && echo "$p"
	done
	return 0
}

teardown_node() {
	local n=$1 i pids cg
	# Processes: SIGKILL (a throwaway cluster; apiserver would take 40 s on SIGTERM).
	for i in $(seq 1 30); do
		pids=$(node_pids "$n")
		[[ -z $pids ]] && break
		# shellcheck disable=SC2086
		kill -9 $pids 2>/dev/null || true
		sleep 0.5
	done
	[[ -z $(node_pids "$n") ]] || log "WARNING: node$n still has processes: $(node_pids "$n" | tr '\n' ' ')"
	# cgroups made by kubelet and runc under cgroupRoot /$PREFIX-node$n, in every hierarchy.
	for cg in /sys/fs/cgroup/*/"$PREFIX-node$n"; do
		for i in 1 2 3 4 5; do
			find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
			[[ -d $cg ]] || break
			sleep 1
		done
		[[ -d $cg ]] && log "WARNING: could not remove cgroup $cg"
	done
	if [[ -e /run/netns/$(node_ns "$n") ]]; then
		ip netns del "$(node_ns "$n")" || log "WARNING: could not delete netns $(node_ns "$n")"
	fi
}

teardown() {
	local n
	log "tearing down"
	for n in 1 2; do
		[[ -e /run/netns/$(node_ns "$n") || -d $(node_dir "$n") ]] || compgen -G "/sys/fs/cgroup/*/$PREFIX-node$n" >/dev/null || continue
		teardown_node "$n"
	done
	rm -rf "$STATE"
	# ip netns add made /run/netns a mount point if it was not; undo that when
	# we made it and nothing else uses it now.
	if [[ -f $NETNS_MARK ]]; then
		if [[ -d /run/netns && -z $(ls -A /run/netns) ]]; then
			umount /run/netns 2>/dev/null || true
			rmdir /run/netns 2>/dev/null || true
		fi
		rm -f "$NETNS_MARK"
	fi
	log "teardown done"
}

if ((DOWN)); then
	teardown
	exit 0
fi

# ---------------------------------------------------------------------------
# preflight, tools, images
# ---------------------------------------------------------------------------
for c in ip nsenter openssl flock sha256sum python3 tar; do command -v $c >/dev/null || die "$c is missing"; done
mkdir -p "$(dirname "$STATE")" "$OUT"
# The lock is this script's only: the cluster's processes do not inherit
# it (8>&- where they start), so a cluster left by --keep is torn down by
# the next run, not mistaken for a running script.
exec 8>"$(dirname "$STATE")/.conformance.lock"
flock -n 8 || die "another hack/conformance.sh is running"
if [[ -d $STATE || -e /run/netns/$(node_ns 1) ]]; then
	log "a previous cluster was left behind; tearing it down first"
	teardown
fi

TOOLSET=conformance SUITE_BINS=(e2e.test ginkgo)
[[ $SUITE == npa ]] && TOOLSET=npa SUITE_BINS=(npa-conformance.test)
[[ $SUITE == rollout || $SUITE == preview || $SUITE == uninstall || $SUITE == helm ]] && SUITE_BINS=()
if ((BUILD)); then
	log "building tools (hack/tools.sh $TOOLSET; cached in $TOOLS)"
	bash "$ROOT/hack/tools.sh" "$TOOLSET" >/dev/null
fi
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd "${SUITE_BINS[@]}" \
	agnhost pause containerd containerd-shim-runc-v2 ctr; do
	[[ -x $BIN/$b ]] || die "$BIN/$b is missing: run bash hack/tools.sh $TOOLSET"
done
if [[ $SUITE == npa ]]; then
	# The CRD of the module version the agent is built with; the suite reads
	# its bundle-version annotation and must find the version it tests.
	NPA_CRD=$(bash "$ROOT/hack/crd.sh" experimental) || die "hack/crd.sh found no CRD"
	grep -q "policy.networking.k8s.io/bundle-version: $NPA_VERSION\$" "$NPA_CRD" ||
		die "$NPA_CRD is not bundle version $NPA_VERSION (go.mod and the suite disagree)"
fi
for c in runc iptables conntrack nft; do command -v $c >/dev/null || die "$c is missing (apt-get install)"; done
[[ -x /usr/lib/cni/ptp && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] ||
	die "CNI plugins missing: apt-get install containernetworking-plugins"

# SCTP: the [Feature:SCTPConnectivity] specs, and the NPA suite's SCTP tests,
# SCTP server containers and SCTP probes, need SCTP sockets in the kernel.
SKIPS=()
[[ -n $SKIP ]] && SKIPS+=("$SKIP")
NO_SCTP=
if ! python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132).close()' 2>/dev/null; then
	NO_SCTP="this kernel has no SCTP sockets (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails)"
	if [[ $SUITE == e2e ]]; then
		log "$NO_SCTP: skipping the [Feature:SCTPConnectivity] specs"
		SKIPS+=('\[Feature:SCTPConnectivity\]')
	elif [[ $SUITE == npa ]]; then
		log "$NO_SCTP: skipping the tests $NPA_SCTP_TESTS, the SCTP probes of the other tests, and the base pods' SCTP server containers"
	fi
fi
SKIP_RE=$(IFS='|'; echo "${SKIPS[*]}")

rm -rf "$OUT/logs" "$OUT"/junit_*.xml "$OUT"/e2e.log "$OUT"/summary.txt "$OUT"/agent-*.log "$OUT"/ruleset-*.nft \
	"$OUT"/ginkgo "$OUT"/report.yaml "$OUT"/npa.log "$OUT"/results.tsv "$OUT"/failures.txt "$OUT"/install.diff \
	"$OUT"/connections-*.txt "$OUT"/queues-*.txt "$OUT"/agent-pods.txt "$OUT"/connloop.log "$OUT"/rollout-status.txt
mkdir -p "$OUT/logs" "$STATE/images" "$STATE/pki" "$STATE/sysctl"
LOGS=$OUT/logs

if ((!KEEP)); then
	trap 'rc=$?; declare -F suite_cleanup >/dev/null && suite_cleanup; teardown; exit $rc' EXIT
	trap 'exit 130' INT TERM
else
	trap 'rc=$?; declare -F suite_cleanup >/dev/null && suite_cleanup; ((rc == 0)) || log "cluster left up (--keep); tear down with: bash hack/conformance.sh --down"; exit $rc' EXIT
fi

source "$HERE/release.sh"
log "building images"
mkrootfs() { # DIR: an empty root filesystem with /tmp and /etc/passwd
	mkdir -p "$1"/{etc,tmp,proc,sys,dev}
	chmod 755 "$1"
	chmod 1777 "$1/tmp"
	printf 'root:x:0:0:root:/:/bin/sh\n' >"$1/etc/passwd"
	printf 'root:x:0:\n' >"$1/etc/group"
}
mkrootfs "$STATE/images/pause"
cp "$BIN/pause" "$STATE/images/pause/pause"
bash "$ROOT/hack/image.sh" --rootfs "$STATE/images/pause" --tag "$PAUSE_IMAGE" --entrypoint /pause \
	--out "$STATE/images/pause.tar" >/dev/null
mkrootfs "$STATE/images/agnhost"
cp "$BIN/agnhost" "$STATE/images/agnhost/agnhost"
bash "$ROOT/hack/image.sh" --rootfs "$STATE/images/agnhost" --tag "$AGNHOST_IMAGE" --entrypoint /agnhost \
	--cmd pause --out "$STATE/images/agnhost.tar" >/dev/null
if [[ $SUITE == npa ]]; then
	# The suite's containers run `/bin/bash -c "/agnhost ..."`: add Debian's bash.
	bash "$ROOT/hack/image.sh" --rootfs "$STATE/images/agnhost" --tag "$NPA_AGNHOST_IMAGE" --entrypoint /agnhost \
		--cmd pause --host-binary "$(command -v bash)" --out "$STATE/images/agnhost-npa.tar" >/dev/null
fi
rm -rf "$STATE/images/pause" "$STATE/images/agnhost"
AGENT_IMAGE= AGENT_MANIFEST=$ROOT/install.yaml
if ((!NO_AGENT)) && [[ -n $IMAGE_BUILD ]]; then
	[[ -f $ROOT/install.yaml ]] || die "install.yaml is missing"
	bash "$ROOT/hack/image.sh" --tag nftpolicy.local/nftpolicy:conformance --out "$STATE/images/nftpolicy.tar" >/dev/null
	AGENT_IMAGE=nftpolicy.local/nftpolicy:conformance
elif ((!NO_AGENT)); then
	release_prepare
fi
if [[ $SUITE == helm ]]; then
	source "$HERE/helm.sh"
	helm_prepare
	# The pause image the release's cleanup.yaml names (the kubelet's
	# sandbox image is $PAUSE_IMAGE).
	cleanup_pause=$(awk '$1 == "image:" && $2 ~ /pause/ { print $2; exit }' "$RELEASE_DIR/cleanup.yaml")
	if [[ -n $cleanup_pause && $cleanup_pause != "$PAUSE_IMAGE" ]]; then
		mkrootfs "$STATE/images/pause"
		cp "$BIN/pause" "$STATE/images/pause/pause"
		bash "$ROOT/hack/image.sh" --rootfs "$STATE/images/pause" --tag "$cleanup_pause" --entrypoint /pause \
			--out "$STATE/images/pause-cleanup.tar" >/dev/null
		rm -rf "$STATE/images/pause"
	fi
fi

# ---------------------------------------------------------------------------
# PKI and kubeconfigs
# ---------------------------------------------------------------------------
log "generating certificates"
PKI=$STATE/pki
openssl_q() { openssl "$@" 2>/dev/null; }
openssl_q req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/ca.key" \
	-out "$PKI/ca.crt" -subj "/CN=nftpolicy-conformance-ca" -days 3
# cert NAME SUBJECT [SAN]
cert() {
	local name=$1 subj=$2 san=${3:-}
	openssl_q req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/$name.key" \
		-out "$PKI/$name.csr" -subj "$subj"
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=serverAuth,clientAuth"
		[[ -n $san ]] && echo "subjectAltName=$san"
	} >"$PKI/$name.ext"
	openssl_q x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 3 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt"
}
api_sans="DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:::1"
for f in "${FAMILIES[@]}"; do api_sans+=",IP:$(fam_service_ip "$f"),IP:$(fam_node_ip "$f" 1)"; done
cert apiserver "/CN=kube-apiserver" "$api_sans"
cert admin "/O=system:masters/CN=kubernetes-admin"
openssl_q genrsa -out "$PKI/sa.key" 2048
openssl_q rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
# kubeconfig FILE CERTNAME
kubeconfig() {
	cat >"$1" <<-EOF
	apiVersion: v1
	kind: Config
	clusters:
	- name: conformance
	  cluster: {server: "https://$(url_host "$(node_ip 1)"):6443", certificate-authority: "$PKI/ca.crt"}
	users:
	- name: $2
	  user: {client-certificate: "$PKI/$2.crt", client-key: "$PKI/$2.key"}
	contexts:
	- name: conformance
	  context: {cluster: conformance, user: $2}
	current-context: conformance
	EOF
}
kubeconfig "$KCFG" admin
for n in $(seq 1 "$NODES"); do
	cert "kubelet-node$n" "/O=system:nodes/CN=system:node:$(node_name "$n")"
	kubeconfig "$PKI/kubelet-node$n.kubeconfig" "kubelet-node$n"
done

# What kubelet wants in the global sysctls it would otherwise rewrite.
printf '1\n' >"$STATE/sysctl/vm.overcommit_memory"
printf '0\n' >"$STATE/sysctl/vm.panic_on_oom"
printf '10\n' >"$STATE/sysctl/kernel.panic"
printf '1\n' >"$STATE/sysctl/kernel.panic_on_oops"
printf '1000000\n' >"$STATE/sysctl/kernel.keys.root_maxkeys"
printf '25000000\n' >"$STATE/sysctl/kernel.keys.root_maxbytes"
# The machine's cgroup hierarchies, to mount again inside each node.
awk '$2 ~ "^/sys/fs/cgroup/" && ($3 == "cgroup" || $3 == "cgroup2") {print $2, $3, $4}' /proc/self/mounts \
	>"$STATE/cgroups"
[[ -s $STATE/cgroups ]] || die "no cgroup hierarchies under /sys/fs/cgroup"

# ---------------------------------------------------------------------------
# nodes: netns, holder, links
# ---------------------------------------------------------------------------
[[ -d /run/netns ]] || touch "$NETNS_MARK"
start_holder() {
	local n=$1 nd
	nd=$(node_dir "$n")
	mkdir -p "$nd/var-lib" "$nd/var-log" "$nd/cni" "$nd/etc"
	{
		echo "127.0.0.1 localhost"
		echo "::1 localhost"
		for m in $(seq 1 "$NODES"); do
			for f in "${FAMILIES[@]}"; do echo "$(fam_node_ip "$f" "$m") $(node_name "$m")"; done
		done
	} >"$nd/hosts"
	echo "nameserver 127.0.0.1" >"$nd/resolv.conf"
	ip netns add "$(node_ns "$n")"
	setsid ip netns exec "$(node_ns "$n")" bash "$HERE/holder.sh" "$nd" "$STATE/sysctl" "$STATE/cgroups" \
		>"$LOGS/holder-node$n.log" 2>&1 </dev/null 8>&- &
	echo $! >"$nd/holder.pid"
	disown
	for _ in $(seq 1 100); do [[ -f $nd/holder.ready ]] && return 0; sleep 0.1; done
	cat "$LOGS/holder-node$n.log" >&2
	die "the holder of node$n did not start"
}
log "creating $NODES node namespace(s)"
for n in $(seq 1 "$NODES"); do start_holder "$n"; done
# Links: node1's eth0 is one end of a veth pair; the other end is node2's eth0,
# or (one node) stays in node1 as eth0p: this kernel has no dummy links.
if ((NODES == 2)); then
	ip -n "$(node_ns 1)" link add eth0 type veth peer name eth0 netns "$(node_ns 2)"
else
	ip -n "$(node_ns 1)" link add eth0 type veth peer name eth0p
	ip -n "$(node_ns 1)" link set eth0p up
fi
for n in $(seq 1 "$NODES"); do
	ns=$(node_ns "$n")
	# per-namespace sysctls of the node (not the machine's). IPv6: forwarding
	# (the node routes its pods' traffic), and no duplicate address detection
	# on the node's links, the pods' host-side veths included (made later by
	# the CNI plugin): an address stays "tentative", unusable as a source or
	# a next hop, until DAD ends a second or more later, and nothing else
	# on these links could hold the same address.
	innode "$n" sysctl -q -w net.ipv4.ip_forward=1 net.ipv4.conf.all.forwarding=1
	if [[ " ${FAMILIES[*]} " == *" 6 "* ]]; then
		innode "$n" sysctl -q -w net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.default.disable_ipv6=0 \
			net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
			net.ipv6.conf.eth0.accept_dad=0 net.ipv6.conf.all.forwarding=1 net.ipv6.conf.default.forwarding=1
	fi
	ip -n "$ns" link set lo up
	for f in "${FAMILIES[@]}"; do
		# nodad: usable at once (IPv4 ignores it; IPv6 would wait for DAD).
		if [[ $f == 6 ]]; then
			ip -n "$ns" addr add "$(fam_node_ip "$f" "$n")/$(fam_node_prefix "$f")" dev eth0 nodad
		else
			ip -n "$ns" addr add "$(fam_node_ip "$f" "$n")/$(fam_node_prefix "$f")" dev eth0
		fi
	done
	ip -n "$ns" link set eth0 up
	for f in "${FAMILIES[@]}"; do
		ip -n "$ns" -"$f" route add default via "$(fam_gateway "$f")" dev eth0 onlink
		for m in $(seq 1 "$NODES"); do
			((m == n)) || ip -n "$ns" -"$f" route add "$(fam_podcidr "$f" "$m")" via "$(fam_node_ip "$f" "$m")" dev eth0
		done
	done
done

# ---------------------------------------------------------------------------
# control plane (node1)
# ---------------------------------------------------------------------------
# start_bg N NAME CMD...: a daemon of node N, in its own session; log in $LOGS.
start_bg() {
	local n=$1 name=$2
	shift 2
	setsid nsenter -t "$(holder_pid "$n")" -m -n -- env PATH="$BIN:$PATH" "$@" \
		>>"$LOGS/$name.log" 2>&1 </dev/null 8>&- &
	echo $! >"$(node_dir "$n")/$name.pid"
	disown
}
# wait_for SECONDS WHAT CMD...: until CMD succeeds (wall-clock timeout).
wait_for() {
	local t=$1 what=$2 end=$((SECONDS + $1))
	shift 2
	until "$@" >/dev/null 2>&1; do
		((SECONDS < end)) || die "timed out after ${t}s waiting for $what"
		sleep 0.5
	done
}

log "starting etcd and kube-apiserver"
start_bg 1 etcd etcd --name default --data-dir "$STATE/etcd" \
	--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
	--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
	--initial-cluster default=http://127.0.0.1:2380 --unsafe-no-fsync --log-level warn
start_bg 1 kube-apiserver kube-apiserver \
	--etcd-servers=http://127.0.0.1:2379 \
	--advertise-address="$(node_ip 1)" --bind-address="$([[ ${FAMILIES[*]} == 4 ]] && echo 0.0.0.0 || echo ::)" --secure-port=6443 \
	--service-cluster-ip-range="$SERVICE_CIDR" \
	--client-ca-file="$PKI/ca.crt" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
	--service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--authorization-mode=Node,RBAC --allow-privileged=true \
	--kubelet-client-certificate="$PKI/admin.crt" --kubelet-client-key="$PKI/admin.key" \
	--kubelet-preferred-address-types=InternalIP,Hostname \
	--profiling=false --v=1
readyz() { [[ $(innode 1 kubectl --kubeconfig "$KCFG" get --raw /readyz 2>/dev/null) == ok ]]; }
wait_for 180 "kube-apiserver /readyz" readyz

log "starting kube-controller-manager and kube-scheduler"
start_bg 1 kube-controller-manager bash -c 'while :; do "$@"; echo "kube-controller-manager exited ($?); restarting"; sleep 2; done' _ \
	kube-controller-manager --kubeconfig="$KCFG" --leader-elect=false \
	--service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
	--cluster-cidr="$CLUSTER_CIDR" --allocate-node-cidrs=false \
	--bind-address=127.0.0.1 --profiling=false --v=1
start_bg 1 kube-scheduler bash -c 'while :; do "$@"; echo "kube-scheduler exited ($?); restarting"; sleep 2; done' _ \
	kube-scheduler --kubeconfig="$KCFG" --leader-elect=false --bind-address=127.0.0.1 --profiling=false --v=1

# ---------------------------------------------------------------------------
# worker: containerd, images, kubelet, kube-proxy (every node)
# ---------------------------------------------------------------------------
start_worker() {
	local n=$1 nd name ip ranges=() routes=() f
	nd=$(node_dir "$n") name=$(node_name "$n") ip=$(node_ip "$n")
	for f in "${FAMILIES[@]}"; do
		ranges+=("[{\"subnet\": \"$(fam_podcidr "$f" "$n")\"}]")
		routes+=("{\"dst\": \"$(fam_default_route "$f")\"}")
	done
	cat >"$nd/cni/10-ptp.conflist" <<-EOF
	{
	  "cniVersion": "1.0.0",
	  "name": "nftpc",
	  "plugins": [{
	    "type": "ptp",
	    "ipMasq": false,
	    "mtu": 1500,
	    "ipam": {
	      "type": "host-local",
	      "ranges": [$(IFS=,; echo "${ranges[*]}")],
	      "routes": [$(IFS=,; echo "${routes[*]}")]
	    }
	  }]
	}
	EOF
	cat >"$nd/containerd.toml" <<-EOF
	version = 3
	root = "/var/lib/containerd"
	state = "/run/containerd"
	[grpc]
	  address = "/run/containerd/containerd.sock"
	[plugins."io.containerd.cri.v1.images"]
	  snapshotter = "overlayfs"
	  [plugins."io.containerd.cri.v1.images".pinned_images]
	    sandbox = "$PAUSE_IMAGE"
	[plugins."io.containerd.cri.v1.runtime"]
	  restrict_oom_score_adj = true
	  disable_apparmor = true
	  [plugins."io.containerd.cri.v1.runtime".containerd]
	    default_runtime_name = "runc"
	    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
	      runtime_type = "io.containerd.runc.v2"
	      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
	        BinaryName = "$(command -v runc)"
	        SystemdCgroup = false
	  [plugins."io.containerd.cri.v1.runtime".cni]
	    bin_dirs = ["/usr/lib/cni", "$nd/cni-bin"]
	    conf_dir = "$nd/cni"
	EOF
	start_bg "$n" "containerd-node$n" containerd --config "$nd/containerd.toml"
	wait_for 60 "containerd on node$n" innode "$n" ctr -a /run/containerd/containerd.sock version
	local img
	((${#RELEASE_IMPORTS[@]})) && release_import "$n"
	for img in "$STATE"/images/*.tar; do
		innode "$n" ctr -a /run/containerd/containerd.sock -n k8s.io images import --local "$img" >/dev/null 2>>"$LOGS/ctr-node$n.log" ||
			innode "$n" ctr -a /run/containerd/containerd.sock -n k8s.io images import "$img" >/dev/null 2>>"$LOGS/ctr-node$n.log" ||
			die "importing $img on node$n failed (see $LOGS/ctr-node$n.log)"
	done
	cat >"$nd/kubelet.yaml" <<-EOF
	apiVersion: kubelet.config.k8s.io/v1beta1
	kind: KubeletConfiguration
	failCgroupV1: false
	cgroupDriver: cgroupfs
	cgroupRoot: /$PREFIX-node$n
	containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
	address: "$ip"
	readOnlyPort: 0
	healthzBindAddress: 127.0.0.1
	authentication:
	  anonymous: {enabled: false}
	  webhook: {enabled: false}
	  x509: {clientCAFile: "$PKI/ca.crt"}
	authorization: {mode: AlwaysAllow}
	failSwapOn: false
	protectKernelDefaults: false
	resolvConf: /etc/resolv.conf
	clusterDomain: cluster.local
	serializeImagePulls: false
	imageGCHighThresholdPercent: 100
	imageGCLowThresholdPercent: 99
	evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
	kubeAPIQPS: 50
	kubeAPIBurst: 100
	EOF
	# kubelet wants its cgroupRoot to exist in every v1 hierarchy.
	local h
	for h in /sys/fs/cgroup/*; do
		[[ -f $h/cgroup.procs && ! -f $h/cgroup.controllers ]] || continue # v1 only
		mkdir -p "$h/$PREFIX-node$n"
		if [[ -f $h/cpuset.cpus ]]; then
			cat "$h/cpuset.cpus" >"$h/$PREFIX-node$n/cpuset.cpus"
			cat "$h/cpuset.mems" >"$h/$PREFIX-node$n/cpuset.mems"
		fi
	done
	start_bg "$n" "kubelet-node$n" kubelet --config "$nd/kubelet.yaml" \
		--kubeconfig "$PKI/kubelet-node$n.kubeconfig" --hostname-override "$name" --node-ip "$(node_ips "$n")" --v=1
	cat >"$nd/kube-proxy.yaml" <<-EOF
	apiVersion: kubeproxy.config.k8s.io/v1alpha1
	kind: KubeProxyConfiguration
	clientConnection: {kubeconfig: "$KCFG"}
	hostnameOverride: $name
	mode: iptables
	clusterCIDR: "$CLUSTER_CIDR"
	bindAddress: "$ip"
	healthzBindAddress: 127.0.0.1:10256
	metricsBindAddress: 127.0.0.1:10249
	conntrack:
	  maxPerCore: 0
	  min: 0
	  tcpEstablishedTimeout: 0s
	  tcpCloseWaitTimeout: 0s
	EOF
	start_bg "$n" "kube-proxy-node$n" kube-proxy --config "$nd/kube-proxy.yaml" --v=1
}
for n in $(seq 1 "$NODES"); do
	log "starting containerd, kubelet and kube-proxy on node$n"
	start_worker "$n"
done
node_registered() { kc get node "$1"; }
for n in $(seq 1 "$NODES"); do
	wait_for 120 "node$n to register" node_registered "$(node_name "$n")"
	# The pod CIDRs that node's CNI config uses (no node IPAM in the
	# controller-manager), the primary family first.
	cidrs=$(node_podcidrs "$n")
	kc patch node "$(node_name "$n")" --type merge \
		-p "{\"spec\":{\"podCIDR\":\"${cidrs%%,*}\",\"podCIDRs\":[\"${cidrs//,/\",\"}\"]}}" >/dev/null
done
nodes_ready() { kc wait --for=condition=Ready node --all --timeout=1s; }
wait_for 180 "nodes to be Ready" nodes_ready
default_sa() { kc -n default get serviceaccount default; }
wait_for 120 "the default service account" default_sa
log "cluster up: $(kc get nodes --no-headers | awk '{print $1"="$2}' | tr '\n' ' ')"

# ---------------------------------------------------------------------------
# what the NPA suite needs beyond the cluster: the CRD, and no SCTP servers
# where the kernel cannot serve SCTP
# ---------------------------------------------------------------------------
if [[ $SUITE == npa ]]; then
	log "installing the ClusterNetworkPolicy CRD ($NPA_VERSION, experimental channel)"
	kc create -f "$NPA_CRD" >/dev/null
	kc wait --for condition=Established --timeout=60s crd/clusternetworkpolicies.policy.networking.k8s.io >/dev/null
	if [[ -n $NO_SCTP ]]; then
		# The base StatefulSets run `agnhost porter` with SERVE_SCTP_PORT_*,
		# which exits when it cannot listen: its pods would never be Ready and
		# the suite's setup would time out. Only SCTP probes (skipped here)
		# talk to those containers, so pods of the suite's namespaces are
		# created without them.
		log "pods of the suite's namespaces are created without their SCTP server containers"
		kc apply -f - >/dev/null <<-'EOF'
		apiVersion: admissionregistration.k8s.io/v1
		kind: MutatingAdmissionPolicy
		metadata:
		  name: nftpolicy-conformance-no-sctp-servers
		spec:
		  matchConstraints:
		    resourceRules:
		    - apiGroups: [""]
		      apiVersions: [v1]
		      operations: [CREATE]
		      resources: [pods]
		    namespaceSelector:
		      matchExpressions:
		      - {key: conformance-house, operator: Exists}
		  variables:
		  - name: names
		    expression: object.spec.containers.map(c, c.name)
		  - name: sctp
		    expression: >-
		      object.spec.containers.filter(c, has(c.env) &&
		      c.env.exists(e, e.name.startsWith("SERVE_SCTP_PORT_"))).map(c, c.name)
		  matchConditions:
		  - name: serves-sctp
		    expression: >-
		      object.spec.containers.exists(c, has(c.env) &&
		      c.env.exists(e, e.name.startsWith("SERVE_SCTP_PORT_")))
		  failurePolicy: Fail
		  reinvocationPolicy: Never
		  # One "remove" per SCTP container, in order; each earlier removal
		  # shifts the next one's index down by one. (A "replace" of the whole
		  # list cannot be written: typed containers do not marshal to JSON.)
		  mutations:
		  - patchType: JSONPatch
		    jsonPatch:
		      expression: >-
		        variables.sctp.map(n, JSONPatch{op: "remove",
		        path: "/spec/containers/" + string(variables.names.indexOf(n) - variables.sctp.indexOf(n))})
		---
		apiVersion: admissionregistration.k8s.io/v1
		kind: MutatingAdmissionPolicyBinding
		metadata:
		  name: nftpolicy-conformance-no-sctp-servers
		spec:
		  policyName: nftpolicy-conformance-no-sctp-servers
		EOF
	fi
fi

# ---------------------------------------------------------------------------
# nftpolicy
# ---------------------------------------------------------------------------
if ((!NO_AGENT)); then
	log "deploying $([[ $SUITE == helm ]] && echo "the chart of $RELEASE_DIR (helm install)" || echo "$AGENT_MANIFEST") (image $AGENT_IMAGE, --mode=$MODE)"
	if [[ -n $IMAGE_BUILD ]]; then
		sed -e "s#^\([[:space:]]*image:[[:space:]]*\)[^[:space:]]*nftpolicy[^[:space:]]*#\1$AGENT_IMAGE#" \
			-e "s#^\([[:space:]]*imagePullPolicy:[[:space:]]*\).*#\1Never#" "$AGENT_MANIFEST" >"$STATE/install.yaml"
		grep -q "image: $AGENT_IMAGE" "$STATE/install.yaml" || die "could not set the image in install.yaml"
	else
		# The release's manifest as a user applies it; --suite npa installs
		# the experimental channel's CRD itself, so the standard one the
		# release carries is left out there.
		release_manifest >"$STATE/install.yaml"
	fi
	sed -i "s#^    mode: [a-z]*\$#    mode: $MODE#" "$STATE/install.yaml"
	node_cni_paths "$STATE/install.yaml"
	# The mode is a setting of the agent's ConfigMap (docs/config.md).
	grep -q "^    mode: $MODE\$" "$STATE/install.yaml" || die "could not set the mode in install.yaml's ConfigMap"
	for a in "${AGENT_ARGS[@]}"; do
		[[ $a == --* && $a != *[\"\#\\]* ]] || die "--agent-arg $a: want --flag or --flag=value (no quotes, # or backslashes)"
		sed -i "s#^\([[:space:]]*\)- --config=/etc/nftpolicy/config.yaml\$#&\n\1- \"$a\"#" "$STATE/install.yaml"
		grep -qF -- "- \"$a\"" "$STATE/install.yaml" || die "could not add $a to the agent's arguments"
	done
	diff -u "$AGENT_MANIFEST" "$STATE/install.yaml" >"$OUT/install.diff" || true
	if [[ $SUITE == helm ]]; then
		helm_install # the chart, not install.yaml
	else
		kc apply --server-side -f "$STATE/install.yaml" >/dev/null
	fi
	if ! kc -n kube-system rollout status ds/nftpolicy --timeout=180s >&2; then
		kc -n kube-system get pods -o wide >&2 || true
		kc -n kube-system describe ds/nftpolicy >&2 || true
		kc -n kube-system logs ds/nftpolicy --tail=50 >&2 || true
		die "the nftpolicy DaemonSet did not become ready"
	fi
	log "nftpolicy ready on $(kc -n kube-system get ds nftpolicy -o jsonpath='{.status.numberReady}') node(s)"
else
	log "--no-agent: no NetworkPolicy enforcer in this cluster"
fi

# ---------------------------------------------------------------------------
# the suite
# ---------------------------------------------------------------------------
SUITE_RC=0
run_e2e() {
	log "running e2e.test: focus '$FOCUS'${SKIP_RE:+ skip '$SKIP_RE'}, $PROCS procs"
	GINKGO_ARGS=(--procs="$PROCS" --timeout=90m --no-color --focus="$FOCUS")
	[[ -n $SKIP_RE ]] && GINKGO_ARGS+=(--skip="$SKIP_RE")
	set +e
	innode 1 ginkgo "${GINKGO_ARGS[@]}" "$BIN/e2e.test" -- \
		--kubeconfig="$KCFG" --provider=local --report-dir="$OUT" \
		--kubectl-path="$BIN/kubectl" --allowed-not-ready-nodes=0 \
		--e2e-output-dir="$OUT/ginkgo" 2>&1 | tee "$OUT/e2e.log" | grep -E --line-buffered \
		'^(Ran [0-9]+ of|FAIL!|SUCCESS!)' >&2
	SUITE_RC=${PIPESTATUS[0]}
	set -e
}

# run_npa: the suite's own entry point (TestConformanceProfiles) as upstream
# documents it: profile ClusterNetworkPolicy, --all-features, a report.
run_npa() {
	local args version
	version=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)
	args=(-test.run '^TestConformanceProfiles$' -test.v -test.timeout 90m
		--kubeconfig="$KCFG" --conformance-profiles="$NPA_PROFILE" --all-features
		--organization=nftpolicy --project=nftpolicy --url=https://github.com/nftpolicy/nftpolicy
		--version="$version" --contact=nftpolicy-maintainers
		--additional-info="hack/conformance.sh --suite npa, --mode=$MODE$( ((NO_AGENT)) && echo ' (no agent)'), --ip-family=$IP_FAMILY, $NODES nodes"
		--report-output="$OUT/report.yaml" --cleanup-base-resources="$( ((KEEP)) && echo false || echo true)")
	[[ -n $FOCUS ]] && args+=(--run-tests="$FOCUS")
	[[ -n $NO_SCTP ]] && args+=(--skip-tests="$NPA_SCTP_TESTS" --no-sctp="$NO_SCTP")
	log "running npa-conformance.test ($NPA_VERSION): profile $NPA_PROFILE, all features${FOCUS:+, tests matching '$FOCUS'}"
	set +e
	# KUBECONFIG too: the suite builds its clientset from the default loading
	# rules, which do not read --kubeconfig.
	(cd "$OUT" && innode 1 env KUBECONFIG="$KCFG" "$BIN/npa-conformance.test" "${args[@]}") 2>&1 | tee "$OUT/npa.log" | grep -E --line-buffered \
		'^=== RUN +TestConformanceProfiles/[^/]+$|^ {4}--- (PASS|FAIL|SKIP): |^(--- FAIL|PASS$|FAIL$|panic:)' >&2
	SUITE_RC=${PIPESTATUS[0]}
	set -e
}

case $SUITE in
npa) run_npa ;;
rollout)
	source "$HERE/rollout.sh"
	run_rollout
	;;
preview)
	source "$HERE/preview.sh"
	run_preview
	;;
uninstall)
	source "$HERE/uninstall.sh"
	run_uninstall
	;;
helm) run_helm ;;
*) run_e2e ;;
esac

# metrics_token: a token that may read the agents' metrics (install.yaml
# serves them over HTTPS to tokens the API server authorizes for /metrics),
# of a ServiceAccount this script makes for it.
metrics_token() {
	kc apply -f - >/dev/null <<-'EOF'
		apiVersion: v1
		kind: ServiceAccount
		metadata: {name: nftpolicy-conformance-metrics, namespace: kube-system}
		---
		apiVersion: rbac.authorization.k8s.io/v1
		kind: ClusterRole
		metadata: {name: nftpolicy-conformance-metrics}
		rules: [{nonResourceURLs: [/metrics], verbs: [get]}]
		---
		apiVersion: rbac.authorization.k8s.io/v1
		kind: ClusterRoleBinding
		metadata: {name: nftpolicy-conformance-metrics}
		roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nftpolicy-conformance-metrics}
		subjects: [{kind: ServiceAccount, name: nftpolicy-conformance-metrics, namespace: kube-system}]
	EOF
	kc -n kube-system create token nftpolicy-conformance-metrics --duration=10m
}

# Evidence: the agent's logs and metrics, and every node's ruleset.
((NO_AGENT)) || MTOKEN=$(metrics_token) || { log "no token to read the agents' metrics"; MTOKEN=; }
for n in $(seq 1 "$NODES"); do
	innode "$n" nft list ruleset >"$OUT/ruleset-node$n.nft" 2>&1 || true
	if ((!NO_AGENT)); then
		pod=$(kc -n kube-system get pods -l app.kubernetes.io/name=nftpolicy \
			--field-selector spec.nodeName="$(node_name "$n")" -o name 2>/dev/null | head -n1)
		[[ -n $pod ]] && kc -n kube-system logs "$pod" >"$OUT/agent-node$n.log" 2>&1 || true
		[[ -n $MTOKEN ]] && innode "$n" curl -sSk --max-time 10 -H "Authorization: Bearer $MTOKEN" \
			"https://$(url_host "$(node_ip "$n")"):9402/metrics" >"$OUT/metrics-node$n.txt" 2>&1 || true
	fi
done

# verify_summary: with --agent-arg=--verify-rate=...: the verdicts runtime
# verification re-decided on all nodes, and its disagreements (must be 0).
verify_summary() {
	[[ " ${AGENT_ARGS[*]} " == *" --verify-rate"* ]] || return 0
	awk '/^nftpolicy_verdicts_verified_total\{/ { v += $NF } /^nftpolicy_verdict_disagreements_total\{/ { d += $NF }
		END { printf "runtime verification: %d kernel verdicts re-decided, %d disagreements\n", v, d }' "$OUT"/metrics-node*.txt
}

summarize_e2e() {
	local ran res
	ran=$(grep -E '^Ran [0-9]+ of [0-9]+ Specs' "$OUT/e2e.log" | tail -n1)
	res=$(grep -E '^(SUCCESS!|FAIL!) -- ' "$OUT/e2e.log" | tail -n1)
	passed=$(sed -n 's/.* \([0-9]*\) Passed.*/\1/p' <<<"$res")
	failed=$(sed -n 's/.* \([0-9]*\) Failed.*/\1/p' <<<"$res")
	skipped=$(sed -n 's/.* \([0-9]*\) Skipped.*/\1/p' <<<"$res")
	{
		echo "commit: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown), finished: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo "mode: $( ((NO_AGENT)) && echo no-agent || echo "$MODE"), ip family: $IP_FAMILY, nodes: $NODES, procs: $PROCS, focus: $FOCUS${SKIP_RE:+, skip: $SKIP_RE}"
		[[ -n $AGENT_IMAGE ]] && echo "agent: $AGENT_IMAGE from $AGENT_MANIFEST${RELEASE_DIR:+ ($(sed -n '1s/^# //p' "$AGENT_MANIFEST" | cut -d: -f1))}"
		echo "${ran:-no ginkgo summary (see $OUT/e2e.log)}"
		echo "${res:-}"
		grep -E '^\s*\[FAIL\]' "$OUT/e2e.log" | sed 's/^\s*//' | sort -u || true
		echo "conformance: ${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
		verify_summary
	} >"$OUT/summary.txt"
	echo "------------------------------------------------------------------"
	cat "$OUT/summary.txt"
	echo "JUnit: $(ls "$OUT"/junit_*.xml 2>/dev/null | tr '\n' ' ')"
	echo "logs: $OUT/e2e.log $OUT/logs/ ($(((SECONDS - T0)))s in all)"
	echo "------------------------------------------------------------------"
}

# summarize_npa: results.tsv (test, PASS/FAIL/SKIPPED, seconds, SCTP probes
# skipped), failures.txt (the probes of failed tests: command, expectation,
# what was seen; repeats of a line counted) and summary.txt from npa.log.
summarize_npa() {
	awk -v OFS='\t' '
		function top(name) { sub(/^TestConformanceProfiles\//, "", name); sub(/\/.*/, "", name); return name }
		/^=== (RUN|CONT|NAME) +TestConformanceProfiles\// { cur = top($3) }
		/ Skipping [A-Za-z0-9]+ \(--skip-tests\/--run-tests\)/ { for (i = 1; i <= NF; i++) if ($i == "Skipping") skip[$(i + 1)] = 1 }
		/SKIPPED SCTP probe/ { sctp[cur]++ }
		/^    --- (PASS|FAIL|SKIP): TestConformanceProfiles\/[^\/ ]+ / {
			t = top($3); r = $2; sub(/:$/, "", r); d = $4; gsub(/[()s]/, "", d)
			if (r == "PASS" && skip[t]) r = "SKIPPED"
			if (r == "SKIP") r = "SKIPPED"
			order[++n] = t; res[t] = r; dur[t] = d
		}
		END { for (i = 1; i <= n; i++) print order[i], res[order[i]], dur[order[i]], sctp[order[i]] + 0 }
	' "$OUT/npa.log" >"$OUT/results.tsv"
	passed=$(awk -F'\t' '$2 == "PASS"' "$OUT/results.tsv" | wc -l)
	failed=$(awk -F'\t' '$2 == "FAIL"' "$OUT/results.tsv" | wc -l)
	skipped=$(awk -F'\t' '$2 == "SKIPPED"' "$OUT/results.tsv" | wc -l)
	# Subtests that failed in the end (a probe may fail a few times and then
	# pass once a policy is in place: those are left out).
	awk '
		NR == FNR {
			if ($1 == "---" && $2 == "FAIL:" && $3 ~ /^TestConformanceProfiles\/[^\/]+\//) {
				st = $3; sub(/^TestConformanceProfiles\//, "", st); bad[st] = 1
			}
			next
		}
		function flush(   i) {
			if (k) print "  " st
			for (i = 1; i <= k; i++) printf "    %s%s\n", line[i], (cnt[line[i]] > 1 ? " (x" cnt[line[i]] ")" : "")
			k = 0; delete cnt
		}
		/^=== (RUN|CONT|NAME) +TestConformanceProfiles\// { flush(); st = $3; sub(/^TestConformanceProfiles\//, "", st); next }
		bad[st] && /FAILED|Expected connection|Error:|Messages:|unable to|error/ {
			l = $0; sub(/^[ \t]*[a-z_]+\.go:[0-9]+: /, "", l); gsub(/^[ \t]+|[ \t]+$/, "", l)
			if (!cnt[l]++) line[++k] = l
		}
		END { flush() }
	' "$OUT/npa.log" "$OUT/npa.log" >"$OUT/failures.txt"
	{
		echo "suite: network-policy-api $NPA_VERSION conformance, profile $NPA_PROFILE (all features)," \
			"mode: $( ((NO_AGENT)) && echo no-agent || echo "$MODE"), ip family: $IP_FAMILY, nodes: $NODES${FOCUS:+, tests matching: $FOCUS}"
		[[ -n $NO_SCTP ]] && echo "SCTP: $NO_SCTP: skipped the tests $NPA_SCTP_TESTS and $(grep -c 'SKIPPED SCTP probe' "$OUT/npa.log") SCTP probes of other tests"
		[[ -s $OUT/report.yaml ]] || echo "no report.yaml: the suite did not finish (see $OUT/npa.log)"
		printf '%-40s %-8s %8s %s\n' TEST RESULT SECONDS SCTP-PROBES-SKIPPED
		awk -F'\t' '{printf "%-40s %-8s %8s %s\n", $1, $2, $3, $4}' "$OUT/results.tsv"
		echo "conformance: $passed passed, $failed failed, $skipped skipped (go test exit $SUITE_RC)"
		verify_summary
	} >"$OUT/summary.txt"
	echo "------------------------------------------------------------------"
	cat "$OUT/summary.txt"
	((failed == 0)) || { echo "failed probes:"; cat "$OUT/failures.txt"; }
	echo "report: $OUT/report.yaml  logs: $OUT/npa.log $OUT/logs/ ($(((SECONDS - T0)))s in all)"
	echo "------------------------------------------------------------------"
}

case $SUITE in npa) summarize_npa ;; rollout) summarize_rollout ;; preview) summarize_preview ;; uninstall) summarize_uninstall ;; helm) summarize_helm ;; *) summarize_e2e ;; esac

if ((KEEP)); then
	log "cluster left up (--keep). kubectl: nsenter -t $(holder_pid 1) -m -n $BIN/kubectl --kubeconfig $KCFG ..."
	log "node shell: ip netns exec $(node_ns 1) bash  |  tear down: bash hack/conformance.sh --down"
fi
if ((NO_AGENT)); then
	# Without an enforcer the suite must fail, and must have run: ginkgo ran
	# specs that passed too, or the NPA suite got through its setup to a report.
	ran_ok=$(( ${passed:-0} > 0 ))
	[[ $SUITE == npa && -s $OUT/report.yaml ]] && ran_ok=1
	if ((SUITE_RC != 0 && ${failed:-0} > 0 && ran_ok)); then
		log "--no-agent: the suite failed without an enforcer, as it must (${failed} failed, ${passed:-0} passed)"
		exit 0
	fi
	log "--no-agent: expected failures without an enforcer, got rc=$SUITE_RC passed=${passed:-0} failed=${failed:-0}"
	exit 1
fi
if [[ $SUITE == npa ]] && ((SUITE_RC == 0)) && [[ ! -s $OUT/report.yaml ]]; then
	log "the suite exited 0 but wrote no report"
	exit 1
fi
exit "$SUITE_RC"
