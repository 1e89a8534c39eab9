package queue_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// TestEvaluateAllocs checks that deciding a connection allocates nothing,
// whatever the verdict and whichever side decides it.
func TestEvaluateAllocs(t *testing.T) {
	g := gridState{pods: []string{"x/a", "x/b", "x/c", "y/a", "y/b"}}
	prog := compile.Build(g.input(policies(
		netpol("x", "deny-all", sel(), types(pIn, pEg), in(), eg()),
		netpol("x", "a-ingress", sel("pod", "a"), in(
			peers(podNsPeer(sel("pod", "b"), sel(nsName, "y"))).on(namedPort("serve-80-tcp", "")),
			peers(ipPeer("192.0.2.0/24", "192.0.2.128/25")).on(portRange(80, 90, "")))),
		netpol("x", "b-egress", sel("pod", "b"), types(pEg), eg(
			peers(nsPeer(sel(nsName, "y"))).on(namedPort("serve-81-tcp", ""), port(53, "UDP")),
			peers(ipPeer("198.51.100.0/24")))),
	)))
	ext := netip.MustParseAddr("192.0.2.7")
	var ev queue.Evaluator
	ev.Swap(prog)
	for _, c := range []struct {
		name     string
		src, dst netip.Addr
		port     uint16
		want     queue.Verdict
	}{
		{"ingress allowed by named port", gridIP("y/b"), gridIP("x/a"), 80, queue.Verdict{Allowed: true, Ingress: true, Egress: true}},
		{"ingress allowed by ipBlock", ext, gridIP("x/a"), 85, queue.Verdict{Allowed: true, Ingress: true, Egress: true}},
		{"ingress denied", gridIP("y/a"), gridIP("x/a"), 80, queue.Verdict{Ingress: false, Egress: true}},
		{"egress allowed", gridIP("x/b"), gridIP("y/a"), 81, queue.Verdict{Allowed: true, Ingress: true, Egress: true}},
		{"egress denied", gridIP("x/b"), gridIP("y/a"), 80, queue.Verdict{Ingress: true, Egress: false}},
		{"egress denied to an external host", gridIP("x/c"), ext, 80, queue.Verdict{Ingress: true, Egress: false}},
		{"not isolated", gridIP("y/a"), gridIP("y/b"), 80, queue.Verdict{Allowed: true, Ingress: true, Egress: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var v queue.Verdict
			if n := testing.AllocsPerRun(1000, func() { v = queue.Evaluate(prog, c.src, c.dst, tcp, c.port) }); n != 0 {
				t.Errorf("Evaluate: %v allocs per run, want 0", n)
			}
			if v.Allowed != c.want.Allowed || v.Ingress != c.want.Ingress || v.Egress != c.want.Egress {
				t.Errorf("verdict allowed=%v ingress=%v egress=%v, want %v %v %v: %s",
					v.Allowed, v.Ingress, v.Egress, c.want.Allowed, c.want.Ingress, c.want.Egress, v.Reason())
			}
			pkt := queue.Packet{Family: 4, Src: c.src, Dst: c.dst, Proto: uint8(tcp), SrcPort: 40000, DstPort: c.port}
			var ok bool
			if n := testing.AllocsPerRun(1000, func() { ok, _ = ev.Decide(pkt) }); n != 0 {
				t.Errorf("Evaluator.Decide: %v allocs per run, want 0", n)
			}
			if ok != c.want.Allowed {
				t.Errorf("Evaluator.Decide: %v, want %v", ok, c.want.Allowed)
			}
		})
	}
}

// The benchmark cluster: 100 namespaces of 100 pods.
//
//   - Namespace i is "ns-<i>" with labels team=t<i%10>, env=prod|dev.
//   - Pod j of namespace i is 10.244.<i>.<j+1> with labels app=app-<j%20> and
//     tier=web|api|db, and serves http (8080), metrics (9090) and grpc
//     (50051); the same names map to other numbers on every fifth pod.
//   - Policy k lives in namespace k%100. Namespaces with i%4 == 0 have a
//     default-deny-ingress policy, those with i%10 == 5 a default-deny-egress
//     policy with one rule allowing DNS and the namespace's own pods. The
//     other policies select app=app-<..> and have 1-3 ingress rules mixing
//     podSelector, namespaceSelector (alone and with a podSelector), ipBlock
//     with except, numbered, named and ranged ports.
const (
	benchNamespaces = 100
	benchPodsPerNS  = 100
)

func benchPodIP(ns, pod int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 244, byte(ns), byte(pod + 1)})
}

