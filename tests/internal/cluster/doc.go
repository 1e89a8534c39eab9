// Package cluster is an end-to-end harness for the nftpolicy agent: a real
// control plane (tests/internal/kubeenv: etcd + kube-apiserver), nodes and
// pods made of network namespaces (tests/internal/netlab), and one real
// `nftpolicy agent` process per node, started inside the node's namespace
// and authenticated as the kube-system/nftpolicy ServiceAccount with the
// RBAC of install.yaml.
//
// The harness plays kubelet: it creates the Node objects (InternalIP = the
// node's underlay address), Namespaces and Pods (spec.nodeName, container
// ports, then status Running with podIP/podIPs), and the matching netlab pods,
// whose servers answer on every container port. Policies are created,
// updated and deleted through the API like a user would.
//
// The API server listens on 127.0.0.1 of the caller's namespace, which a
// process in a node namespace cannot reach; every node gets a small TCP relay
// listening on 127.0.0.1:6443 inside the node namespace (its socket is
// created there), which forwards to the API server; Agent.HoldAPI cuts it to
// simulate an unreachable API. The agents serve /metrics on 127.0.0.1:9402
// and /healthz, /readyz on 127.0.0.1:9403 of their node namespace, queried
// with sockets created inside it. Nothing is changed in the caller's
// namespace. Agent logs go to one file per node (every start appends) whose
// tail is printed when the test fails.
//
// ServeExec adds the kubelet's exec endpoint for the agents' pods, so that
// pods/exec through the API server (kubectl nftpolicy preview) runs
// commands in the node's namespace.
//
// WaitProgrammed waits, without sleeping a fixed time, until every running
// agent has committed a sync compiled from the API's current objects: it
// compares each agent's nftpolicy_last_synced_inputs_fingerprint with
// controller.InputsFingerprint of the Pods, Namespaces, NetworkPolicies,
// Nodes and ClusterNetworkPolicies it lists from the API.
//
// Verdicts observed on real packets (ProbeAll) are compared with the
// userspace evaluator's cluster-wide verdicts on the same API objects
// (compile.Build + evaluate.Evaluate), the answer `nftpolicy eval` gives.
//
// Config.Enforcer runs kube-network-policies (hack/compare.sh builds it)
// instead of nftpolicy as every node's agent, started the same way: it has
// no --kubeconfig, so it runs in a mount namespace of its own whose /run is
// a private tmpfs holding the ServiceAccount token and CA at the in-cluster
// path, with KUBERNETES_SERVICE_HOST/PORT pointing at the node's relay; it
// is stopped by its PID, and its table lives in the node namespace. Its
// WaitProgrammed infers "programmed" from its podips-v4/-v6 sets (they hold
// the node's pods some NetworkPolicy selects) and a short settle: it
// exposes nothing else that tells which API objects it has seen.
//
// Start needs root, ip, nft and the binaries of hack/tools.sh; it skips (or
// fails, with NFTPOLICY_REQUIRE_TOOLS set) through testenv.Require, as every
// suite does. The agent binary is
// $NFTPOLICY_BIN, or built once per process with `go build`. Programs that
// are not tests (the demo) pass a ProgramTB.
package cluster
