package compile

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// Names of the table's chains, sets and maps. Every name the renderer
// gives an object is made here. Nothing reads a name back: the renderer
// records on each object what the tracker needs to know about it (a
// chain's place in the order and the shared sets its rules name, a set's
// owning chain), so the format below can change without anything else
// knowing.

// Names of the static objects in the table.
const (
	TableName        = "nftpolicy"
	ChainForward     = "forward"
	ChainInput       = "input"
	ChainEgress      = "egress"
	ChainIngress     = "ingress"
	ChainQueue       = "userspace"
	MapIngressPodsV4 = "ingress-pods-v4"
	MapIngressPodsV6 = "ingress-pods-v6"
	MapEgressPodsV4  = "egress-pods-v4"
	MapEgressPodsV6  = "egress-pods-v6"
	SetSelfV4        = "self-v4"
	SetSelfV6        = "self-v6"
	// ChainPrerouting is the base chain of the source check
	// (render_source.go).
	ChainPrerouting = "prerouting"
	// ChainTunnel drops encapsulated packets that pods send to nodes, and
	// those that come to this node from anything but a node
	// (render_source.go); SetNodeAddrsV4 and SetNodeAddrsV6 hold the
	// addresses that may send encapsulation to this node.
	ChainTunnel    = "tunnel"
	SetNodeAddrsV4 = "node-addrs-v4"
	SetNodeAddrsV6 = "node-addrs-v6"
)

// Names of the per-source share objects (render_share.go).
const (
	// ChainQueueHeld bounds, per source address, the new connections of
	// unknown pod addresses sent to the queue (held there until the pod is
	// programmed).
	ChainQueueHeld = "userspace-held"
	// ChainQueueShare bounds, per source address, queue mode's new
	// connections sent to the queue (decided at once).
	ChainQueueShare = "userspace-share"
	// ChainDenyLogLimits bounds the deny log's messages per source address
	// and overall; every deny chain jumps to it before logging.
	ChainDenyLogLimits = "denylog-limits"
	// ChainStagedLog copies the first packets of staged subjects'
	// connections to the staged log, within a per-source budget
	// (render_staged.go).
	ChainStagedLog = "staged-log"
)

// Names of the DNS learning objects (render_fqdn.go).
const (
	// ChainDNS queues the captured DNS queries and replies (its name
	// predates the queries; it is kept so that agents of both versions
	// hand the queue over to each other).
	ChainDNS    = "dns-replies"
	ChainOutput = "output"
	// ChainDNSQueriesForward and ChainDNSQueriesInput capture the pods'
	// DNS queries after the policy's chains accepted them.
	ChainDNSQueriesForward = "dns-queries-forward"
	ChainDNSQueriesInput   = "dns-queries-input"
	// ChainDNSQueryShare and ChainDNSReplyShare bound each local pod's
	// share of the DNS queue before ChainDNS: its queries by their source
	// address, the replies to it by their destination (render_share.go).
	ChainDNSQueryShare = "dns-query-share"
	ChainDNSReplyShare = "dns-reply-share"
	// SetFQDNPodsV4 and SetFQDNPodsV6 hold the local pods whose DNS replies
	// are learned.
	SetFQDNPodsV4 = "fqdn-pods-v4"
	SetFQDNPodsV6 = "fqdn-pods-v6"
)

// Names of the unknown-pod objects (render_unknown.go): every address the
// program knows, and the cluster's pod ranges.
const (
	SetKnownPodsV4 = "known-pods-v4"
	SetKnownPodsV6 = "known-pods-v6"
	SetPodCIDRsV4  = "pod-cidrs-v4"
	SetPodCIDRsV6  = "pod-cidrs-v6"
)

// Prefixes of the per-source meters (render_share.go): each meter is
// <prefix>-sources-v4/-v6 or <prefix>-destinations-v4/-v6.
const (
	meterHeld     = "held"
	meterQueue    = "queue"
	meterDNSQuery = "dns-query"
	meterDNSReply = "dns-reply"
	meterDenyLog  = "denylog"
	meterStaged   = "staged"
	meterVerify   = "verify"
)