func benchCluster(nPolicies int) compile.Input {
	var input compile.Input
	tiers := []string{"web", "api", "db"}
	for i := 0; i < benchNamespaces; i++ {
		ns := fmt.Sprintf("ns-%02d", i)
		env := "prod"
		if i%2 == 1 {
			env = "dev"
		}
		input.Namespaces = append(input.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{compile.NamespaceNameLabel: ns, "team": fmt.Sprintf("t%d", i%10), "env": env}}})
		for j := 0; j < benchPodsPerNS; j++ {
			http, metrics := int32(8080), int32(9090)
			if j%5 == 4 {
				http, metrics = 8081, 9091
			}
			ip := benchPodIP(i, j).String()
			input.Pods = append(input.Pods, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pod-%02d", j),
					Labels: map[string]string{"app": fmt.Sprintf("app-%d", j%20), "tier": tiers[j%3]}},
				Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", j%50), Containers: []corev1.Container{{Name: "main", Ports: []corev1.ContainerPort{
					{Name: "http", ContainerPort: http, Protocol: corev1.ProtocolTCP},
					{Name: "metrics", ContainerPort: metrics, Protocol: corev1.ProtocolTCP},
					{Name: "grpc", ContainerPort: 50051, Protocol: corev1.ProtocolTCP},
				}}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
			})
		}
	}
	for k := 0; k < nPolicies; k++ {
		i, round := k%benchNamespaces, k/benchNamespaces
		ns := fmt.Sprintf("ns-%02d", i)
		name := fmt.Sprintf("policy-%05d", k)
		switch {
		case round == 0 && i%4 == 0:
			input.Policies = append(input.Policies, netpol(ns, name, sel(), types(pIn), in()))
			continue
		case round == 1 && i%10 == 5:
			input.Policies = append(input.Policies, netpol(ns, name, sel(), types(pEg), eg(
				peers(nsPeer(sel(compile.NamespaceNameLabel, "kube-system"))).on(port(53, "UDP"), port(53, "TCP")),
				peers(podPeer(sel())))))
			continue
		}
		var rules []rule
		for r := 0; r < k%3+1; r++ {
			switch (k + r) % 4 {
			case 0:
				rules = append(rules, peers(podPeer(sel("tier", "web"))).on(port(8080, "TCP")))
			case 1:
				rules = append(rules, peers(podNsPeer(sel("app", fmt.Sprintf("app-%d", (k/7)%20)), sel("team", fmt.Sprintf("t%d", k%10)))).on(namedPort("http", "")))
			case 2:
				rules = append(rules, peers(ipPeer("10.0.0.0/8", fmt.Sprintf("10.244.%d.0/24", (i+1)%benchNamespaces))).on(port(9090, ""), namedPort("metrics", "TCP")))
			case 3:
				rules = append(rules, peers(nsPeer(sel("env", "prod")), podPeer(sel("tier", "api"))).on(portRange(8000, 8100, "TCP"), namedPort("grpc", "")))
			}
		}
		input.Policies = append(input.Policies, netpol(ns, name, sel("app", fmt.Sprintf("app-%d", (round*7+i)%20)), in(rules...)))
	}
	return input
}

type benchPair struct {
	src, dst netip.Addr
	port     uint16
}

// benchPairs picks connections between random pods, half of them to pods
// isolated for ingress, on ports that some rules allow.
func benchPairs(prog *compile.Program, n int) []benchPair {
	rng := rand.New(rand.NewPCG(1, 2))
	var isolated []compile.PodID
	for i := range prog.Pods {
		if len(prog.Pods[i].IngressPolicies) > 0 {
			isolated = append(isolated, compile.PodID(i))
		}
	}
	ports := []uint16{8080, 8081, 9090, 8050, 50051, 443}
	out := make([]benchPair, n)
	for i := range out {
		src := &prog.Pods[rng.IntN(len(prog.Pods))]
		dst := &prog.Pods[rng.IntN(len(prog.Pods))]
		if i%2 == 0 && len(isolated) > 0 {
			dst = &prog.Pods[isolated[rng.IntN(len(isolated))]]
		}
		out[i] = benchPair{src.IPs[0], dst.IPs[0], ports[rng.IntN(len(ports))]}
	}
	return out
}

var benchSink queue.Verdict

func BenchmarkEvaluate(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			prog := compile.Build(benchCluster(n))
			if len(prog.Problems) > 0 {
				b.Fatalf("problems: %v", prog.Problems[0])
			}
			pairs := benchPairs(prog, 4096)
			allowedN := 0
			for _, p := range pairs {
				if queue.Evaluate(prog, p.src, p.dst, tcp, p.port).Allowed {
					allowedN++
				}
			}
			evaluateLoop(b, prog, pairs)
			b.ReportMetric(100*float64(allowedN)/float64(len(pairs)), "allowed-%")
		})
	}
}

// BenchmarkEvaluateHot cycles through 16 connections only, so the
// program's parts they touch stay in the CPU caches: the difference from
// BenchmarkEvaluate is the cost of cache misses.
func BenchmarkEvaluateHot(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			prog := compile.Build(benchCluster(n))
			pairs := benchPairs(prog, 16)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				p := &pairs[i%len(pairs)]
				benchSink = queue.Evaluate(prog, p.src, p.dst, tcp, p.port)
			}
		})
	}
}

// BenchmarkEvaluateWorst decides a connection from a pod to the pod selected
// by the most policies that every rule denies, so that every rule, selector
// and port is tried.
func BenchmarkEvaluateWorst(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			prog := compile.Build(benchCluster(n))
			worst := compile.PodID(0)
			for i := range prog.Pods {
				if len(prog.Pods[i].IngressPolicies) > len(prog.Pods[worst].IngressPolicies) {
					worst = compile.PodID(i)
				}
			}
			dst := prog.Pods[worst].IPs[0]
			src := netip.MustParseAddr("192.0.2.1")
			for i := range prog.Pods {
				if v := queue.Evaluate(prog, prog.Pods[i].IPs[0], dst, tcp, 8080); !v.Ingress && len(prog.Pods[i].EgressPolicies) == 0 {
					src = prog.Pods[i].IPs[0]
					break
				}
			}
			if queue.Evaluate(prog, src, dst, tcp, 8080).Allowed && n > 10 {
				b.Fatal("worst case is allowed")
			}
			b.ReportAllocs()
			for b.Loop() {
				benchSink = queue.Evaluate(prog, src, dst, tcp, 8080)
			}
			rules := 0
			for _, id := range prog.Pods[worst].IngressPolicies {
				rules += len(prog.Policies[id].Ingress)
			}
			b.ReportMetric(float64(rules), "rules-tried")
		})
	}
}
