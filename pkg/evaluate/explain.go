package evaluate

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Explanations answer "why can't A reach B?" over the same program Evaluate
// reads: the verdict per direction with the deciding policy and rule, and
// for a denied direction the nearest misses, the rules that would have
// allowed the connection but for one condition. This is not the hot path:
// it allocates freely and never touches Evaluate.

// Condition names what a nearly matching rule failed on.
type Condition string

// The conditions a nearest miss can name.
const (
	// CondPort: the peer matched; the rule allows other ports of the protocol.
	CondPort Condition = "port"
	// CondProtocol: the peer matched; the rule allows the port (or any port)
	// only with another protocol.
	CondProtocol Condition = "protocol"
	// CondPodLabel: the remote pod lacks (or has) a label the peer's pod
	// selector requires (or excludes).
	CondPodLabel Condition = "podLabel"
	// CondNamespaceLabel: the remote pod's namespace lacks (or has) a label
	// the peer's namespace selector requires (or excludes).
	CondNamespaceLabel Condition = "namespaceLabel"
	// CondCIDR: the remote address is outside the peer's CIDRs.
	CondCIDR Condition = "cidr"
	// CondCIDRExcept: the remote address is inside the peer's CIDR but in
	// one of its except ranges.
	CondCIDRExcept Condition = "cidrExcept"
	// CondNode: the remote address is not an address of the nodes the peer
	// selects (the node's labels do not match its selector).
	CondNode Condition = "node"
)

// Miss is a rule that would have allowed a denied direction of a connection
// if one condition had held.
type Miss struct {
	Direction compile.Direction `json:"-"`
	// DirectionName is "ingress" or "egress", for JSON.
	DirectionName string `json:"direction"`
	// Rule names the rule: "x/allow-web ingress[0]", or a
	// ClusterNetworkPolicy's label and rule name.
	Rule      string    `json:"rule"`
	Condition Condition `json:"condition"`
	// Detail says in words what failed and what would have matched.
	Detail string `json:"detail"`
	// Change is the one change that makes the rule match.
	Change Change `json:"change"`
}

// Change is the change a nearest miss suggests: exactly one of a different
// protocol and port, different labels on a pod or namespace, or a different
// remote address.
type Change struct {
	// Protocol and Port, when Port or Protocol is set: connect to this
	// protocol and port instead.
	Protocol compile.Protocol `json:"-"`
	// ProtocolName is the protocol's Kubernetes spelling, for JSON.
	ProtocolName string `json:"protocol,omitempty"`
	Port         uint16 `json:"port,omitempty"`
	// Pod ("ns/name") or Namespace is the object whose labels would change:
	// SetLabels added or overwritten, RemoveLabels removed.
	Pod          string            `json:"pod,omitempty"`
	Namespace    string            `json:"namespace,omitempty"`
	SetLabels    map[string]string `json:"setLabels,omitempty"`
	RemoveLabels []string          `json:"removeLabels,omitempty"`
	// Remote, when valid: the remote end at this address instead (a CIDR
	// or node peer); for ingress that is the source, for egress the
	// destination.
	Remote netip.Addr `json:"remote,omitzero"`
}

// Explanation is a verdict with what explains it.
type Explanation struct {
	Verdict
	// NearestMiss lists, for each denied direction, the rules that miss by
	// one condition, egress first, then in rule order; empty when allowed.
	NearestMiss []Miss
}

// Explain decides a connection like Evaluate and, when a direction denies
// it, finds its nearest misses.
func Explain(p *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16) Explanation {
	v := Evaluate(p, src, dst, proto, port)
	ex := Explanation{Verdict: v, NearestMiss: []Miss{}}
	if v.Allowed {
		return ex
	}
	src, dst = src.Unmap(), dst.Unmap()
	c := conn{p: p, src: src, dst: dst, proto: proto, port: port}
	if id, ok := p.PodByIP(src); ok {
		c.srcPod = &p.Pods[id]
	}
	if id, ok := p.PodByIP(dst); ok {
		c.dstPod = &p.Pods[id]
	}
	if !v.Egress && c.srcPod != nil {
		ex.NearestMiss = append(ex.NearestMiss, c.misses(c.srcPod, compile.Egress, v.EgressReason)...)
	}
	if !v.Ingress && c.dstPod != nil {
		ex.NearestMiss = append(ex.NearestMiss, c.misses(c.dstPod, compile.Ingress, v.IngressReason)...)
	}
	return ex
}

// conn is the connection being explained.
type conn struct {
	p              *compile.Program
	src, dst       netip.Addr
	srcPod, dstPod *compile.Pod
	proto          compile.Protocol
	port           uint16
}

