package slim

import (
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// fatPod dresses a synthetic pod the way the API server returns a real one:
// managed fields, annotations, owner references, an image, env, resources,
// volumes and mounts, probes, an unnamed port, an init container that is
// not a sidecar, a sidecar with a named port, conditions and container
// statuses. The transform must keep what the compiler reads and drop the rest.
func fatPod(p *corev1.Pod, i int) *corev1.Pod {
	p = p.DeepCopy()
	always := corev1.ContainerRestartPolicyAlways
	now := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	p.UID = types.UID(fmt.Sprintf("0b5bd9a6-3f1c-4b7e-9a55-%012d", i))
	p.ResourceVersion = strconv.Itoa(100000 + i)
	p.CreationTimestamp = now
	p.GenerateName = p.Name[:len(p.Name)-1]
	p.Annotations = map[string]string{
		"kubectl.kubernetes.io/restartedAt": now.String(),
		"prometheus.io/scrape":              "true",
		"checksum/config":                   fmt.Sprintf("%064x", i),
	}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: p.Namespace + "-rs", UID: "5f0e"}}
	p.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now,
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:tier":{}},"f:ownerReferences":{}},"f:spec":{"f:containers":{"k:{\"name\":\"main\"}":{".":{},"f:image":{},"f:name":{},"f:ports":{}}}}}`)},
		{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, Subresource: "status",
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:conditions":{},"f:containerStatuses":{},"f:hostIP":{},"f:phase":{},"f:podIP":{},"f:podIPs":{},"f:startTime":{}}}`)},
	}
	main := &p.Spec.Containers[0]
	main.Image = "registry.example.com/team/app:v1.2.3"
	main.Args = []string{"--listen=:8080", "--metrics=:9090", "--log-level=info"}
	main.Env = []corev1.EnvVar{{Name: "POD_NAME", Value: p.Name}, {Name: "NAMESPACE", Value: p.Namespace}, {Name: "GOMAXPROCS", Value: "2"}}
	main.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	main.VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	main.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz"}}, PeriodSeconds: 10}
	main.Ports = append(main.Ports, corev1.ContainerPort{ContainerPort: 8443, Protocol: corev1.ProtocolTCP})
	p.Spec.InitContainers = []corev1.Container{
		{Name: "migrate", Image: "registry.example.com/team/migrate:v1", Ports: []corev1.ContainerPort{{Name: "not-a-sidecar", ContainerPort: 7000}}},
		{Name: "proxy", Image: "registry.example.com/mesh/proxy:v3", RestartPolicy: &always,
			Ports: []corev1.ContainerPort{{Name: "mesh-admin", ContainerPort: 15000, Protocol: corev1.ProtocolTCP}}},
	}
	p.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}}
	p.Spec.ServiceAccountName = "default"
	p.Spec.Tolerations = []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
	p.Status.HostIP = "192.168.0.10"
	p.Status.StartTime = &now
	p.Status.QOSClass = corev1.PodQOSBurstable
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Ready: true, Image: main.Image,
		ImageID: "registry.example.com/team/app@sha256:" + strings.Repeat("ab", 32), ContainerID: "containerd://" + fmt.Sprintf("%064x", i)}}
	return p
}

// TestSlimPodKeepsWhatPoliciesRead checks that programs built from the
// transformed pods equal those built from the full ones, that the transform
// is idempotent (client-go may apply it to a stored object again) and that
// it keeps no field the compiler does not read.
func TestSlimPodKeepsWhatPoliciesRead(t *testing.T) {
	in := compiletest.Cluster(500, 200, 5)
	in.Policies = append(in.Policies, namedPortPolicy("ns-0001", "mesh-admin"), namedPortPolicy("ns-0002", "not-a-sidecar"))
	slim := in
	slim.Pods = nil
	for i, p := range in.Pods {
		fat := fatPod(p, i)
		if i%7 == 0 {
			fat.Status.PodIPs = append(fat.Status.PodIPs, corev1.PodIP{IP: fmt.Sprintf("fd00::%x", i+1)})
		}
		in.Pods[i] = fat
		obj, err := Transform(fat)
		if err != nil {
			t.Fatal(err)
		}
		s := obj.(*compile.PodInfo)
		// client-go may give the transform a stored object again.
		if again, err := Transform(s); err != nil || again != s {
			t.Fatalf("the transform does not pass a PodInfo through: %v, %v", again, err)
		}
		if len(s.Ports) != 4 || s.Annotations != nil {
			t.Fatalf("Pod kept more than policies read: %+v", s)
		}
		slim.PodInfos = append(slim.PodInfos, s)
	}
	for _, node := range []string{"", "node-1"} {
		in.NodeName, slim.NodeName = node, node
		want, got := compile.Build(in), compile.Build(slim)
		if len(want.Pods) != len(in.Pods) {
			t.Fatalf("built %d pods from %d", len(want.Pods), len(in.Pods))
		}
		if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{}), cmpopts.IgnoreFields(compile.PodInfo{}, "Ports", "ResourceVersion", "CreationTimestamp", "Annotations"), cmpopts.IgnoreFields(compile.EvalIndex{}, "PodPorts"),
			cmpopts.IgnoreFields(compile.Program{}, "Source")); diff != "" {
			t.Fatalf("node %q: program from slim pods differs (-full +slim):\n%s", node, diff)
		}
		// Only named ports may differ: unnamed ones never resolve.
		for i := range want.Pods {
			var named []compile.ContainerPort
			for _, cp := range want.Pods[i].Ports {
				if cp.Name != "" {
					named = append(named, cp)
				}
			}
			if diff := cmp.Diff(named, got.Pods[i].Ports); diff != "" {
				t.Fatalf("pod %s: named ports differ (-full +slim):\n%s", want.Pods[i].Key, diff)
			}
		}
		wantRS, err := compile.Render(want, compile.RenderConfig{})
		if err != nil {
			t.Fatal(err)
		}
		gotRS, err := compile.Render(got, compile.RenderConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(wantRS, gotRS, cmp.Exporter(func(reflect.Type) bool { return true })); diff != "" {
			t.Fatalf("node %q: ruleset from slim pods differs (-full +slim):\n%s", node, diff)
		}
	}
}

