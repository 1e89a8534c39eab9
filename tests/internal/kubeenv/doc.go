// Package kubeenv starts a real, throw-away Kubernetes control plane for
// tests: an etcd and a kube-apiserver (v1.37.2) listening on 127.0.0.1, plus
// the matching kubectl. There are no nodes, no kubelet and no
// controller-manager, so Pods stay Pending, namespaces are never finalised
// and no "default" ServiceAccount is created automatically (use
// Env.CreateNamespace, which creates one). Everything served by the
// apiserver itself is real: validation, defaulting, admission, RBAC
// (--authorization-mode=Node,RBAC), ServiceAccount tokens (TokenRequest),
// watches and kubectl.
//
// The binaries are not part of the repository. They are built once, from the
// Go module proxy, by hack/tools.sh into ToolsDir():
// $NFTPOLICY_TOOLS, or /var/cache/nftpolicy/tools by default.
//
//	bash hack/tools.sh            # first run: 5-17 minutes on 2 cores
//	NFTPOLICY_REQUIRE_TOOLS=1 go test ./tests/...
//
// When the binaries are missing, Start skips the test with a message naming
// hack/tools.sh, unless NFTPOLICY_REQUIRE_TOOLS is set to a non-empty value,
// in which case the test fails instead (use that in CI so that missing tools
// are never silently skipped).
//
// Typical use:
//
//	func TestSomething(t *testing.T) {
//		env := kubeenv.Start(t)
//		env.CreateNamespace(t, "demo")
//		_, err := env.Client.NetworkingV1().NetworkPolicies("demo").Create(ctx, np, metav1.CreateOptions{})
//		out, err := env.Kubectl(t, "get", "networkpolicies", "-A")
//		saKubeconfig := env.ServiceAccountKubeconfig(t, "demo", "agent")
//		...
//	}
//
// Outage tests stop and restart the processes on their addresses:
// StopAPIServer and StartAPIServer, RestartEtcd (its data kept), and
// CompactEtcd, after which reads at an older resourceVersion that reach
// etcd are answered 410 Gone.
//
// Each Start uses its own temporary directory (t.TempDir) and free loopback
// ports, so independent tests may run in parallel. Start takes a few seconds;
// the processes are stopped (SIGTERM, then SIGKILL) by t.Cleanup.
package kubeenv
