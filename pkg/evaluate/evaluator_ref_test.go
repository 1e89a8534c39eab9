package evaluate_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// withMixedPeers adds to compiletest's cluster what it lacks: IPv6-only pods
// (fd00::1 to fd00::20 in ns-0000), and in ns-0000 to ns-0009 a policy
// whose first rule is an ipBlock (IPv4 with one or two exceptions, and
// IPv6) and whose second selects
// pods, so that an earlier address rule and a later selector rule can both
// allow a connection (the reason must name the address rule).
func withMixedPeers(in compile.Input) compile.Input {
	for i := 1; i <= 32; i++ {
		ip := fmt.Sprintf("fd00::%x", i)
		in.Pods = append(in.Pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns-0000", Name: fmt.Sprintf("v6-%02d", i), Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%20)}},
			Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "main",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080 + int32(i%2)}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}},
		})
	}
	// Pods with more selector memberships and named ports than an
	// evaluator record holds inline (their lists are read from the pools),
	// selected by a policy whose rules name those ports.
	var wideRules []networkingv1.NetworkPolicyIngressRule
	for k := range 6 {
		key, name := fmt.Sprintf("k%d", k), intstr.FromString(fmt.Sprintf("p%d", k))
		wideRules = append(wideRules, networkingv1.NetworkPolicyIngressRule{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{key: "y"}}, NamespaceSelector: &metav1.LabelSelector{}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &name}},
		})
	}
	in.Policies = append(in.Policies, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns-0011", Name: "wide"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"k0": "y"}}, Ingress: wideRules},
	})
	for i := 1; i <= 8; i++ {
		labels := map[string]string{"app": fmt.Sprintf("app-%d", i%4), "tier": "web"}
		var ports []corev1.ContainerPort
		for k := range 6 {
			if k < 2+i%5 {
				labels[fmt.Sprintf("k%d", k)] = "y"
			}
			ports = append(ports, corev1.ContainerPort{Name: fmt.Sprintf("p%d", k), ContainerPort: 7000 + int32(k+i%2), Protocol: corev1.ProtocolTCP})
		}
		ip := fmt.Sprintf("10.16.11.%d", 200+i)
		in.Pods = append(in.Pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns-0011", Name: fmt.Sprintf("wide-%d", i), Labels: labels},
			Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "main", Ports: ports[:2+i%5]}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}},
		})
	}
	http, metrics := intstr.FromString("http"), intstr.FromInt32(9090)
	for i := range 10 {
		ns := fmt.Sprintf("ns-%04d", i)
		// Two exceptions make three ranges: more than a rule holds inline.
		except := []string{fmt.Sprintf("10.16.%d.0/24", i+1), fmt.Sprintf("10.16.%d.0/24", i+3)}
		in.Policies = append(in.Policies, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "aaa-mixed"},
			Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{
					{IPBlock: &networkingv1.IPBlock{CIDR: "10.16.0.0/16", Except: except[:1+i%2]}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/112", Except: []string{"fd00::/124"}}},
				}, Ports: []networkingv1.NetworkPolicyPort{{Port: &http}, {Port: &metrics}}},
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}},
			}},
		})
	}
	return in
}

