// Package bootcni closes the boot window: after a reboot the kernel has no
// table inet nftpolicy, the kubelet restarts the node's pods, and they
// would send and receive before the agent's first sync installs anything.
//
// It is a chained CNI plugin (the last of the node's CNI configuration
// list, installed by the agent's DaemonSet). Its ADD returns only once the
// pod's addresses are held in the kernel: when the node's table does not
// hold the agent's ruleset yet, the plugin adds a fail-closed hold to that
// table (sets of held addresses and base chains that drop their traffic).
// The agent's first full sync replaces the table's content in one
// transaction, so the hold ends exactly when enforcement begins. When the
// agent's ruleset is there, the plugin changes nothing: the agent's own
// unknown-pod path covers a new pod.
//
// The plugin talks to the node's kernel only, never to the API server, so
// pod start-up does not depend on the control plane. It imports nothing
// of the module but compile's names, and writes with google/nftables
// (the node needs no nft binary).
//
// Install and Remove edit the node's CNI configuration and plugin
// directory (the DaemonSet's init container, `nftpolicy cleanup`).
package bootcni
