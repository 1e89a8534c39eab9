#!/usr/bin/env bash
# hack/deps.sh installs the Debian packages the tests and the demo use, when
# they are missing: nftables, iptables (nft backend), conntrack, iproute2.
# Idempotent; needs root on a fresh machine.
set -euo pipefail
need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v conntrack >/dev/null 2>&1 || need+=(conntrack)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v flock >/dev/null 2>&1 || need+=(util-linux)
if ((${#need[@]})); then
	echo "[deps.sh] installing: ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "[deps.sh] $(nft --version)" >&2
