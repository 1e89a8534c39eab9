package compile

import (
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// The work one object may cause.
//
// Every node compiles every policy at every build, and a NetworkPolicy is
// written by a namespace user: one object must not be able to hold up the
// enforcement of every other one. The compiler's work, the ruleset's
// elements and rules and the evaluator's lists grow linearly with an
// object's entries (ipBlock exceptions, networks, ports, peers, rules),
// except that each distinct selector is matched against pods, so that a
// selector costs more than an address. Before an object is compiled its
// cost is counted from the object alone (NetworkPolicyCost,
// ClusterPolicyCost, linear in its size); past MaxPolicyCost it is not
// compiled but enforced fail-closed on its own (Policy.Rejected,
// ClusterPolicy.Rejected), so it never costs more than counting it. What
// an object says does not bound what it makes (a selector's set grows
// with the pods it selects): that is charged as the object is built,
// against its budgets (budget.go).

// MaxPolicyCost bounds the cost of one NetworkPolicy or ClusterNetworkPolicy.
//
// 50,000 is about 10 times a large real policy (an ipBlock listing a cloud
// provider's published IPv4 ranges is a few thousand entries) and above the
// largest ClusterNetworkPolicy the CRD's limits admit with selectors of a
// label (25 rules each way of 25 peers and 25 protocols, pods or networks
// of 25 CIDRs, TestLargestCRDClusterPolicyIsWithinTheBound:
// about 31,000). At the bound one object adds at most about 50,000 set
// elements on every node and compiles in well under a second (16,000
// exceptions: tens of milliseconds, BenchmarkExceptCompile); a
// NetworkPolicy of /32 exceptions reaches it at about 900 KB of JSON, inside
// etcd's 1.5 MiB limit on one object.
const MaxPolicyCost = 50_000

// SelectorPeerCost is the cost of one pod-, namespace- or node-selecting
// peer (and of a policy's subject), besides its requirements: the build
// matches it against the pods of its namespaces (or the nodes), so one
// costs many addresses (about 5 at 200 pods, BenchmarkHugePolicy).
const SelectorPeerCost = 10

// selectorCost is the cost of a label selector: SelectorPeerCost and one per
// label, requirement and value, each of which is checked against every pod
// the selector is matched with.
func selectorCost(s *metav1.LabelSelector) int {
	if s == nil {
		return 0
	}
	c := SelectorPeerCost + len(s.MatchLabels)
	for _, e := range s.MatchExpressions {
		c += 1 + len(e.Values)
	}
	return c
}

// NetworkPolicyCost is the cost of compiling and enforcing a NetworkPolicy:
// one for the policy, its podSelector, and for each rule one, one per port
// entry, and per peer its selectors or one per ipBlock and per exception.
func NetworkPolicyCost(np *networkingv1.NetworkPolicy) int {
	c := 1 + selectorCost(&np.Spec.PodSelector)
	rule := func(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) {
		c += 1 + len(ports)
		for i := range peers {
			p := &peers[i]
			c += selectorCost(p.PodSelector) + selectorCost(p.NamespaceSelector)
			if p.IPBlock != nil {
				c += 1 + len(p.IPBlock.Except)
			}
		}
	}
	for i := range np.Spec.Ingress {
		rule(np.Spec.Ingress[i].From, np.Spec.Ingress[i].Ports)
	}
	for i := range np.Spec.Egress {
		rule(np.Spec.Egress[i].To, np.Spec.Egress[i].Ports)
	}
	return c
}

// ClusterPolicyCost is the cost of compiling and enforcing a
// ClusterNetworkPolicy, counted as NetworkPolicyCost: one for the policy,
// its subject's selectors, and for each rule one, one per protocol entry,
// and per peer its selectors or one per network and per domain name.
func ClusterPolicyCost(cnp *npav1beta1.ClusterNetworkPolicy) int {
	s := &cnp.Spec.Subject
	c := 1 + selectorCost(s.Namespaces)
	if s.Pods != nil {
		c += selectorCost(&s.Pods.NamespaceSelector) + selectorCost(&s.Pods.PodSelector)
	}
	rule := func(protos int) { c += 1 + protos }
	peer := func(ns *metav1.LabelSelector, pods *npav1beta1.NamespacedPod) {
		c += 1 + selectorCost(ns)
		if pods != nil {
			c += selectorCost(&pods.NamespaceSelector) + selectorCost(&pods.PodSelector)
		}
	}
	for i := range cnp.Spec.Ingress {
		r := &cnp.Spec.Ingress[i]
		rule(len(r.Protocols))
		for j := range r.From {
			peer(r.From[j].Namespaces, r.From[j].Pods)
		}
	}
	for i := range cnp.Spec.Egress {
		r := &cnp.Spec.Egress[i]
		rule(len(r.Protocols))
		for j := range r.To {
			p := &r.To[j]
			peer(p.Namespaces, p.Pods)
			c += selectorCost(p.Nodes) + len(p.Networks) + len(p.DomainNames)
		}
	}
	return c
}

// rejectCost reports an object whose cost is past MaxPolicyCost.
func (p *problems) rejectCost(cost int, enforced string) {
	p.add(field.NewPath("spec"), "too large to compile: cost %d is over the bound of %d (one per rule, port, ipBlock exception, network and domain name, %d and more per selector); %s",
		cost, MaxPolicyCost, SelectorPeerCost, enforced)
}

// rejectedClusterRule is a rule of a ClusterNetworkPolicy rejected for its
// cost, as the invalid path enforces a rule that cannot be used: an Accept
// rule matches nothing, a Deny or Pass rule (or one with an unknown
// action) denies all traffic of the policy's subjects in its direction.
func rejectedClusterRule(cp *ClusterPolicy, id ClusterPolicyID, dir Direction, idx int, name string, action npav1beta1.ClusterNetworkPolicyRuleAction) ClusterRule {
	r := ClusterRule{Policy: id, Direction: dir, Index: idx, Name: name}
	if name == "" {
		r.Name = "#" + itoa(idx)
	}
	if action == npav1beta1.ClusterNetworkPolicyRuleActionAccept {
		r.Action, r.Disabled = ActionAccept, true
	} else {
		r.Action, r.Match = ActionDeny, Match{AllPeers: true, AllPorts: true}
	}
	r.Reason = clusterReason(cp, &r)
	return r
}