// remote returns the remote end of direction d: the destination for egress.
func (c *conn) remote(d compile.Direction) (*compile.Pod, netip.Addr) {
	if d == compile.Egress {
		return c.dstPod, c.dst
	}
	return c.srcPod, c.src
}

// candidate is a rule that could have allowed the direction.
type candidate struct {
	name string
	m    *compile.Match
}

// misses lists the nearest misses of a denied direction of a local pod. The
// candidates are the rules that could have overridden the deciding one: for
// a NetworkPolicy default deny every rule of the isolating policies; for a
// ClusterNetworkPolicy Deny the Accept rules of the same tier that come
// before it.
func (c *conn) misses(pod *compile.Pod, d compile.Direction, reason string) []Miss {
	var cands []candidate
	if tier, ok := c.denyingTier(pod, d, reason); ok {
		for _, id := range pod.ClusterPolicies(tier, d) {
			cp := &c.p.ClusterPolicies[id]
			rules := cp.Rules(d)
			done := false
			for i := range rules {
				r := &rules[i]
				if r.Reason == reason {
					done = true
					break
				}
				if r.Action == compile.ActionAccept && !r.MatchesNothing() {
					cands = append(cands, candidate{cp.Label + " " + d.String() + " rule " + r.Name, &r.Match})
				}
			}
			if done {
				break
			}
		}
	} else {
		var rules []*compile.Rule
		for _, id := range pod.Policies(d) {
			pol := &c.p.Policies[id]
			for i := range pol.Rules(d) {
				if r := &pol.Rules(d)[i]; !r.MatchesNothing() {
					rules = append(rules, r)
				}
			}
		}
		sort.SliceStable(rules, func(i, j int) bool { return rules[i].Order < rules[j].Order })
		for _, r := range rules {
			cands = append(cands, candidate{r.Name, &r.Match})
		}
	}
	var out []Miss
	for _, cand := range cands {
		if m, ok := c.miss(cand.m, d); ok {
			m.Direction, m.DirectionName, m.Rule = d, d.String(), cand.name
			out = append(out, m)
		}
	}
	return out
}

// denyingTier finds the ClusterNetworkPolicy tier whose Deny rule gave the
// reason; ok is false when a NetworkPolicy default deny decided.
func (c *conn) denyingTier(pod *compile.Pod, d compile.Direction, reason string) (compile.Tier, bool) {
	for _, t := range []compile.Tier{compile.TierAdmin, compile.TierBaseline} {
		for _, id := range pod.ClusterPolicies(t, d) {
			for _, r := range c.p.ClusterPolicies[id].Rules(d) {
				if r.Action == compile.ActionDeny && r.Reason == reason {
					return t, true
				}
			}
		}
	}
	return 0, false
}

// miss checks one rule: when exactly one of its peer and its ports fails,
// it says which condition failed and how it would hold.
func (c *conn) miss(m *compile.Match, d compile.Direction) (Miss, bool) {
	remotePod, remote := c.remote(d)
	peerOK := matchPeer(c.p, m, remotePod, remote)
	portOK := matchPort(m, c.dstPod, c.proto, c.port)
	switch {
	case peerOK && !portOK:
		return c.portMiss(m)
	case !peerOK && portOK:
		return c.peerMiss(m, d, remotePod, remote)
	}
	return Miss{}, false
}

// portMiss explains a rule whose peer matched but whose ports did not.
func (c *conn) portMiss(m *compile.Match) (Miss, bool) {
	allowed := describePorts(m, c.dstPod)
	conn := fmt.Sprintf("the connection is to %s %d", c.proto, c.port)
	// The same protocol on another port first: the smaller change.
	for _, pr := range m.Ports {
		if pr.Protocol == c.proto {
			return Miss{Condition: CondPort, Change: Change{Protocol: c.proto, ProtocolName: c.proto.String(), Port: pr.First},
				Detail: fmt.Sprintf("the rule allows %s; %s", allowed, conn)}, true
		}
	}
	if c.dstPod != nil {
		for _, np := range m.NamedPorts {
			for _, cp := range c.dstPod.Ports {
				if cp.Name != np.Name || (np.Protocol != 0 && np.Protocol != cp.Protocol) {
					continue
				}
				if n, ok := c.dstPod.NamedPort(cp.Name, cp.Protocol); !ok || n != cp.Port {
					continue
				}
				cond := CondPort
				if cp.Protocol != c.proto {
					cond = CondProtocol
				}
				return Miss{Condition: cond, Change: Change{Protocol: cp.Protocol, ProtocolName: cp.Protocol.String(), Port: cp.Port},
					Detail: fmt.Sprintf("the rule allows %s; on %s port %q is %s %d; %s", allowed, c.dstPod.Key, cp.Name, cp.Protocol, cp.Port, conn)}, true
			}
		}
	}
	for _, pr := range m.Ports {
		if pr.First <= c.port && c.port <= pr.Last {
			return Miss{Condition: CondProtocol, Change: Change{Protocol: pr.Protocol, ProtocolName: pr.Protocol.String(), Port: c.port},
				Detail: fmt.Sprintf("the rule allows %s; %s", allowed, conn)}, true
		}
	}
	if len(m.Ports) > 0 {
		pr := m.Ports[0]
		return Miss{Condition: CondProtocol, Change: Change{Protocol: pr.Protocol, ProtocolName: pr.Protocol.String(), Port: pr.First},
			Detail: fmt.Sprintf("the rule allows %s; %s", allowed, conn)}, true
	}
	// Only named ports the destination does not declare: no port change helps.
	return Miss{}, false
}

