// Package scenariogen generates random scenarios (docs/scenario-format.md)
// for differential testing: the same seed always gives the same scenario,
// byte for byte once marshalled.
//
// A scenario has two nodes, two or three namespaces with varied labels (some
// lacking a key others have), at most eight labelled pods on explicit nodes
// (IPv4 only, or dual-stack with some IPv6-only pods), whose container ports
// reuse names with different numbers and protocols from pod to pod, and one
// to five policies drawing on every construct of networking.k8s.io/v1: pod
// and namespace selectors with matchLabels and all four matchExpressions
// operators (both selectors in one peer too), ipBlock with except over pod
// and external ranges of both families, numbered, named and ranged ports of
// TCP, UDP and SCTP, protocol-only ports, all policyTypes combinations
// including omitted (and rules of a direction policyTypes leaves out),
// empty rules and absent peers and ports. An empty list and an absent one
// marshal alike (omitempty) and mean the same; only absence is generated.
//
// Probes cover every ordered pair of distinct pods, some pairs twice (TCP
// and UDP), traffic to and from external addresses, and IPv6 between
// dual-stack pods. Probes use only TCP and UDP: the test kernels lack SCTP
// sockets.
//
// Half of the seeds (ClusterFraction) also get one to four
// ClusterNetworkPolicies, drawn from a separate random stream so that the
// rest of the scenario, and every scenario of a seed that draws none, is
// byte for byte what the seed gave before they existed: both tiers,
// priorities with ties, every action, namespaces and pods subjects and peers,
// nodes peers, networks peers (0.0.0.0/0 and ::/0 among them), tcp, udp and
// sctp entries with a port, a range or no port, destinationNamedPort (never
// next to networks or nodes peers, which the API forbids), absent protocols,
// named and unnamed rules, v1beta1 and v1alpha2. Most of those seeds
// (NodeFraction) list both nodes with labels and addresses (192.168.1.i,
// fd00:192:168:1::i when dual-stack) and add probes from pods to their own
// and the other node and from nodes to pods.
//
// A share of the seeds (StagedFraction), drawn from a stream of their own
// too, annotate some NetworkPolicies, ClusterNetworkPolicies and
// namespaces with nftpolicy.io/staged, mostly "true" (staged: not
// enforced) and sometimes a value that stages nothing.
//
// Every scenario passes scenario.Parse (tested over many seeds).
package scenariogen
