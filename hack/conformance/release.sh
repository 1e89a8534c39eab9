# shellcheck shell=bash
# hack/conformance/release.sh: how hack/conformance.sh deploys a release
# (the default; --image-build deploys hack/image.sh's image instead). Sourced
# by it; uses its ROOT, STATE, LOGS, RELEASE_DIR, SUITE, log, die, innode.
#
# A release directory (make release: _output/release/<version>/) is used as
# an operator would: its OCI image index (linux/amd64 and linux/arm64) is
# imported into every node's containerd with `ctr images import
# --all-platforms` (no registry), and its install.yaml, whose DaemonSet names
# the image by the index's digest, is applied with `kubectl apply
# --server-side`. Only the ConfigMap's mode and --agent-arg flags may be
# changed in the copy applied (install.diff shows it).

NODE_CNI_DIR=/run/nftpc-cni

# release_prepare: checks the release directory (building it with
# hack/release.sh when it is the default one and missing) and sets
# AGENT_MANIFEST, AGENT_IMAGE (repo:tag@digest) and RELEASE_IMPORTS (the
# image archives every node imports, with the image each holds).
release_prepare() {
	local version
	version=$(tr -d '[:space:]' <"$ROOT/VERSION")
	if [[ -z $RELEASE_DIR ]]; then
		RELEASE_DIR=$ROOT/_output/release/$version
		release_build "$RELEASE_DIR" "$version"
	fi
	# Absolute: the nodes' processes run in their own mount namespaces.
	RELEASE_DIR=$(cd "$RELEASE_DIR" && pwd) || die "no release directory $RELEASE_DIR"
	AGENT_IMAGE=$(release_check "$RELEASE_DIR") || exit 1
	AGENT_MANIFEST=$RELEASE_DIR/install.yaml
	RELEASE_IMPORTS+=("$RELEASE_DIR/nftpolicy-image.oci.tar=$AGENT_IMAGE")
	log "release $RELEASE_DIR: $(sed -n '1s/^# //p' "$AGENT_MANIFEST" | cut -d: -f1) (HEAD is $(git -C "$ROOT" rev-parse --short HEAD))"
	# A release is built from a commit: one of another commit does not test
	# this tree (make release, or remove the directory to have it rebuilt).
	grep -q "(commit $(git -C "$ROOT" rev-parse HEAD))" <(head -n1 "$AGENT_MANIFEST") ||
		log "WARNING: $RELEASE_DIR was not built from HEAD: this run tests that release, not this tree"
}

# release_build DIR VERSION: make release into DIR (as VERSION) unless DIR
# holds one (--no-build is about the cluster's tools: this builds anyway).
release_build() {
	[[ -f $1/SHA256SUMS ]] && return 0
	log "no release in $1: hack/release.sh (version $2)"
	(cd "$ROOT" && RELEASE_OUT=$1 RELEASE_VERSION=$2 bash hack/release.sh) >&2 || die "hack/release.sh failed"
}

# release_check DIR: the release's files are there and check against
# SHA256SUMS, and install.yaml pins the digest of the image archive's
# index; prints that image (repo:tag@digest).
release_check() {
	local f image digest
	for f in SHA256SUMS install.yaml cleanup.yaml nftpolicy-image.oci.tar; do
		[[ -f $1/$f ]] || die "$1/$f is missing: make release (or --release DIR, or --image-build)"
	done
	(cd "$1" && sha256sum --quiet -c SHA256SUMS) >&2 || die "$1: SHA256SUMS does not check"
	image=$(awk '$1 == "image:" && $2 ~ /@sha256:/ { print $2; exit }' "$1/install.yaml")
	[[ -n $image ]] || die "$1/install.yaml names no image by digest"
	digest=$(tar -xOf "$1/nftpolicy-image.oci.tar" index.json |
		python3 -c 'import json, sys; print(json.load(sys.stdin)["manifests"][0]["digest"])') ||
		die "$1/nftpolicy-image.oci.tar has no readable index.json"
	[[ ${image##*@} == "$digest" ]] || die "$1/install.yaml pins ${image##*@} but the image archive's index is $digest"
	echo "$image"
}

# digest_ref IMAGE: repo@digest of repo:tag@digest, the reference the
# kubelet's lookup of IMAGE comes down to (the tag is ignored).
digest_ref() {
	local repo=${1%@*}
	[[ ${repo##*/} == *:* ]] && repo=${repo%:*}
	echo "$repo@${1##*@}"
}

# release_manifest: the release's install.yaml as applied (stdout); for
# --suite npa without the ClusterNetworkPolicy CRD (the suite installs the
# experimental channel's), keeping nftpolicy's own NodeEnforcement CRD.
release_manifest() {
	if [[ $SUITE != npa ]]; then
		cat "$AGENT_MANIFEST"
		return
	fi
	awk 'function flush() { if (doc != "" && !(doc ~ /\nkind: CustomResourceDefinition\n/ && doc ~ /\n  name: clusternetworkpolicies\.policy\.networking\.k8s\.io\n/)) printf "%s", doc; doc = "" }
		/^---$/ { flush(); doc = "---\n"; next }
		{ doc = doc $0 "\n" }
		END { flush() }' "$AGENT_MANIFEST"
}

# release_import N: every archive of RELEASE_IMPORTS into node N's
# containerd (all platforms), each image also named by its digest: the
# import names it only by the archive's repo:tag, and the kubelet asks for
# repo@digest.
release_import() {
	local n=$1 ctr=(innode "$1" ctr -a /run/containerd/containerd.sock -n k8s.io) imp oci image ref name names
	for imp in "${RELEASE_IMPORTS[@]}"; do
		oci=${imp%%=*} image=${imp#*=}
		ref=$(digest_ref "$image")
		"${ctr[@]}" images import --all-platforms "$oci" >/dev/null 2>>"$LOGS/ctr-node$n.log" ||
			die "importing $oci on node$n failed (see $LOGS/ctr-node$n.log)"
		name=${image%@*}
		# The list first: grep -q would stop reading, and pipefail report
		# ctr's SIGPIPE.
		names=$("${ctr[@]}" images ls -q 2>>"$LOGS/ctr-node$n.log") || die "node$n: ctr images ls failed"
		grep -qxF "$name" <<<"$names" || die "node$n: $oci did not import as $name"
		if ! grep -qxF "$ref" <<<"$names"; then
			echo "node$n: naming $name $ref" >>"$LOGS/ctr-node$n.log"
			"${ctr[@]}" images tag --force "$name" "$ref" >/dev/null 2>>"$LOGS/ctr-node$n.log" ||
				die "node$n: could not name the image $ref"
		fi
	done
	"${ctr[@]}" images ls 2>/dev/null | grep -F "${image%%:*}" >>"$LOGS/ctr-node$n.log" || true
}

# node_cni_paths FILE: the CNI hostPaths of a manifest (install.yaml's
# boot plugin, cleanup.yaml's removal of it) pointed at each node's own CNI
# directories (holder.sh binds /run/nftpc-cni there), never the machine's.
node_cni_paths() {
	sed -i -e "s#^\([[:space:]]*path:[[:space:]]*\)/opt/cni/bin\$#\1$NODE_CNI_DIR/bin#" \
		-e "s#^\([[:space:]]*path:[[:space:]]*\)/etc/cni/net.d\$#\1$NODE_CNI_DIR/net.d#" "$1"
	# (A release older than the boot plugin mounts neither.)
	! grep -qE "path: (/opt/cni/bin|/etc/cni/net.d)\$" "$1" || die "$1 still mounts the machine's CNI directories"
}
