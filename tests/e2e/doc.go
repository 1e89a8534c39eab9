// Package e2e holds nftpolicy's end-to-end tests and scenario runner: a real
// kube-apiserver, two nodes made of network namespaces, one real
// `nftpolicy agent` per node (tests/internal/cluster), and real packets.
//
// The tests (root and the tools of hack/tools.sh; they skip otherwise, or
// fail with NFTPOLICY_REQUIRE_TOOLS set):
//
//   - TestConformance runs the 48 upstream e2e NetworkPolicy cases
//     (compiletest.NetpolCases, listed in docs/netpol-cases.md; the truth
//     tables pkg/evaluate's tests read too, here on the full
//     x,y,z x a,b,c grid) in hybrid and in
//     queue mode, on one cluster per mode whose 9 pods are spread over both
//     nodes. Policies are created, updated and deleted, and namespaces and
//     pods relabelled, through the API; each state is checked on every
//     ordered pair of pods against the truth table and against the
//     evaluator, after WaitProgrammed. It also measures enforcement delay:
//     from the API request to the first probe (started every 5 ms) that
//     observes the new verdict, for every create, update, relabel and delete
//     that flips a verdict.
//   - TestRunScenario and TestRunScenarioClusterPolicies run scenarios of
//     testdata/ (NetworkPolicies only; ClusterNetworkPolicies of both tiers
//     with `nodes` and `networks` peers and probes to and from nodes) with
//     RunScenario and with hack/run-scenario.sh, and compare every probe with
//     `nftpolicy eval`; TestRunScenarioDomainNames, TestRunScenarioStaged
//     and TestRunScenarioDualStack do the same for domainNames, staged
//     policies, and IPv6 (the kernel suite's dualstack.yaml: probes per
//     family, an AAAA answer resolved over IPv6, a node's IPv6 address).
//     tests/agent's DNS learning and revocation tests run both families.
//
// SCTP has no socket support in the test kernel (no CONFIG_IP_SCTP), so an
// SCTP probe is an INIT chunk sent from a raw socket and looked for with a
// raw socket in the server's namespace (sctp.go).
//
// RunScenario is the runner behind hack/run-scenario.sh (cmd/runscenario).
// The package is test infrastructure; the product must not import it.
package e2e
