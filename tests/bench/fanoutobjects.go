package bench

import (
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The fanout section's objects have the shape of what a cluster's
// controllers write, so that a watch event weighs what it weighs there.
// The Pod is modelled on `kubectl get pod -o yaml` of a Deployment's pod on
// a kubeadm cluster: ownerReferences to its ReplicaSet, the template's
// labels plus pod-template-hash, an application container and a sidecar
// with ports, env (literal and from the downward API), resources, probes
// and mounts, a ConfigMap and an emptyDir volume, then what admission adds
// on the real API server (the ServiceAccount token's projected volume and
// mounts, default tolerations, priority, enableServiceLinks), and a
// kubelet-written status (conditions, IPs, container statuses). It is
// written as kube-controller-manager (spec) and as kubelet (status), so its
// managedFields are the API server's own, as on a cluster.

// fanoutFieldManagers are the writers of the objects, as on a cluster.
const (
	controllerManager = "kube-controller-manager"
	kubeletManager    = "kubelet"
)

// fanoutPod returns the i-th pod of a Deployment, on node.
func fanoutPod(ns, deploy string, i int, node string) *corev1.Pod {
	hash := "7d4b9c8f6d"
	labels := map[string]string{"app.kubernetes.io/name": deploy, "app.kubernetes.io/part-of": "shop",
		"app.kubernetes.io/version": "v1.42.0", "tier": "backend", "pod-template-hash": hash}
	t := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: fmt.Sprintf("%s-%s-%05d", deploy, hash, i), GenerateName: deploy + "-" + hash + "-",
			Labels: labels,
			Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-30T10:12:44Z",
				"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: deploy + "-" + hash,
				UID: types.UID(fmt.Sprintf("6f1c2a8e-%04x-4c1d-9a57-3e8b1f0d%04x", i%65536, len(deploy))), Controller: &t, BlockOwnerDeletion: &t}},
		},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{fanoutAppContainer(deploy), fanoutSidecar()},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: deploy + "-config"}}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
			TerminationGracePeriodSeconds: new(int64(30)),
		},
	}
}

func fanoutAppContainer(deploy string) corev1.Container {
	probe := func(path string, delay int32) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("http")}},
			InitialDelaySeconds: delay, PeriodSeconds: 10, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3}
	}
	field := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}}}
	}
	return corev1.Container{
		Name: deploy, Image: "registry.example.com/shop/" + deploy + ":v1.42.0",
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
			{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}},
		Env: []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "HTTP_PORT", Value: "8080"},
			{Name: "DB_HOST", Value: "postgres.shop.svc.cluster.local"}, {Name: "CACHE_URL", Value: "redis://redis.shop.svc:6379/0"},
			{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: "http://otel-collector.monitoring.svc:4317"},
			field("POD_NAME", "metadata.name"), field("POD_NAMESPACE", "metadata.namespace"), field("POD_IP", "status.podIP"),
			field("NODE_NAME", "spec.nodeName")},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}},
		VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/" + deploy, ReadOnly: true},
			{Name: "tmp", MountPath: "/tmp"}},
		LivenessProbe: probe("/healthz", 15), ReadinessProbe: probe("/readyz", 5),
		ImagePullPolicy: corev1.PullIfNotPresent,
		SecurityContext: &corev1.SecurityContext{RunAsNonRoot: new(true), ReadOnlyRootFilesystem: new(true),
			AllowPrivilegeEscalation: new(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
	}
}

func fanoutSidecar() corev1.Container {
	return corev1.Container{
		Name: "log-shipper", Image: "registry.example.com/infra/fluent-bit:3.2.1",
		Args: []string{"--config=/fluent-bit/etc/fluent-bit.yaml", "--quiet"},
		Env:  []corev1.EnvVar{{Name: "FLUENT_OUTPUT", Value: "loki.monitoring.svc:3100"}},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("20m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
		VolumeMounts:    []corev1.VolumeMount{{Name: "tmp", MountPath: "/var/log/app", ReadOnly: true}},
		ImagePullPolicy: corev1.PullIfNotPresent,
	}
}

// fanoutPodIP is the i-th pod's address, unique in 10.0.0.0/8.
func fanoutPodIP(i int) string {
	return netip.AddrFrom4([4]byte{10, byte(1 + i>>16), byte(i >> 8), byte(i)}).String()
}

// fanoutPodStatus fills a running pod's status as its kubelet reports it;
// ready sets the Ready conditions (the change the section makes).
func fanoutPodStatus(p *corev1.Pod, ip, hostIP string, ready bool, at time.Time) {
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		s := corev1.ConditionTrue
		if !ok {
			s = corev1.ConditionFalse
		}
		return corev1.PodCondition{Type: t, Status: s, LastTransitionTime: metav1.NewTime(at)}
	}
	start := metav1.NewTime(at.Add(-time.Hour).Truncate(time.Second))
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBurstable,
		Conditions: []corev1.PodCondition{cond("PodReadyToStartContainers", true), cond(corev1.PodInitialized, true),
			cond(corev1.PodReady, ready), cond(corev1.ContainersReady, ready), cond(corev1.PodScheduled, true)},
		HostIP: hostIP, HostIPs: []corev1.HostIP{{IP: hostIP}}, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		StartTime: &start,
	}
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image + "@sha256:3f5b8e2d9c1a7f4e6b0d2c8a9e1f3b5d7c9a0e2f4b6d8c1a3e5f7b9d0c2a4e6f",
			ContainerID: "containerd://" + fmt.Sprintf("%064x", len(p.Name)*7919+len(c.Name)),
			Ready:       ready, Started: new(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: start}},
			VolumeMounts: []corev1.VolumeMountStatus{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount",
				ReadOnly: true, RecursiveReadOnly: new(corev1.RecursiveReadOnlyDisabled)}},
		})
	}
}

// fanoutEndpointSlice is a Service's EndpointSlice as the EndpointSlice
// controller writes it: one endpoint per pod (address, conditions, node,
// zone, the pod's reference) and the Service's port.
func fanoutEndpointSlice(ns, svc string, pods []*corev1.Pod) *discoveryv1.EndpointSlice {
	t := true
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc + "-x7k2p", GenerateName: svc + "-",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
				"app.kubernetes.io/name": svc},
			Annotations: map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-07T10:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc,
				UID: "0b9d5e3c-1f2a-4e7b-8c6d-5a4f3e2d1c0b", Controller: &t, BlockOwnerDeletion: &t}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
	}
	for _, p := range pods {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)},
			NodeName:   new(p.Spec.NodeName), Zone: new("zone-a"),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		})
	}
	return es
}

// fanoutService is the Service of a Deployment's pods.
func fanoutService(ns, name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app.kubernetes.io/name": name}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app.kubernetes.io/name": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}},
	}
}

// fanoutNode is a node as its kubelet registers it (addresses, capacity,
// labels), without images or heartbeats.
func fanoutNode(name string, i int) *corev1.Node {
	ip := netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)}).String()
	cap := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi"),
		corev1.ResourcePods: resource.MustParse("110")}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
			"kubernetes.io/arch": "amd64", "topology.kubernetes.io/zone": "zone-a", "node.kubernetes.io/instance-type": "m6i.4xlarge"}},
		Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.%d.%d.0/24", 100+i>>8, i&255)},
		Status: corev1.NodeStatus{Capacity: cap, Allocatable: cap,
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}},
	}
}
