package scenariogen

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// beforeCNP is the SHA-256 of the YAML of seeds 0 to 599 as the generator
// gave them before it drew ClusterNetworkPolicies.
const beforeCNP = "980ed2ea68e95107a06d79b54b17c8a006ce65cc5c2c3f7729ecd180b3815cbf"

// TestOldSeedsKeepTheirScenarios: without what the ClusterNetworkPolicy
// stream adds (nodes, cluster policies, node probes, all appended) and the
// staged stream's annotations, every seed gives the scenario it gave
// before, so old seeds keep their meaning.
func TestOldSeedsKeepTheirScenarios(t *testing.T) {
	h := sha256.New()
	for seed := uint64(0); seed < seeds; seed++ {
		s := generate(seed, false)
		s.Nodes, s.ClusterNetworkPolicies = nil, nil
		for i := range s.Policies {
			s.Policies[i].Annotations = nil
		}
		for i := range s.Namespaces {
			s.Namespaces[i].Annotations = nil
		}
		probes := s.Probes[:0]
		for _, pr := range s.Probes {
			if pr.From.Node == "" && pr.To.Node == "" {
				probes = append(probes, pr)
			}
		}
		s.Probes = probes
		data, err := YAML(s)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(data)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != beforeCNP {
		t.Errorf("seeds 0-%d changed: hash %s, want %s", seeds-1, got, beforeCNP)
	}
}

// TestClusterCoverage: over the seeds, every ClusterNetworkPolicy construct
// the generator promises appears, and the fractions hold roughly.
func TestClusterCoverage(t *testing.T) {
	seen := map[string]int{}
	mark := func(k string) { seen[k]++ }
	sel := func(prefix string, s *metav1.LabelSelector) {
		if s != nil && len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0 {
			mark(prefix + " {}")
		} else if s != nil {
			mark(prefix + " selector")
		}
	}
	protos := func(ps []npav1beta1.ClusterNetworkPolicyProtocol) {
		if ps == nil {
			mark("protocols absent")
		}
		for _, p := range ps {
			var port *npav1beta1.Port
			kind := ""
			switch {
			case p.TCP != nil:
				kind, port = "tcp", p.TCP.DestinationPort
			case p.UDP != nil:
				kind, port = "udp", p.UDP.DestinationPort
			case p.SCTP != nil:
				kind, port = "sctp", p.SCTP.DestinationPort
			default:
				mark("destinationNamedPort")
				continue
			}
			switch {
			case port == nil:
				mark(kind + " no port")
			case port.Range != nil:
				mark(kind + " range")
			default:
				mark(kind + " number")
			}
		}
	}
	withCNP, withNodes := 0, 0
	for seed := uint64(0); seed < seeds; seed++ {
		s := Generate(seed)
		if len(s.ClusterNetworkPolicies) > 0 {
			withCNP++
		}
		if len(s.Nodes) > 0 {
			withNodes++
			if len(s.ClusterNetworkPolicies) == 0 {
				t.Errorf("seed %d: nodes without ClusterNetworkPolicies", seed)
			}
		}
		prio := map[[2]any]int{}
		for _, p := range s.ClusterNetworkPolicies {
			mark("tier " + string(p.Spec.Tier))
			mark(p.APIVersion)
			prio[[2]any{p.Spec.Tier, p.Spec.Priority}]++
			if prio[[2]any{p.Spec.Tier, p.Spec.Priority}] == 2 {
				mark("priority tie")
			}
			sel("subject namespaces", p.Spec.Subject.Namespaces)
			if p.Spec.Subject.Pods != nil {
				mark("subject pods")
			}
			for _, r := range p.Spec.Ingress {
				mark("ingress " + string(r.Action))
				for _, f := range r.From {
					sel("ingress namespaces", f.Namespaces)
					if f.Pods != nil {
						mark("ingress pods")
					}
				}
				protos(r.Protocols)
			}
			for _, r := range p.Spec.Egress {
				mark("egress " + string(r.Action))
				if r.Name == "" {
					mark("unnamed rule")
				}
				for _, to := range r.To {
					sel("egress namespaces", to.Namespaces)
					sel("egress nodes", to.Nodes)
					if to.Pods != nil {
						mark("egress pods")
					}
					for _, n := range to.Networks {
						switch n {
						case "0.0.0.0/0", "::/0":
							mark("networks " + string(n))
						default:
							mark("networks")
						}
					}
				}
				protos(r.Protocols)
			}
		}
		for i, pr := range s.Probes {
			switch {
			case pr.To.Node != "":
				src, _, _ := s.ProbeAddrs(i)
				if s.Pod(pr.From.Pod).Node == pr.To.Node {
					mark("probe to own node")
				} else {
					mark("probe to other node")
				}
				if src.Is6() {
					mark("IPv6 node probe")
				}
			case pr.From.Node != "":
				mark("probe from node")
			}
		}
	}
	for _, k := range []string{
		"tier Admin", "tier Baseline", "policy.networking.k8s.io/v1beta1", "policy.networking.k8s.io/v1alpha2", "priority tie",
		"subject namespaces {}", "subject namespaces selector", "subject pods",
		"ingress Accept", "ingress Deny", "ingress Pass", "egress Accept", "egress Deny", "egress Pass", "unnamed rule",
		"ingress namespaces {}", "ingress namespaces selector", "ingress pods",
		"egress namespaces {}", "egress namespaces selector", "egress pods", "egress nodes {}", "egress nodes selector",
		"networks 0.0.0.0/0", "networks ::/0", "networks",
		"tcp number", "tcp range", "tcp no port", "udp number", "udp range", "udp no port", "sctp number", "sctp range", "sctp no port",
		"destinationNamedPort", "protocols absent",
		"probe to own node", "probe to other node", "probe from node", "IPv6 node probe",
	} {
		if seen[k] == 0 {
			t.Errorf("never generated: %s", k)
		}
	}
	if f := float64(withCNP) / seeds; f < ClusterFraction-0.1 || f > ClusterFraction+0.1 {
		t.Errorf("%d of %d seeds have ClusterNetworkPolicies", withCNP, seeds)
	}
	if f := float64(withNodes) / float64(withCNP); f < NodeFraction-0.1 || f > NodeFraction+0.1 {
		t.Errorf("%d of %d seeds with ClusterNetworkPolicies list nodes", withNodes, withCNP)
	}
	if testing.Verbose() {
		t.Logf("%d seeds with ClusterNetworkPolicies, %d with nodes", withCNP, withNodes)
		for k, n := range seen {
			t.Logf("%6d  %s", n, k)
		}
	}
}

// Each seed's ClusterNetworkPolicy scenario is one the evaluator builds
// without problems: what the generator writes is valid and supported.
func TestClusterScenariosHaveNoProblems(t *testing.T) {
	for seed := uint64(0); seed < seeds; seed++ {
		s := Generate(seed)
		if len(s.ClusterNetworkPolicies) == 0 {
			continue
		}
		if p := compile.Build(s.Input("", nil, nil)); len(p.Problems) > 0 {
			t.Errorf("seed %d: %v", seed, p.Problems)
		}
	}
}