// nameFormat is what the generated names (of policies, combinations,
// peers, nodes and denials) are made of.
type nameFormat struct {
	// hashLen is the length of a name's hash.
	hashLen int
	// peers and nodes start the shared peer and node set names; isolated
	// is the word of NetworkPolicy combination chains; deny starts the
	// deny log's chains.
	peers, nodes, isolated, deny string
}

// names is the format in use. Tests swap it (names_test.go) to show that
// no other code knows it.
var names = nameFormat{hashLen: 8, peers: "peers-", nodes: "nodes-", isolated: "isolated", deny: "deny-"}

// hashText is the lowercase base32 of a string's SHA-256.
func hashText(s string) string {
	h := sha256.Sum256([]byte(s))
	return strings.ToLower(base32.StdEncoding.EncodeToString(h[:]))
}

// shortHash is the 8-character hash of a deny log ID, which readers of the
// log see (not a name: the format does not change it).
func shortHash(s string) string { return hashText(s)[:8] }

// nameHash is the hash part of generated names.
func nameHash(s string) string { return hashText(s)[:names.hashLen] }

func famSuffix(v4 bool) string {
	if v4 {
		return "-v4"
	}
	return "-v6"
}

// readableRef is a policy's readable part of object names, its key or
// name, shortened with a hash when long.
func readableRef(s string) string {
	if len(s) > maxPolicyRefChars {
		return s[:maxPolicyRefChars-1-names.hashLen] + "_" + nameHash(s)
	}
	return s
}

// PolicyChainName is the chain holding a policy's rules in one direction.
func PolicyChainName(p *Policy, d Direction) string { return d.String() + "-" + readableRef(p.Key) }

// IsolationChainName is the chain for the pods isolated by exactly this
// combination of policies in one direction.
func IsolationChainName(p *Program, d Direction, ids []PolicyID) string {
	return d.String() + "-" + names.isolated + "-" + nameHash(comboKey(p, ids))
}

func tierWord(t Tier) string { return strings.ToLower(t.String()) }

// ClusterPolicyChainName is the chain holding a ClusterNetworkPolicy's rules
// in one direction: "admin-<name>-egress", "baseline-<name>-ingress".
func ClusterPolicyChainName(p *ClusterPolicy, d Direction) string {
	return tierWord(p.Tier) + "-" + readableRef(p.Name) + "-" + d.String()
}

// ClusterComboChainName is the chain for the pods that exactly this list of
// ClusterNetworkPolicies of one tier applies to, in one direction.
func ClusterComboChainName(p *Program, t Tier, d Direction, ids []ClusterPolicyID) string {
	return d.String() + "-" + tierWord(t) + "-" + nameHash(clusterComboKey(p, ids))
}

// tierSkipSetName is the set of one family of the addresses a
// ClusterNetworkPolicy combination chain's rules name.
func tierSkipSetName(combo string, v4 bool) string { return combo + famSuffix(v4) }

// DenyChainName is the chain that logs and drops one denial's packets.
func DenyChainName(id string) string { return names.deny + id }

// PeerSetName is the set holding the addresses of one family of a shared
// pod-selecting peer.
func PeerSetName(s *Selector, v4 bool) string { return names.peers + nameHash(s.Key) + famSuffix(v4) }

// NodeSetName is the set holding the addresses of one family of a nodes peer.
func NodeSetName(s *NodeSet, v4 bool) string { return names.nodes + nameHash(s.Key) + famSuffix(v4) }

// ruleSetBase starts the names of the sets of one rule of a rule chain.
func ruleSetBase(chain string, rule int) string { return chain + "-" + itoa(rule) }

