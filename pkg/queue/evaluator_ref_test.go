package queue_test

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
	"github.com/nftpolicy/nftpolicy/pkg/queue"
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
				}
				return prog.Pods[rng.IntN(len(prog.Pods))].IPs[0]
			}
			ports := []uint16{53, 443, 7003, 8050, 8080, 8081, 9090, 9091, 50051}
			protos := []compile.Protocol{compile.ProtoTCP, compile.ProtoTCP, compile.ProtoUDP, compile.ProtoSCTP}
			for i := 0; i < 20000; i++ {
				src, dst := addr(), addr()
				proto, port := protos[rng.IntN(len(protos))], ports[rng.IntN(len(ports))]
				got := queue.Evaluate(prog, src, dst, proto, port)
				want := refEvaluate(prog, src, dst, proto, port)
				if got != want {
					t.Fatalf("%s -> %s %v/%d:\n got %+v\nwant %+v", src, dst, proto, port, got, want)
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

// Evaluate decides a new connection from src to dst with the given protocol
// and destination port, using the same policy model the kernel ruleset is
// rendered from. Egress is decided for a local source pod, ingress for a
// local destination pod. It does not allocate.
func refEvaluate(p *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16) queue.Verdict {
	src, dst = src.Unmap(), dst.Unmap()
	srcID, srcIsPod := p.PodByIP(src)
	dstID, dstIsPod := p.PodByIP(dst)
	var srcPod, dstPod *compile.Pod
	if srcIsPod {
		srcPod = &p.Pods[srcID]
	}
	if dstIsPod {
		dstPod = &p.Pods[dstID]
	}
	v := queue.Verdict{Egress: true, Ingress: true, EgressReason: queue.ReasonEgressNotIsolated, IngressReason: queue.ReasonIngressNotIsolated}
	if srcIsPod && dstIsPod && srcID == dstID {
		// The API documentation: a pod cannot block access to itself (for
		// example through a Service that load-balances back to it).
		v.Allowed, v.EgressReason, v.IngressReason = true, queue.ReasonSelf, queue.ReasonSelf
		return v
	}

	// Egress of the source pod.
	switch {
	case srcPod == nil:
	case !srcPod.Local:
		v.EgressReason = queue.ReasonNotEnforcedHere
	default:
		v.Egress, v.EgressReason = refDecideDirection(p, srcPod, compile.Egress, dstPod, dst, dstPod, proto, port)
	}

	// Ingress of the destination pod. Traffic from the pod's own node (kubelet
	// probes among it) is never filtered: no ingress peer of either API can
	// name a node, and the kernel does not filter the node's output.
	switch {
	case dstPod == nil:
	case !dstPod.Local:
		v.IngressReason = queue.ReasonNotEnforcedHere
	case srcPod == nil && p.IsOwnNode(dstPod, src):
		if dstPod.IngressTable >= 0 || len(dstPod.AdminIngress) > 0 || len(dstPod.BaselineIngress) > 0 {
			v.IngressReason = queue.ReasonNodeTraffic
		}
	default:
		v.Ingress, v.IngressReason = refDecideDirection(p, dstPod, compile.Ingress, srcPod, src, dstPod, proto, port)
	}
	v.Allowed = v.Egress && v.Ingress
	return v
}

// decideDirection decides one side of a connection for a local pod: the
// Admin tier, then the NetworkPolicies isolating the pod, then the Baseline
// tier, then allow. The remote end is the destination for egress, the
// source for ingress.
func refDecideDirection(p *compile.Program, pod *compile.Pod, d compile.Direction,
	remotePod *compile.Pod, remote netip.Addr, dstPod *compile.Pod,
	proto compile.Protocol, port uint16) (bool, string) {
	passed := ""
	if ids := pod.ClusterPolicies(compile.TierAdmin, d); len(ids) > 0 {
		switch a, reason := refDecideTier(p, ids, d, remotePod, remote, dstPod, proto, port); a {
		case compile.ActionAccept:
			return true, reason
		case compile.ActionDeny:
			return false, reason
		case compile.ActionPass:
			passed = reason
		}
	}
	table := pod.IngressTable
	if d == compile.Egress {
		table = pod.EgressTable
	}
	if table >= 0 {
		if remotePod == nil && p.IsOwnNode(pod, remote) {
			return true, queue.ReasonNodeTraffic
		}
		return refDecide(p, pod, d, remotePod, remote, dstPod, proto, port)
	}
	if ids := pod.ClusterPolicies(compile.TierBaseline, d); len(ids) > 0 {
		switch a, reason := refDecideTier(p, ids, d, remotePod, remote, dstPod, proto, port); a {
		case compile.ActionAccept:
			return true, reason
		case compile.ActionDeny:
			return false, reason
		case compile.ActionPass:
			passed = reason
		}
	}
	if passed != "" {
		return true, passed
	}
	if d == compile.Egress {
		return true, queue.ReasonEgressNotIsolated
	}
	return true, queue.ReasonIngressNotIsolated
}

// decideTier walks one tier's ClusterNetworkPolicies in precedence order and
// their rules in written order; the first rule that matches decides (0 when
// none does).
func refDecideTier(p *compile.Program, ids []compile.ClusterPolicyID, d compile.Direction,
	remotePod *compile.Pod, remote netip.Addr, dstPod *compile.Pod,
	proto compile.Protocol, port uint16) (compile.Action, string) {
	for _, id := range ids {
		rules := p.ClusterPolicies[id].Rules(d)
		for i := range rules {
			r := &rules[i]
			if r.Disabled {
				continue
			}
			if refPeerMatches(p, &r.Match, remotePod, remote) && refPortMatches(&r.Match, dstPod, proto, port) {
				return r.Action, r.Reason
			}
		}
	}
	return 0, ""
}

// peerMatches checks the remote end against a ClusterNetworkPolicy rule's peers.
func refPeerMatches(p *compile.Program, m *compile.Match, remotePod *compile.Pod, remote netip.Addr) bool {
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

// decide looks the connection up in the decision table of the policies
// isolating pod in direction d. The remote end (a pod or nil, and its
// address) is the source for ingress, the destination for egress. When
// several rules allow, the reason names the first in program order.
func refDecide(p *compile.Program, pod *compile.Pod, d compile.Direction,
	remotePod *compile.Pod, remote netip.Addr, dstPod *compile.Pod,
	proto compile.Protocol, port uint16) (bool, string) {
	ti, denied := pod.IngressTable, pod.IngressDenied
	if d == compile.Egress {
		ti, denied = pod.EgressTable, pod.EgressDenied
	}
	t := &p.Tables[ti]
	var best *compile.Rule
	for _, r := range t.AnyPeer {
		if refPortMatches(&r.Match, dstPod, proto, port) {
			best = r
			break
		}
	}
	if remotePod != nil {
		// Merge the pod's sorted memberships with the table's sorted selectors.
		m, bs := remotePod.MemberOf, t.BySelector
		for i, j := 0, 0; i < len(m) && j < len(bs); {
			switch {
			case m[i] < bs[j].Selector:
				i++
			case m[i] > bs[j].Selector:
				j++
			default:
				r := bs[j].Rule
				if (best == nil || r.Order < best.Order) && refPortMatches(&r.Match, dstPod, proto, port) {
					best = r
				}
				j++
			}
		}
	}
	for _, r := range t.Blocks {
		if best != nil && r.Order > best.Order {
			break
		}
		if compile.RangesContain(r.IPBlocks, remote) && refPortMatches(&r.Match, dstPod, proto, port) {
			best = r
			break
		}
	}
	if best == nil {
		return false, denied
	}
	return true, best.AllowReason
}

// portMatches checks the destination port; named ports resolve on the
// destination pod and match nothing when the destination is not a pod.
func refPortMatches(r *compile.Match, dstPod *compile.Pod, proto compile.Protocol, port uint16) bool {
	if r.AllPorts {
		return true
	}
	for _, pr := range r.Ports {
		if pr.Protocol == proto && pr.First <= port && port <= pr.Last {
			return true
		}
	}
	if dstPod != nil {
		for _, np := range r.NamedPorts {
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
