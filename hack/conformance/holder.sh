#!/usr/bin/env bash
# hack/conformance/holder.sh NODEDIR SYSCTLDIR CGROUPS_FILE
#
# The "holder" of one conformance node: hack/conformance.sh starts it with
# `ip netns exec <node netns> bash holder.sh ...`, so it runs in the node's
# network namespace and in a mount namespace of its own (a slave of the
# machine's). It prepares that mount namespace, then sleeps: every component
# of the node (containerd, kubelet, kube-proxy, the control plane) is started
# with `nsenter -t <holder pid> -m -n`, so they all share these mounts, and
# kubelet's volume mounts are visible to containerd and runc. Nothing here is
# visible outside the node; it all goes away with the last process.
#
#  - /sys is the node's own sysfs (ip netns exec remounted it), which hides the
#    machine's cgroup hierarchies: mount the same ones again (CGROUPS_FILE has
#    "mountpoint fstype options" lines taken from the machine's mount table).
#  - /run, /var/lib and /var/log are the node's own (under NODEDIR): containerd
#    and kubelet use their default paths without touching the machine's.
#  - /etc/hosts and /etc/resolv.conf are the node's own.
#  - The /proc/sys files that kubelet would rewrite for the whole machine
#    (vm.overcommit_memory, vm.panic_on_oom, kernel.panic, kernel.panic_on_oops,
#    kernel.keys.root_maxkeys, kernel.keys.root_maxbytes) are shadowed by
#    files of SYSCTLDIR that already hold the values kubelet wants.
set -euo pipefail
NODEDIR=$1 SYSCTLDIR=$2 CGROUPS=$3

mount --make-rslave /

mount -t tmpfs -o mode=755,nosuid,nodev,noexec nftpc-cgroup /sys/fs/cgroup
while read -r mp fstype opts; do
	[[ -n $mp ]] || continue
	mkdir -p "$mp"
	mount -t "$fstype" -o "$opts" "$fstype" "$mp"
done <"$CGROUPS"

mkdir -p "$NODEDIR/var-lib" "$NODEDIR/var-log"
mount -t tmpfs -o mode=755,nosuid,nodev nftpc-run /run
mkdir -p /run/lock
mount --bind "$NODEDIR/var-lib" /var/lib
mount --bind "$NODEDIR/var-log" /var/log
mount --bind "$NODEDIR/hosts" /etc/hosts
mount --bind "$NODEDIR/resolv.conf" /etc/resolv.conf
# The node's CNI directories where install.yaml's hostPaths (rewritten by
# hack/conformance.sh) find them: the boot plugin is installed and chained
# into this node's own configuration, never the machine's /opt/cni or
# /etc/cni.
mkdir -p "$NODEDIR/cni" "$NODEDIR/cni-bin" /run/nftpc-cni/net.d /run/nftpc-cni/bin
mount --bind "$NODEDIR/cni" /run/nftpc-cni/net.d
mount --bind "$NODEDIR/cni-bin" /run/nftpc-cni/bin

for f in "$SYSCTLDIR"/*; do
	p=/proc/sys/$(basename "$f" | tr . /)
	[[ -e $p ]] && mount --bind "$f" "$p"
done

touch "$NODEDIR/holder.ready"
exec sleep infinity