// Sets of one rule (named after ruleSetBase): its address ranges, its
// ports, its named ports resolved per pod.
func ruleCIDRsSetName(base string, v4 bool) string { return base + "-cidrs" + famSuffix(v4) }
func rulePortsSetName(base string) string          { return base + "-ports" }
func ruleNamedSetName(base string, v4 bool) string { return base + "-named" + famSuffix(v4) }

// FQDNSetName is the set a ClusterNetworkPolicy egress rule's domainNames
// peers match in, per family:
// "<policy chain>-<rule index>-fqdn-<names hash>-v4" (fqdnSetName).
func FQDNSetName(cp *ClusterPolicy, ruleIndex int, v4 bool) string {
	return fqdnSetName(ruleSetBase(ClusterPolicyChainName(cp, Egress), ruleIndex), cp.Egress[ruleIndex].Domains, v4)
}

// fqdnSetName names a rule's learned set after the rule (base) and a short
// hash of its patterns (sorted and deduplicated by clusterDomainPeer). The
// set's elements were learned for exactly those names: when the names
// change, the set is another one, created empty, and the syncs delete the
// old one with everything it learned, so a name removed from a rule stops
// admitting new connections as soon as the change is programmed, not when
// its answers' TTLs end. The learner writes what is still valid for the
// new names into the new set.
func fqdnSetName(base string, domains []DomainPattern, v4 bool) string {
	return base + "-fqdn-" + nameHash(domainsKey(domains)) + famSuffix(v4)
}

// tierChainName is the static chain that runs one tier of a direction
// (tier 0: NetworkPolicy, whose chain runs the Baseline tier too): the
// Admin tier's is the direction's entry.
func tierChainName(t Tier, d Direction) string {
	switch t {
	case TierAdmin:
		if d == Egress {
			return ChainEgress
		}
		return ChainIngress
	}
	return d.String() + "-networkpolicy"
}

// tierMapName is a map of one direction's dispatch: pod IP -> the chain
// deciding its new connections in a tier (0: NetworkPolicy, whose maps
// keep their names).
func tierMapName(t Tier, d Direction, v4 bool) string {
	switch t {
	case TierAdmin:
		return d.String() + "-admin-pods" + famSuffix(v4)
	case TierBaseline:
		return d.String() + "-baseline-pods" + famSuffix(v4)
	}
	return d.String() + "-pods" + famSuffix(v4)
}

// selfSetName holds the local pods that policies select, twice.
func selfSetName(v4 bool) string {
	if v4 {
		return SetSelfV4
	}
	return SetSelfV6
}

// clusterEgressSetName holds the local pods with ClusterNetworkPolicy
// egress rules: only their traffic to the node itself is filtered (input
// hook).
func clusterEgressSetName(v4 bool) string { return "cluster-egress-pods" + famSuffix(v4) }

// nodeIPsSetName holds this node's addresses.
func nodeIPsSetName(v4 bool) string { return "node-ips" + famSuffix(v4) }

// stagedSubjectsSetName holds the local pods a staged policy selects in
// one direction (render_staged.go).
func stagedSubjectsSetName(d Direction, v4 bool) string {
	return "staged-" + d.String() + "-pods" + famSuffix(v4)
}

// meterSetName is a per-source (or per-destination) meter of one family.
func meterSetName(prefix string, bySource, v4 bool) string {
	if bySource {
		return prefix + "-sources" + famSuffix(v4)
	}
	return prefix + "-destinations" + famSuffix(v4)
}

func fqdnPodsSet(v4 bool) string {
	if v4 {
		return SetFQDNPodsV4
	}
	return SetFQDNPodsV6
}

func nodeAddrsSet(v4 bool) string {
	if v4 {
		return SetNodeAddrsV4
	}
	return SetNodeAddrsV6
}

func knownPodsSet(v4 bool) string {
	if v4 {
		return SetKnownPodsV4
	}
	return SetKnownPodsV6
}

func podCIDRsSet(v4 bool) string {
	if v4 {
		return SetPodCIDRsV4
	}
	return SetPodCIDRsV6
}
