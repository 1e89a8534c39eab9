package bench

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// The scale benchmark's cluster is pkg/sets' sync benchmark's: namespaces of
// 100 pods (labels app=app-<j%20>, tier=web|api|db; named ports http,
// metrics, grpc), namespaces labelled team and env, and a mix of policies.
// Its pods live on fake nodes: no kubelet, no namespace, only API objects.
const podsPerNS = 100

func scaleNSName(i int) string { return fmt.Sprintf("ns-%04d", i) }

func scaleNSLabels(i int) map[string]string {
	env := "prod"
	if i%2 == 1 {
		env = "dev"
	}
	return map[string]string{"team": fmt.Sprintf("t%d", i%10), "env": env}
}

var tiers = []string{"web", "api", "db"}

// scalePodIP is pod j of namespace i: 10.<16+i/256>.<i%256>.<j+1>, outside
// the lab's 10.244.0.0/16.
func scalePodIP(i, j int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(16 + i/256), byte(i % 256), byte(j + 1)})
}

func scalePorts(j int) []corev1.ContainerPort {
	return []corev1.ContainerPort{
		{Name: "http", ContainerPort: 8080 + int32(j%5/4), Protocol: corev1.ProtocolTCP},
		{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
		{Name: "grpc", ContainerPort: 50051, Protocol: corev1.ProtocolTCP},
	}
}

// scalePod is the API object of pod j of namespace i, on a fake node.
func scalePod(i, j, fakeNodes int) *corev1.Pod {
	no := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: scaleNSName(i), Name: fmt.Sprintf("pod-%02d", j),
			Labels: map[string]string{"app": fmt.Sprintf("app-%d", j%20), "tier": tiers[j%3]}},
		Spec: corev1.PodSpec{
			NodeName:                     fmt.Sprintf("fake-%d", (i+j)%fakeNodes),
			AutomountServiceAccountToken: &no,
			Containers:                   []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Ports: scalePorts(j)}},
		},
	}
}

// scalePolicies returns the policies of pkg/sets' sync benchmark over nNS
// namespaces.
func scalePolicies(nNS, nPolicies int) []*networkingv1.NetworkPolicy {
	return ct.Policies(nNS, nPolicies)
}

// parallel runs fn(0..n-1) on workers goroutines and returns the first
// error; it stops handing out work after an error or when ctx ends.
func parallel(ctx context.Context, n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// createScalePod creates the pod and reports it Running with its IP, as a
// kubelet would (two writes: the status of a created pod is reset).
func createScalePod(ctx context.Context, cs kubernetes.Interface, i, j, fakeNodes int) error {
	p := scalePod(i, j, fakeNodes)
	obj, err := cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	ip := scalePodIP(i, j).String()
	now := metav1.Now()
	obj.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, StartTime: &now,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}}
	if _, err := cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting the status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// scaleClusterPolicies are n ClusterNetworkPolicies over the scale
// benchmark's namespaces, alternating between the Admin and Baseline tiers
// in groups of four, with the mix of selectors and actions the compiler
// treats differently: pod subjects by team and tier with a pod peer and a
// namespace peer; namespace subjects by env with a networks peer on a port;
// pod subjects by app denying a named port (the experimental channel) to
// a namespace peer; namespace subjects by team passing (Admin) or
// accepting pods of another tier.
func scaleClusterPolicies(n int) []*npav1beta1.ClusterNetworkPolicy {
	var out []*npav1beta1.ClusterNetworkPolicy
	team := func(k int) string { return fmt.Sprintf("t%d", k%10) }
	for i := range n {
		tier, action := "Admin", "Pass"
		if (i/4)%2 == 1 {
			tier, action = "Baseline", "Accept"
		}
		name, prio := fmt.Sprintf("scale-%03d", i), int32(i%1001)
		var cnp *npav1beta1.ClusterNetworkPolicy
		switch i % 4 {
		case 0:
			cnp = ct.CNP(name, tier, prio, ct.PodsSubject(ct.Sel("team", team(i)), ct.Sel("tier", tiers[i%3])),
				ct.CNPIngress(ct.CNPRule("web", "Accept", ct.ToPods(ct.Sel("team", team(i+1)), ct.Sel("tier", "web"))).On(ct.Proto("TCP", int32(8080+i%5)))),
				ct.CNPEgress(ct.CNPRule("other-team", "Deny", ct.ToNamespaces(ct.Sel("team", team(i+5))))))
		case 1:
			cnp = ct.CNP(name, tier, prio, ct.NamespacesSubject(ct.Sel("env", "dev")),
				ct.CNPEgress(ct.CNPRule("net", "Deny", ct.ToNetworks(fmt.Sprintf("10.%d.0.0/16", 16+i%6))).On(ct.Proto("TCP", int32(9000+i)))))
		case 2:
			cnp = ct.CNP(name, tier, prio, ct.PodsSubject(ct.Sel(), ct.Sel("app", fmt.Sprintf("app-%d", i%20))),
				ct.CNPIngress(ct.CNPRule("dev-grpc", "Deny", ct.ToNamespaces(ct.Sel("env", "dev"))).On(ct.DestinationNamedPort("grpc"))))
		default:
			cnp = ct.CNP(name, tier, prio, ct.NamespacesSubject(ct.Sel("team", team(i))),
				ct.CNPIngress(ct.CNPRule("api", action, ct.ToPods(ct.Sel(), ct.Sel("tier", "api"))).On(ct.Proto("TCP", 50051))),
				ct.CNPEgress(ct.CNPRule("own-team", "Accept", ct.ToPods(ct.Sel("team", team(i)), ct.Sel()))))
		}
		out = append(out, cnp)
	}
	return out
}
