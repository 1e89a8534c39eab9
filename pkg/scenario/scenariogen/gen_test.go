package scenariogen

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

const seeds = 600

// TestValid: every scenario is one the API server would take, and reads
// back (YAML and JSON) as generated.
func TestValid(t *testing.T) {
	for seed := uint64(0); seed < seeds; seed++ {
		s := Generate(seed)
		data, err := YAML(s)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		back, err := scenario.Parse(data)
		if err != nil {
			t.Fatalf("seed %d: %v\n%s", seed, err, data)
		}
		if diff := cmp.Diff(s, back); diff != "" {
			t.Fatalf("seed %d: YAML round trip (-generated +parsed):\n%s", seed, diff)
		}
		js, _ := json.Marshal(s)
		if _, err := scenario.Parse(js); err != nil {
			t.Fatalf("seed %d: JSON: %v", seed, err)
		}
		if len(s.Pods) > MaxPods || len(s.Pods) < 3 {
			t.Errorf("seed %d: %d pods", seed, len(s.Pods))
		}
		if n := len(s.Policies); n < 1 || n > 5 {
			t.Errorf("seed %d: %d policies", seed, n)
		}
		if got := s.NodeNames(nil); !cmp.Equal(got, Nodes) {
			t.Errorf("seed %d: nodes %v", seed, got)
		}
		pairs := map[[2]string]bool{}
		for _, pr := range s.Probes {
			if p := pr.ProbeProtocol(); p != compile.ProtoTCP && p != compile.ProtoUDP {
				t.Errorf("seed %d: %s probe", seed, p)
			}
			if pr.From.Pod != "" && pr.To.Pod != "" {
				pairs[[2]string{pr.From.Pod, pr.To.Pod}] = true
			}
		}
		if want := len(s.Pods) * (len(s.Pods) - 1); len(pairs) != want {
			t.Errorf("seed %d: %d ordered pod pairs probed, want %d", seed, len(pairs), want)
		}
	}
}

func TestDeterministic(t *testing.T) {
	for seed := uint64(0); seed < 50; seed++ {
		a, _ := YAML(Generate(seed))
		b, _ := YAML(Generate(seed))
		if !bytes.Equal(a, b) {
			t.Fatalf("seed %d: two generations differ", seed)
		}
	}
	a, _ := YAML(Generate(1))
	b, _ := YAML(Generate(2))
	if bytes.Equal(a, b) {
		t.Fatal("seeds 1 and 2 give the same scenario")
	}
}