// TestEvaluateMatchesReference checks the evaluator, which reads the
// program's EvalIndex, against a reference that decides from the program's
// general structures (Pod, Table, ClusterPolicy: the evaluator as it was
// before the index existed), on random connections of the synthetic
// clusters with and without ClusterNetworkPolicies, from and to pods,
// external addresses and nodes: verdicts and reasons must be the same.
func TestEvaluateMatchesReference(t *testing.T) {
	for _, c := range []struct {
		name string
		in   compile.Input
	}{
		{"networkpolicies", withMixedPeers(compiletest.Cluster(2000, 1000, 50))},
		{"clusternetworkpolicies", cnpBenchInput(1000)},
		{"clusternetworkpolicies on a node", func() compile.Input {
			in := cnpBenchInput(300)
			in.NodeName, in.NodeIPs = "node-3", []netip.Addr{netip.MustParseAddr("192.168.0.3")}
			return in
		}()},
	} {
		t.Run(c.name, func(t *testing.T) {
			prog := compile.Build(c.in)
			rng := rand.New(rand.NewPCG(5, 6))
			// The pods whose lists are not inline in their records.
			var wide []netip.Addr
			for i := range prog.Pods {
				if len(prog.Pods[i].MemberOf) > 4 || len(prog.Pods[i].Ports) > 3 {
					wide = append(wide, prog.Pods[i].IPs[0])
				}
			}
			if c.name == "networkpolicies" && len(wide) == 0 {
				t.Fatal("no pod with more memberships or named ports than a record holds inline")
			}
			// The ends of every address range, and their neighbours.
			var edges []netip.Addr
			for i := range prog.Policies {
				pol := &prog.Policies[i]
				for _, r := range append(append([]compile.Rule(nil), pol.Ingress...), pol.Egress...) {
					for _, b := range r.IPBlocks {
						edges = append(edges, b.From, b.From.Prev(), b.To, b.To.Next())
					}
				}
			}
			addr := func() netip.Addr {
				switch rng.IntN(10) {
				case 0:
					return netip.AddrFrom4([4]byte{10, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
				case 1:
					return netip.MustParseAddr("192.168.0.3")
				case 2:
					return netip.MustParseAddr("2001:db8::1")
				case 3:
					return netip.MustParseAddr(fmt.Sprintf("fd00::%x", rng.IntN(40)))
				case 4:
					if len(edges) > 0 {
						return edges[rng.IntN(len(edges))]
					}
				case 5:
					if len(wide) > 0 {
						return wide[rng.IntN(len(wide))]
					}
				}
				return prog.Pods[rng.IntN(len(prog.Pods))].IPs[0]
			}
			ports := []uint16{53, 443, 7000, 7001, 7003, 7005, 8050, 8080, 8081, 9090, 9091, 50051}
			protos := []compile.Protocol{compile.ProtoTCP, compile.ProtoTCP, compile.ProtoUDP, compile.ProtoSCTP}
			for i := 0; i < 20000; i++ {
				src, dst := addr(), addr()
				proto, port := protos[rng.IntN(len(protos))], ports[rng.IntN(len(ports))]
				got := evaluate.Evaluate(prog, src, dst, proto, port)
				want := refEvaluate(prog, src, dst, proto, port)
				if got != want {
					t.Fatalf("%s -> %s %v/%d:\n got %+v\nwant %+v", src, dst, proto, port, got, want)
				}
			}
			// Every pair of the pods with lists in the pools, both ends
			// read them.
			for _, src := range wide {
				for _, dst := range wide {
					for _, port := range ports {
						got := evaluate.Evaluate(prog, src, dst, compile.ProtoTCP, port)
						if want := refEvaluate(prog, src, dst, compile.ProtoTCP, port); got != want {
							t.Fatalf("%s -> %s TCP/%d:\n got %+v\nwant %+v", src, dst, port, got, want)
						}
					}
				}
			}
			for _, pod := range prog.Pods {
				for _, ip := range pod.IPs {
					id, ok := prog.PodByIP(ip)
					if !ok || prog.Pods[id].Key != pod.Key {
						t.Fatalf("PodByIP(%s) = %d, %v; want %s", ip, id, ok, pod.Key)
					}
				}
			}
			if id, ok := prog.PodByIP(netip.MustParseAddr("203.0.113.9")); ok {
				t.Fatalf("PodByIP(203.0.113.9) = %d, want none", id)
			}
		})
	}
}

// refEvaluate is the reference: it decides by brute force from the
// program's general structures (Pod, Policy, Selector, ClusterPolicy),
// without the decision tables or the EvalIndex, the way docs/semantics.md
// reads: per direction the Admin tier, then the NetworkPolicies isolating
// the pod (the first allowing rule in program order names the reason), then
// the Baseline tier, then allow.
func refEvaluate(p *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16) evaluate.Verdict {
	src, dst = src.Unmap(), dst.Unmap()
	srcID, srcOK := p.PodByIP(src)
	dstID, dstOK := p.PodByIP(dst)
	v := evaluate.Verdict{Egress: true, Ingress: true, EgressReason: evaluate.ReasonEgressNotIsolated, IngressReason: evaluate.ReasonIngressNotIsolated}
	if srcOK && dstOK && srcID == dstID {
		v.Allowed, v.EgressReason, v.IngressReason = true, evaluate.ReasonSelf, evaluate.ReasonSelf
		return v
	}
	srcEnd, dstEnd := refEnd{src, srcID, srcOK}, refEnd{dst, dstID, dstOK}
	if srcOK {
		if !p.Pods[srcID].Local {
			v.EgressReason = evaluate.ReasonNotEnforcedHere
		} else {
			v.Egress, v.EgressReason = refSide(p, srcID, compile.Egress, dstEnd, dstEnd, proto, port)
		}
	}
	if dstOK {
		pod := &p.Pods[dstID]
		switch {
		case !pod.Local:
			v.IngressReason = evaluate.ReasonNotEnforcedHere
		case !srcOK && p.IsOwnNode(pod, src):
			if len(pod.IngressPolicies) > 0 || len(pod.AdminIngress) > 0 || len(pod.BaselineIngress) > 0 {
				v.IngressReason = evaluate.ReasonNodeTraffic
			}
		default:
			v.Ingress, v.IngressReason = refSide(p, dstID, compile.Ingress, srcEnd, dstEnd, proto, port)
		}
	}
	v.Allowed = v.Egress && v.Ingress
	return v
}

// refEnd is an end of a connection: an address, and its pod when ok.
type refEnd struct {
	addr netip.Addr
	id   compile.PodID
	ok   bool
}

func refSide(p *compile.Program, id compile.PodID, d compile.Direction, remote, dst refEnd, proto compile.Protocol, port uint16) (bool, string) {
	pod := &p.Pods[id]
	passed := ""
	for _, t := range []compile.Tier{compile.TierAdmin, 0, compile.TierBaseline} {
		if t == 0 {
			ids, denied := pod.IngressPolicies, pod.IngressDenied
			if d == compile.Egress {
				ids, denied = pod.EgressPolicies, pod.EgressDenied
			}
			if len(ids) == 0 {
				continue
			}
			if !remote.ok && p.IsOwnNode(pod, remote.addr) {
				return true, evaluate.ReasonNodeTraffic
			}
			var best *compile.Rule
			for _, pid := range ids {
				rules := p.Policies[pid].Rules(d)
				for i := range rules {
					r := &rules[i]
					if !r.MatchesNothing() && refMatch(p, &r.Match, remote, dst, proto, port) && (best == nil || r.Order < best.Order) {
						best = r
					}
				}
			}
			if best == nil {
				return false, denied
			}
			return true, best.AllowReason
		}
	tier:
		for _, cid := range pod.ClusterPolicies(t, d) {
			rules := p.ClusterPolicies[cid].Rules(d)
			for i := range rules {
				r := &rules[i]
				if r.Disabled || !refMatch(p, &r.Match, remote, dst, proto, port) {
					continue
				}
				switch r.Action {
				case compile.ActionAccept:
					return true, r.Reason
				case compile.ActionDeny:
					return false, r.Reason
				}
				passed = r.Reason
				break tier
			}
		}
	}
	if passed != "" {
		return true, passed
	}
	if d == compile.Egress {
		return true, evaluate.ReasonEgressNotIsolated
	}
	return true, evaluate.ReasonIngressNotIsolated
}

// refMatch checks a rule's peers against the remote end and its ports
// against the destination.
func refMatch(p *compile.Program, m *compile.Match, remote, dst refEnd, proto compile.Protocol, port uint16) bool {
	peer := m.AllPeers || compile.RangesContain(m.IPBlocks, remote.addr)
	for _, s := range m.Selectors {
		peer = peer || remote.ok && p.Selectors[s].Contains(remote.id)
	}
	for _, n := range m.Nodes {
		peer = peer || p.NodeSets[n].Contains(remote.addr)
	}
	if !peer {
		return false
	}
	if m.AllPorts {
		return true
	}
	for _, r := range m.Ports {
		if r.Protocol == proto && r.First <= port && port <= r.Last {
			return true
		}
	}
	for _, np := range m.NamedPorts {
		if np.Protocol != 0 && np.Protocol != proto || !dst.ok {
			continue
		}
		if n, ok := p.Pods[dst.id].NamedPort(np.Name, proto); ok && n == port {
			return true
		}
	}
	return false
}
