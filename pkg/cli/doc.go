// Package cli holds the commands that run on an operator's machine against
// the API server (status, wait, preview) and what every command shares: the
// exit statuses, flag parsing, and kubectl's connection flags
// (k8s.io/cli-runtime's ConfigFlags).
//
// Both binaries use it: cmd/kubectl-nftpolicy, the kubectl plugin, and
// cmd/nftpolicy, the agent's binary. The plugin must build for Linux, macOS
// and Windows and stay small, so this package must not import the kernel
// side (netlink, nftables, knftables, conntrack, NFQUEUE, NFLOG) nor the
// packages that do (pkg/compile and everything above it);
// cmd/kubectl-nftpolicy's tests fail when it does.
package cli