// TestCoverage: over the seeds, every construct the generator promises
// appears, so that a differential run over a seed range exercises them all.
func TestCoverage(t *testing.T) {
	seen := map[string]int{}
	mark := func(k string) { seen[k]++ }
	sel := func(prefix string, s *metav1.LabelSelector) {
		if s == nil {
			return
		}
		if len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0 {
			mark(prefix + " {}")
		}
		if len(s.MatchLabels) > 0 {
			mark(prefix + " matchLabels")
		}
		for _, e := range s.MatchExpressions {
			mark(prefix + " " + string(e.Operator))
		}
	}
	for seed := uint64(0); seed < seeds; seed++ {
		s := Generate(seed)
		names := map[string]map[int32]bool{}
		for _, p := range s.Pods {
			switch len(p.Addrs()) {
			case 2:
				mark("dual-stack pod")
			case 1:
				if p.Addrs()[0].Is6() {
					mark("IPv6-only pod")
				}
			}
			for _, cp := range p.Ports {
				if names[cp.Name] == nil {
					names[cp.Name] = map[int32]bool{}
				}
				names[cp.Name][cp.Port] = true
				if cp.Protocol == "SCTP" {
					mark("SCTP container port")
				}
			}
		}
		for _, nums := range names {
			if len(nums) > 1 {
				mark("port name with different numbers")
			}
		}
		for _, ns := range s.Namespaces {
			if ns.Labels["env"] == "" {
				mark("namespace lacking a key")
			}
		}
		for _, np := range s.Policies {
			types := "policyTypes"
			for _, pt := range np.Spec.PolicyTypes {
				types += " " + string(pt)
			}
			mark(types)
			sel("podSelector", &np.Spec.PodSelector)
			type rule struct {
				peers []networkingv1.NetworkPolicyPeer
				ports []networkingv1.NetworkPolicyPort
			}
			var rules []rule
			for _, r := range np.Spec.Ingress {
				rules = append(rules, rule{r.From, r.Ports})
			}
			for _, r := range np.Spec.Egress {
				rules = append(rules, rule{r.To, r.Ports})
			}
			hasIn, hasEg := false, false
			for _, pt := range np.Spec.PolicyTypes {
				hasIn = hasIn || pt == networkingv1.PolicyTypeIngress
				hasEg = hasEg || pt == networkingv1.PolicyTypeEgress
			}
			if np.Spec.PolicyTypes != nil && ((!hasIn && len(np.Spec.Ingress) > 0) || (!hasEg && len(np.Spec.Egress) > 0)) {
				mark("rules of a direction policyTypes omits")
			}
			for _, r := range rules {
				switch {
				case r.peers == nil && r.ports == nil:
					mark("empty rule")
				case r.peers == nil:
					mark("absent peers")
				case r.ports == nil:
					mark("absent ports")
				}
				for _, p := range r.peers {
					sel("peer podSelector", p.PodSelector)
					sel("peer namespaceSelector", p.NamespaceSelector)
					if p.PodSelector != nil && p.NamespaceSelector != nil {
						mark("pod and namespace selector in one peer")
					}
					if p.NamespaceSelector != nil && p.NamespaceSelector.MatchLabels[compile.NamespaceNameLabel] != "" {
						mark("namespace name label")
					}
					if b := p.IPBlock; b != nil {
						v6 := strings.Contains(b.CIDR, ":")
						pod := strings.HasPrefix(b.CIDR, "10.244.") || strings.HasPrefix(b.CIDR, "fd00:10:244:")
						kind := "ipBlock external"
						if pod {
							kind = "ipBlock pod range"
						}
						if len(b.Except) > 0 {
							kind += " except"
						}
						if v6 {
							kind += " IPv6"
						}
						mark(kind)
					}
				}
				for _, p := range r.ports {
					proto := "TCP(default)"
					if p.Protocol != nil {
						proto = string(*p.Protocol)
					}
					mark("port protocol " + proto)
					switch {
					case p.Port == nil:
						mark("protocol-only port")
					case p.Port.Type == intstr.String:
						mark("named port")
					case p.EndPort != nil:
						mark("port range")
					default:
						mark("numbered port")
					}
				}
			}
		}
		for _, pr := range s.Probes {
			src, _, _ := s.ProbeAddrs(indexOf(s, pr))
			if src.Is6() {
				mark("IPv6 probe")
			}
			if pr.From.IP != "" && pr.To.IP != "" {
				mark("probe between pods by address")
			} else if pr.From.IP != "" {
				mark("probe from an external address")
			} else if pr.To.IP != "" {
				mark("probe to an external address")
			}
			mark("probe " + pr.ProbeProtocol().String())
		}
	}
	want := []string{
		"dual-stack pod", "IPv6-only pod", "SCTP container port", "port name with different numbers", "namespace lacking a key",
		"policyTypes", "policyTypes Ingress", "policyTypes Egress", "policyTypes Ingress Egress", "policyTypes Egress Ingress",
		"rules of a direction policyTypes omits",
		"podSelector {}", "podSelector matchLabels", "podSelector In", "podSelector NotIn", "podSelector Exists", "podSelector DoesNotExist",
		"peer podSelector {}", "peer podSelector matchLabels", "peer podSelector In", "peer podSelector NotIn", "peer podSelector Exists", "peer podSelector DoesNotExist",
		"peer namespaceSelector {}", "peer namespaceSelector matchLabels", "peer namespaceSelector In", "peer namespaceSelector NotIn",
		"peer namespaceSelector Exists", "peer namespaceSelector DoesNotExist",
		"pod and namespace selector in one peer", "namespace name label",
		"ipBlock pod range", "ipBlock pod range except", "ipBlock external", "ipBlock external except",
		"ipBlock pod range except IPv6", "ipBlock external except IPv6",
		"empty rule", "absent peers", "absent ports",
		"port protocol TCP(default)", "port protocol TCP", "port protocol UDP", "port protocol SCTP",
		"protocol-only port", "named port", "port range", "numbered port",
		"IPv6 probe", "probe between pods by address", "probe from an external address", "probe to an external address",
		"probe TCP", "probe UDP",
	}
	for _, k := range want {
		if seen[k] == 0 {
			t.Errorf("never generated: %s", k)
		}
	}
	if testing.Verbose() {
		for _, k := range want {
			t.Logf("%6d  %s", seen[k], k)
		}
	}
}

func indexOf(s *scenario.Scenario, pr scenario.Probe) int {
	for i := range s.Probes {
		if s.Probes[i] == pr {
			return i
		}
	}
	return -1
}

func TestPredecessor(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		s, p := Generate(seed), Predecessor(seed)
		data, _ := YAML(p)
		if _, err := scenario.Parse(data); err != nil {
			t.Fatalf("seed %d: %v\n%s", seed, err, data)
		}
		if len(p.Pods) != len(s.Pods) {
			t.Fatalf("seed %d: predecessor has %d pods, want %d", seed, len(p.Pods), len(s.Pods))
		}
		for i := range p.Pods {
			a, b := p.Pods[i], s.Pods[i]
			if a.Key() != b.Key() || a.Node != b.Node || !slices.Equal(a.Addrs(), b.Addrs()) {
				t.Fatalf("seed %d: pod %d moved: %+v vs %+v", seed, i, a, b)
			}
		}
	}
	a, _ := YAML(Predecessor(3))
	b, _ := YAML(Predecessor(3))
	if !bytes.Equal(a, b) {
		t.Fatal("Predecessor is not deterministic")
	}
}