// namedPortPolicy isolates every pod of ns for ingress and admits any peer
// on the named port.
// TestSharedValues checks that equal values are shared, that different
// ones are not, and that the table forgets what a whole generation did not
// ask for.
func TestSharedValues(t *testing.T) {
	a := internLabels(map[string]string{"app": "web", "tier": "db"})
	b := internLabels(map[string]string{"tier": "db", "app": "web"})
	c := internLabels(map[string]string{"app": "web", "tier": "dbx"})
	d := internLabels(map[string]string{"app": "webt", "ier": "db"})
	same := func(x, y map[string]string) bool {
		return reflect.ValueOf(x).UnsafePointer() == reflect.ValueOf(y).UnsafePointer()
	}
	if !same(a, b) || same(a, c) || same(a, d) || !cmp.Equal(d, map[string]string{"app": "webt", "ier": "db"}) {
		t.Errorf("label maps: shared equal %v, shared different %v %v", same(a, b), same(a, c), same(a, d))
	}
	p1 := sharedNamedPorts([]compile.ContainerPort{{Name: "http", Port: 80, Protocol: compile.ProtoTCP}, {Port: 81}})
	p2 := sharedNamedPorts([]compile.ContainerPort{{Name: "http", Port: 80, Protocol: compile.ProtoTCP}})
	p3 := sharedNamedPorts([]compile.ContainerPort{{Name: "http", Port: 80, Protocol: compile.ProtoUDP}})
	if &p1[0] != &p2[0] || &p1[0] == &p3[0] {
		t.Errorf("port lists: shared equal %v, shared different %v", &p1[0] == &p2[0], &p1[0] == &p3[0])
	}

	s := sharedValues[int]{limit: 4}
	build := func(v int) func() int { return func() int { return v } }
	s.get([]byte("kept"), build(1))
	for i := range 10 {
		s.get([]byte(strconv.Itoa(i)), build(i))
		s.get([]byte("kept"), build(-1)) // asked for every generation: never rebuilt
	}
	if v := s.get([]byte("kept"), build(-1)); v != 1 {
		t.Errorf("a value in use was rebuilt: %d", v)
	}
	if v := s.get([]byte("0"), build(-1)); v != -1 {
		t.Errorf("a value unused for a generation was kept: %d", v)
	}
	if n := len(s.cur) + len(s.prev); n > 2*s.limit {
		t.Errorf("%d entries, want at most %d", n, 2*s.limit)
	}
}

func namedPortPolicy(ns, port string) *networkingv1.NetworkPolicy {
	name := intstr.FromString(port)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "allow-" + port},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{
			{Ports: []networkingv1.NetworkPolicyPort{{Port: &name}}},
		}},
	}
}

// BenchmarkFootprint measures what the agent holds for a cluster of n pods:
// the informers' transformed pods (PodInfos), namespaces and policies, the
// tracker with its program and rendered ruleset (the syncer keeps the same
// one), after a collection. Pods are dressed as the API server returns them
// (fatPod) and transformed one by one, as the informer does. It reports
// heap-MB (runtime.MemStats.HeapInuse) and rss-MB (VmRSS, after returning
// free memory to the OS); the loop runs once, whatever b.N.
func BenchmarkFootprint(b *testing.B) {
	for _, n := range []int{10000, 50000} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			for b.Loop() {
				heap, rss := footprint(b, n)
				b.ReportMetric(heap, "heap-MB")
				b.ReportMetric(rss, "rss-MB")
			}
		})
	}
}

func footprint(b *testing.B, n int) (heapMB, rssMB float64) {
	synthetic := compiletest.Cluster(n, n/10, n/100)
	in := compile.Input{NodeName: "node-1", NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.0.1")}}
	for i, p := range synthetic.Pods {
		obj, _ := Transform(fatPod(p, i))
		in.PodInfos = append(in.PodInfos, obj.(*compile.PodInfo))
	}
	synthetic.Pods = nil
	for _, ns := range synthetic.Namespaces {
		obj, _ := Transform(ns)
		in.Namespaces = append(in.Namespaces, obj.(*corev1.Namespace))
	}
	in.Policies = synthetic.Policies
	tr, err := compile.NewTracker(compile.RenderConfig{})
	if err != nil {
		b.Fatal(err)
	}
	prog, rs, err := tr.Rebuild(in)
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss := readRSS(b)
	runtime.KeepAlive(in)
	runtime.KeepAlive(tr)
	runtime.KeepAlive(prog)
	runtime.KeepAlive(rs)
	return float64(ms.HeapInuse) / (1 << 20), float64(rss) / (1 << 20)
}

// readRSS returns the process's resident set size in bytes.
func readRSS(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skipf("no /proc/self/status, RSS unknown: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				b.Fatalf("parsing %q: %v", line, err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}