// describePorts says which ports a match allows, e.g. "TCP 80, TCP 8000-8080,
// port \"http\" (TCP 8080 on x/web)".
func describePorts(m *compile.Match, dstPod *compile.Pod) string {
	var parts []string
	for _, pr := range m.Ports {
		switch {
		case pr.First == 0 && pr.Last == 65535:
			parts = append(parts, "any "+pr.Protocol.String()+" port")
		case pr.First == pr.Last:
			parts = append(parts, fmt.Sprintf("%s %d", pr.Protocol, pr.First))
		default:
			parts = append(parts, fmt.Sprintf("%s %d-%d", pr.Protocol, pr.First, pr.Last))
		}
	}
	for _, np := range m.NamedPorts {
		s := fmt.Sprintf("port %q", np.Name)
		if np.Protocol != 0 {
			s = fmt.Sprintf("%s port %q", np.Protocol, np.Name)
		}
		if dstPod != nil {
			found := false
			for _, cp := range dstPod.Ports {
				if cp.Name == np.Name && (np.Protocol == 0 || np.Protocol == cp.Protocol) {
					s += fmt.Sprintf(" (%s %d on %s)", cp.Protocol, cp.Port, dstPod.Key)
					found = true
					break
				}
			}
			if !found {
				s += " (not declared by " + dstPod.Key + ")"
			}
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// peerMiss explains a rule whose ports matched but whose peers did not: the
// first peer alternative that one change would satisfy.
func (c *conn) peerMiss(m *compile.Match, d compile.Direction, remotePod *compile.Pod, remote netip.Addr) (Miss, bool) {
	side := "source"
	if d == compile.Egress {
		side = "destination"
	}
	if remotePod != nil {
		for _, sid := range m.Selectors {
			if miss, ok := c.selectorMiss(&c.p.Selectors[sid], side, remotePod); ok {
				return miss, true
			}
		}
	}
	for _, nid := range m.Nodes {
		ns := &c.p.NodeSets[nid]
		if len(ns.Addrs) == 0 {
			continue
		}
		return Miss{Condition: CondNode, Change: Change{Remote: ns.Addrs[0]},
			Detail: fmt.Sprintf("the %s %s is not an address of the nodes the peer selects (%s: %s)",
				side, remote, ns.Description, strings.Join(ns.Nodes, ", "))}, true
	}
	if len(m.IPBlocks) > 0 {
		cond, what := CondCIDR, "outside"
		first, last := m.IPBlocks[0].From, m.IPBlocks[len(m.IPBlocks)-1].To
		if remote.Is4() == first.Is4() && first.Compare(remote) <= 0 && remote.Compare(last) <= 0 {
			// Between two ranges of one peer list: a hole an except cut.
			cond, what = CondCIDRExcept, "inside the peer's CIDR but in an except range, outside"
		}
		to := m.IPBlocks[0].From
		for _, r := range m.IPBlocks {
			if r.From.Is4() == remote.Is4() {
				to = r.From
				break
			}
		}
		return Miss{Condition: cond, Change: Change{Remote: to},
			Detail: fmt.Sprintf("the %s address %s is %s the allowed ranges %s", side, remote, what, describeRanges(m.IPBlocks))}, true
	}
	return Miss{}, false
}

func describeRanges(rs []compile.IPRange) string {
	parts := make([]string, 0, len(rs))
	for _, r := range rs {
		parts = append(parts, r.String())
	}
	return strings.Join(parts, ", ")
}

// selectorMiss explains a pod-selecting peer the remote pod is not in, when
// only its pod labels or only its namespace labels need to change (a peer
// confined to another namespace cannot be met by a label change). A set
// shared by peers that say different things is not explained by labels:
// its selectors are its first peer's, perhaps not the rule's, and a pod
// that met them alone would split the set rather than join the rule's.
func (c *conn) selectorMiss(s *compile.Selector, side string, pod *compile.Pod) (Miss, bool) {
	if s.Shared() {
		return Miss{}, false
	}
	podSel, err := labels.Parse(s.PodSelector)
	if err != nil {
		return Miss{}, false
	}
	podOK := podSel.Matches(labels.Set(pod.Labels))
	var nsOK bool
	var nsSel labels.Selector
	nsLabels := c.p.NamespaceLabels[pod.Namespace]
	if s.Namespace != "" {
		if s.Namespace != pod.Namespace {
			return Miss{}, false
		}
		nsOK = true
	} else {
		if nsSel, err = labels.Parse(s.NamespaceSelector); err != nil {
			return Miss{}, false
		}
		nsOK = nsSel.Matches(nsLabels)
	}
	switch {
	case !podOK && nsOK:
		set, remove, words, ok := labelFix(podSel, labels.Set(pod.Labels))
		if !ok {
			return Miss{}, false
		}
		return Miss{Condition: CondPodLabel, Change: Change{Pod: pod.Key, SetLabels: set, RemoveLabels: remove},
			Detail: fmt.Sprintf("the %s pod %s %s (the peer selects %s)", side, pod.Key, words, s.Description)}, true
	case podOK && !nsOK:
		set, remove, words, ok := labelFix(nsSel, nsLabels)
		if !ok {
			return Miss{}, false
		}
		return Miss{Condition: CondNamespaceLabel, Change: Change{Namespace: pod.Namespace, SetLabels: set, RemoveLabels: remove},
			Detail: fmt.Sprintf("the %s pod's namespace %s %s (the peer selects %s)", side, pod.Namespace, words, s.Description)}, true
	}
	return Miss{}, false
}

// labelFix finds the label changes that make a selector match a label set,
// and says in words what is wrong. The namespace name label cannot change.
func labelFix(sel labels.Selector, have labels.Set) (set map[string]string, remove []string, words string, ok bool) {
	reqs, _ := sel.Requirements()
	var problems []string
	for _, r := range reqs {
		if r.Matches(have) {
			continue
		}
		if r.Key() == "kubernetes.io/metadata.name" {
			return nil, nil, "", false
		}
		vals := r.Values().List()
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
			if set == nil {
				set = map[string]string{}
			}
			set[r.Key()] = vals[0]
			if v, has := have[r.Key()]; has {
				problems = append(problems, fmt.Sprintf("has label %s=%s, not %s", r.Key(), v, r.String()))
			} else {
				problems = append(problems, "lacks label "+r.String())
			}
		case selection.Exists:
			if set == nil {
				set = map[string]string{}
			}
			set[r.Key()] = ""
			problems = append(problems, "lacks label "+r.Key())
		case selection.NotEquals, selection.NotIn, selection.DoesNotExist:
			remove = append(remove, r.Key())
			problems = append(problems, fmt.Sprintf("has label %s=%s, excluded by %s", r.Key(), have[r.Key()], r.String()))
		default:
			return nil, nil, "", false
		}
	}
	if len(problems) == 0 {
		return nil, nil, "", false
	}
	return set, remove, strings.Join(problems, " and "), true
}

// matchPeer checks the remote end against a rule's peers, from the
// program's general structures (the evaluator reads its compact index
// instead; explanations are not on the packet path).
func matchPeer(p *compile.Program, m *compile.Match, remotePod *compile.Pod, remote netip.Addr) bool {
	if m.AllPeers {
		return true
	}
	if remotePod != nil {
		for _, s := range m.Selectors {
			if remotePod.InSelector(s) {
				return true
			}
		}
	}
	for _, n := range m.Nodes {
		if p.NodeSets[n].Contains(remote) {
			return true
		}
	}
	return compile.RangesContain(m.IPBlocks, remote)
}

// matchPort checks the destination port; named ports resolve on the
// destination pod (whatever its protocol when the reference has none).
func matchPort(m *compile.Match, dstPod *compile.Pod, proto compile.Protocol, port uint16) bool {
	if m.AllPorts {
		return true
	}
	for _, pr := range m.Ports {
		if pr.Protocol == proto && pr.First <= port && port <= pr.Last {
			return true
		}
	}
	if dstPod != nil {
		for _, np := range m.NamedPorts {
			if np.Protocol != 0 && np.Protocol != proto {
				continue
			}
			if n, ok := dstPod.NamedPort(np.Name, proto); ok && n == port {
				return true
			}
		}
	}
	return false
}
