package scenariogen

import (
	"math/rand/v2"
	"strings"

	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// DomainFraction is the share of scenarios with ClusterNetworkPolicies that
// get a domainNames rule and the DNS answers pods resolved.
const DomainFraction = 0.4

// Names the generated rules and answers use: exact names, names under a
// wildcard's suffix (one and two labels deep) and the bare suffix, which
// "*.example.org" must not match.
var (
	domainPatterns = []npav1beta1.DomainName{"www.example.com", "*.example.org", "api.example.com.", "*.cdn.example.net"}
	domainNames    = []string{"www.example.com", "api.example.com", "a.example.org", "x.y.example.org", "example.org", "edge.cdn.example.net", "cdn.example.net", "other.test"}
)

// domainPart adds, for a fraction of the seeds with ClusterNetworkPolicies,
// an Accept rule with domainNames peers to one of them (at a random place
// among its egress rules) and dnsAnswers mapping names to the external
// addresses the probes use, and to pods' addresses. It draws from its own
// stream of the seed: seeds that draw nothing are unchanged byte for byte.
func (g *gen) domainPart(seed uint64) {
	if len(g.s.ClusterNetworkPolicies) == 0 {
		return
	}
	d := &gen{r: rand.New(rand.NewPCG(seed, 0x66716e5f_646e7321)), s: g.s, dual: g.dual}
	if !d.chance(DomainFraction) {
		return
	}
	cnp := &d.s.ClusterNetworkPolicies[d.intn(len(d.s.ClusterNetworkPolicies))]
	rule := npav1beta1.ClusterNetworkPolicyEgressRule{Name: "names", Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept}
	for k, n := 0, 1+d.intn(3); k < n; k++ {
		p := pick(d, domainPatterns)
		if !containsDomainName(rule.To, p) {
			rule.To = append(rule.To, npav1beta1.ClusterNetworkPolicyEgressPeer{DomainNames: []npav1beta1.DomainName{p}})
		}
	}
	rule.Protocols = d.cnpProtocols(false)
	at := d.intn(len(cnp.Spec.Egress) + 1)
	cnp.Spec.Egress = append(cnp.Spec.Egress[:at], append([]npav1beta1.ClusterNetworkPolicyEgressRule{rule}, cnp.Spec.Egress[at:]...)...)

	pods := d.s.Pods
	for k, n := 0, 2+d.intn(5); k < n; k++ {
		p := &pods[d.intn(len(pods))]
		a := scenario.DNSAnswer{Pod: p.Key(), Name: pick(d, domainNames), TTL: 300}
		for j, m := 0, 1+d.intn(2); j < m; j++ {
			if d.chance(0.2) {
				// A name that resolves to a pod's address.
				a.IPs = append(a.IPs, pick(d, pods[d.intn(len(pods))].Addrs()).String())
			} else {
				a.IPs = append(a.IPs, d.external(p))
			}
		}
		d.s.DNSAnswers = append(d.s.DNSAnswers, a)
		// Probe what was resolved, from the pod that resolved it and from
		// another one.
		for _, from := range []*scenario.Pod{p, &pods[d.intn(len(pods))]} {
			pr := d.podProbe(from, nil)
			pr.From, pr.To = scenario.Endpoint{Pod: from.Key()}, scenario.Endpoint{IP: pick(d, a.IPs)}
			if sharesFamily(from, pr.To.IP) && !ownAddr(from, pr.To.IP) {
				d.s.Probes = append(d.s.Probes, pr)
			}
		}
	}
}

func containsDomainName(peers []npav1beta1.ClusterNetworkPolicyEgressPeer, n npav1beta1.DomainName) bool {
	for _, p := range peers {
		for _, x := range p.DomainNames {
			if x == n {
				return true
			}
		}
	}
	return false
}

func ownAddr(p *scenario.Pod, ip string) bool {
	for _, a := range p.Addrs() {
		if a.String() == ip {
			return true
		}
	}
	return false
}

func sharesFamily(p *scenario.Pod, ip string) bool {
	for _, a := range p.Addrs() {
		if (a.Is4()) == !strings.Contains(ip, ":") {
			return true
		}
	}
	return false
}
