// Command nftpolicy is the one binary: it wires the packages into the node
// agent and the offline tools over the same policy model.
//
//	nftpolicy agent    run the node agent (DaemonSet)
//	nftpolicy eval     decide a scenario's probes with the userspace evaluator
//	nftpolicy compile  print the ruleset the agent would install on a node
//	nftpolicy explain  say why a connection is allowed or denied (live, offline, or from the kernel ruleset)
//
// Installed as kubectl-nftpolicy on PATH, it is also a kubectl plugin:
// `kubectl nftpolicy explain NS/POD NS/POD`.
package main
