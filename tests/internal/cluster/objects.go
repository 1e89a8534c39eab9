package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/config"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// InstallManifest returns the path of install.yaml at the repository root.
func InstallManifest() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "install.yaml"), nil
}

// InstallDocuments splits install.yaml into its YAML documents, keeping those
// whose kind is in kinds (all when kinds is empty).
func InstallDocuments(kinds ...string) ([]string, error) {
	path, err := InstallManifest()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, doc := range strings.Split("\n"+string(data), "\n---") {
		kind := ""
		for _, line := range strings.Split(doc, "\n") {
			if k, ok := strings.CutPrefix(line, "kind: "); ok {
				kind = strings.TrimSpace(k)
				break
			}
		}
		if kind != "" && (len(kinds) == 0 || slices.Contains(kinds, kind)) {
			out = append(out, strings.TrimSpace(doc)+"\n")
		}
	}
	return out, nil
}

// InstallAgentConfig returns the agent configuration of install.yaml's
// ConfigMap nftpolicy-config, decoded as the agent decodes it (strict) and
// validated.
func InstallAgentConfig() (*config.AgentConfiguration, error) {
	docs, err := InstallDocuments("ConfigMap")
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal([]byte(d), &cm); err != nil {
			return nil, fmt.Errorf("install.yaml's ConfigMap: %w", err)
		}
		if cm.Name != "nftpolicy-config" {
			continue
		}
		c, err := config.Decode([]byte(cm.Data["config.yaml"]))
		if err != nil {
			return nil, fmt.Errorf("install.yaml's agent configuration: %w", err)
		}
		return c, c.Validate()
	}
	return nil, fmt.Errorf("install.yaml has no ConfigMap nftpolicy-config")
}

// installRBACKinds are the kinds of install.yaml the harness applies: the
// agents' ServiceAccount, ClusterRoles and binding, the Role and binding
// that let them read the publisher's synced Lease (--pod-source slices),
// and the CustomResourceDefinitions (NodeEnforcement, PodAddressSlice).
// The DaemonSet is left out (there is no kubelet to run it; the harness
// runs the agents itself), and so are the admission policies: the one on
// PodAddressSlices refuses every writer but the publisher's
// ServiceAccount, and tests write slices as the publisher would.
var installRBACKinds = []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "CustomResourceDefinition"}

// installRBAC returns install.yaml's documents of installRBACKinds and the
// names of its CustomResourceDefinitions, and fails when a kind is missing.
func installRBAC() (docs, crds []string, err error) {
	docs, err = InstallDocuments(installRBACKinds...)
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	for _, d := range docs {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(d), &obj); err != nil {
			return nil, nil, fmt.Errorf("install.yaml: %w", err)
		}
		seen[obj.Kind] = true
		if obj.Kind == "CustomResourceDefinition" {
			crds = append(crds, obj.Metadata.Name)
		}
	}
	for _, k := range installRBACKinds {
		if !seen[k] {
			return nil, nil, fmt.Errorf("install.yaml has no %s", k)
		}
	}
	return docs, crds, nil
}

// applyInstallRBAC applies installRBAC's documents with kubectl and waits
// for every CustomResourceDefinition to be established.
func (c *Cluster) applyInstallRBAC() error {
	docs, crds, err := installRBAC()
	if err != nil {
		return err
	}
	path := filepath.Join(c.logDir, "install-rbac.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		return err
	}
	if _, err := c.Env.Kubectl(c.t, "apply", "-f", path); err != nil {
		return fmt.Errorf("applying install.yaml's RBAC and CRDs: %w", err)
	}
	for _, crd := range crds {
		if _, err := c.Env.Kubectl(c.t, "wait", "--for=condition=Established", "--timeout=60s", "crd/"+crd); err != nil {
			return fmt.Errorf("waiting for the CRD %s: %w", crd, err)
		}
	}
	return nil
}

// Pod describes a pod the harness runs, as a kubelet would: an API object
// and a netlab namespace serving its container ports.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	// Node; empty means spread over the nodes in creation order.
	Node string
	// IPs; empty means the next free address of the node's 10.244.<n>.0/24.
	IPs []netip.Addr
	// Ports are the container ports; empty means serve-80-tcp (80/TCP).
	Ports []corev1.ContainerPort
	// ServeTCP and ServeUDP are more ports the pod's servers listen on
	// without declaring them as container ports (a scenario may probe
	// ports its pods do not list).
	ServeTCP, ServeUDP []uint16
}

// Key is "namespace/name".
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

// EnsureNamespace creates a namespace (and its "default" ServiceAccount, which
// pods need) or, when it exists, sets the given labels on it.
func (c *Cluster) EnsureNamespace(ctx context.Context, name string, labels map[string]string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		if len(labels) > 0 {
			return c.LabelNamespace(ctx, name, labels)
		}
	case err != nil:
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := c.Client.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the default ServiceAccount of %s: %w", name, err)
	}
	return nil
}

// labelPatch is a JSON merge patch setting labels and removing others.
func labelPatch(set map[string]string, remove []string) []byte {
	return metadataPatch("labels", set, remove)
}

// metadataPatch is a JSON merge patch setting keys of a metadata map
// (labels, annotations) and removing others.
func metadataPatch(field string, set map[string]string, remove []string) []byte {
	m := map[string]any{}
	for k, v := range set {
		m[k] = v
	}
	for _, k := range remove {
		m[k] = nil
	}
	data, _ := json.Marshal(map[string]any{"metadata": map[string]any{field: m}})
	return data
}

// AnnotateNamespace sets annotations on a namespace and removes the keys
// in remove.
func (c *Cluster) AnnotateNamespace(ctx context.Context, name string, set map[string]string, remove ...string) error {
	_, err := c.Client.CoreV1().Namespaces().Patch(ctx, name, types.MergePatchType, metadataPatch("annotations", set, remove), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("annotating namespace %s: %w", name, err)
	}
	return nil
}

// LabelNamespace sets labels on a namespace and removes the keys in remove.
func (c *Cluster) LabelNamespace(ctx context.Context, name string, set map[string]string, remove ...string) error {
	_, err := c.Client.CoreV1().Namespaces().Patch(ctx, name, types.MergePatchType, labelPatch(set, remove), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("labelling namespace %s: %w", name, err)
	}
	return nil
}

// LabelPod sets labels on a pod and removes the keys in remove.
func (c *Cluster) LabelPod(ctx context.Context, namespace, name string, set map[string]string, remove ...string) error {
	_, err := c.Client.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, labelPatch(set, remove), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("labelling pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// CreatePod creates the pod's namespace in the lab (servers on every
// container port, plus 80/TCP), then the API object bound to its node, then
// reports it Running with its IPs, as a kubelet and CNI would. The
// namespace must exist (EnsureNamespace).
func (c *Cluster) CreatePod(ctx context.Context, p Pod) (*corev1.Pod, error) {
	sp, err := c.StartPod(p)
	if err != nil {
		return nil, err
	}
	return c.PublishPod(ctx, sp)
}

// StartedPod is a pod whose lab namespace StartPod created and whose API
// object PublishPod has yet to create.
type StartedPod struct {
	pod Pod
	lp  *labPod
}

// Key is "namespace/name".
func (sp StartedPod) Key() string { return sp.lp.key }

// StartPod is CreatePod's first half: the pod's namespace in the lab, its
// interface up and its servers listening, while the API has no such pod
// (PodEndpoint finds it), so that it can send before any agent can know it
// (the new-pod window). PublishPod does the rest.
func (c *Cluster) StartPod(p Pod) (StartedPod, error) {
	lp, err := c.placePod(&p)
	if err != nil {
		return StartedPod{}, err
	}
	if len(p.Ports) == 0 {
		p.Ports = []corev1.ContainerPort{{Name: "serve-80-tcp", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}
	}
	lp.tcp = []uint16{80}
	for _, port := range p.ServeTCP {
		if !slices.Contains(lp.tcp, port) {
			lp.tcp = append(lp.tcp, port)
		}
	}
	for _, port := range p.ServeUDP {
		if !slices.Contains(lp.udp, port) {
			lp.udp = append(lp.udp, port)
		}
	}
	for _, cp := range p.Ports {
		switch cp.Protocol {
		case corev1.ProtocolUDP:
			if !slices.Contains(lp.udp, uint16(cp.ContainerPort)) {
				lp.udp = append(lp.udp, uint16(cp.ContainerPort))
			}
		case corev1.ProtocolTCP, "":
			if !slices.Contains(lp.tcp, uint16(cp.ContainerPort)) {
				lp.tcp = append(lp.tcp, uint16(cp.ContainerPort))
			}
		}
	}
	if err := c.Lab.AddPod(netlab.PodSpec{Name: lp.labName, Node: lp.node, IPs: lp.ips, TCPPorts: lp.tcp, UDPPorts: lp.udp}); err != nil {
		c.forget(lp)
		return StartedPod{}, fmt.Errorf("pod %s: %w", lp.key, err)
	}
	return StartedPod{pod: p, lp: lp}, nil
}

// PublishPod creates the API object of a pod StartPod started, bound to its
// node, and reports it Running with its IPs. On failure the pod's lab
// namespace is removed.
func (c *Cluster) PublishPod(ctx context.Context, sp StartedPod) (*corev1.Pod, error) {
	p, lp := sp.pod, sp.lp
	no := false
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels},
		Spec: corev1.PodSpec{
			NodeName:                     lp.node,
			AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10", Ports: p.Ports,
			}},
		},
	}
	obj, err := c.Client.CoreV1().Pods(p.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		_ = c.Lab.RemovePod(lp.labName)
		c.forget(lp)
		return nil, fmt.Errorf("creating pod %s: %w", lp.key, err)
	}
	now := metav1.Now()
	obj.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    c.nodeIPs[lp.node][0].String(),
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	for _, ip := range lp.ips {
		obj.Status.PodIPs = append(obj.Status.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	obj.Status.PodIP = obj.Status.PodIPs[0].IP
	obj, err = c.Client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("setting the status of pod %s: %w", lp.key, err)
	}
	return obj, nil
}

// PodRange holds every address placePod gives a pod (10.244.<n>.0/24 on
// the n-th node): the cluster's pod CIDR. The Node objects carry no
// spec.podCIDRs; an agent that needs the range (nftpolicy's unknown-pod
// path) is told with --pod-cidrs.
var PodRange = netip.MustParsePrefix("10.244.0.0/16")

// placePod picks the pod's node, IPs and netlab name and reserves them.
func (c *Cluster) placePod(p *Pod) (*labPod, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := p.Key()
	if c.pods[key] != nil {
		return nil, fmt.Errorf("pod %s already exists", key)
	}
	node := p.Node
	if node == "" {
		node = c.nodes[len(c.pods)%len(c.nodes)]
	}
	ni := slices.Index(c.nodes, node)
	if ni < 0 {
		return nil, fmt.Errorf("pod %s: unknown node %q (have %s)", key, node, strings.Join(c.nodes, ", "))
	}
	ips := append([]netip.Addr(nil), p.IPs...)
	if len(ips) == 0 {
		for {
			c.nextIP[node]++
			if c.nextIP[node] > 250 {
				return nil, fmt.Errorf("pod %s: node %s has no free address left", key, node)
			}
			ip := netip.AddrFrom4([4]byte{10, 244, byte(ni + 1), byte(9 + c.nextIP[node])})
			if !c.ipUsedLocked(ip) {
				ips = []netip.Addr{ip}
				break
			}
		}
	}
	sort.SliceStable(ips, func(i, j int) bool { return ips[i].Is4() && !ips[j].Is4() })
	c.nextID++
	lp := &labPod{key: key, labName: fmt.Sprintf("%s-%s-%d", trim(p.Namespace, 20), trim(p.Name, 20), c.nextID), node: node, ips: ips}
	c.pods[key] = lp
	return lp, nil
}

func trim(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (c *Cluster) ipUsedLocked(ip netip.Addr) bool {
	for _, o := range c.pods {
		if slices.Contains(o.ips, ip) {
			return true
		}
	}
	return false
}

func (c *Cluster) forget(lp *labPod) {
	c.mu.Lock()
	delete(c.pods, lp.key)
	c.mu.Unlock()
}

// DeletePod deletes the API object at once (grace period 0: there is no
// kubelet to confirm) and then the pod's namespace.
func (c *Cluster) DeletePod(ctx context.Context, namespace, name string) error {
	key := namespace + "/" + name
	zero := int64(0)
	if err := c.Client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting pod %s: %w", key, err)
	}
	c.mu.Lock()
	lp := c.pods[key]
	delete(c.pods, key)
	c.mu.Unlock()
	if lp != nil {
		return c.Lab.RemovePod(lp.labName)
	}
	return nil
}

// PodEndpoint returns the netlab endpoint of a pod ("namespace/name").
func (c *Cluster) PodEndpoint(key string) (netlab.Endpoint, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	lp := c.pods[key]
	if lp == nil {
		return netlab.Endpoint{}, fmt.Errorf("unknown pod %s", key)
	}
	return netlab.Pod(lp.labName), nil
}

// PodIPs returns the addresses of a pod ("namespace/name"), IPv4 first.
func (c *Cluster) PodIPs(key string) []netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	if lp := c.pods[key]; lp != nil {
		return append([]netip.Addr(nil), lp.ips...)
	}
	return nil
}

// PodNode returns the node of a pod ("namespace/name").
func (c *Cluster) PodNode(key string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if lp := c.pods[key]; lp != nil {
		return lp.node
	}
	return ""
}

// Pods returns the keys of the harness' pods, sorted.
func (c *Cluster) Pods() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.pods))
	for k := range c.pods {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ApplyPolicy creates the policy or replaces the spec, labels and
// annotations of the existing one, and returns it as stored (defaulted).
func (c *Cluster) ApplyPolicy(ctx context.Context, np *networkingv1.NetworkPolicy) (*networkingv1.NetworkPolicy, error) {
	api := c.Client.NetworkingV1().NetworkPolicies(np.Namespace)
	in := np.DeepCopy()
	in.ResourceVersion, in.UID, in.CreationTimestamp, in.ManagedFields = "", "", metav1.Time{}, nil
	out, err := api.Create(ctx, in, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return nil, fmt.Errorf("creating NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
		}
		return out, nil
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, np.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec = *np.Spec.DeepCopy()
		cur.Labels, cur.Annotations = np.Labels, np.Annotations
		out, err = api.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("updating NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
	}
	return out, nil
}

// UpdatePolicy changes an existing policy with edit (retrying on conflicts).
func (c *Cluster) UpdatePolicy(ctx context.Context, namespace, name string, edit func(*networkingv1.NetworkPolicy)) error {
	api := c.Client.NetworkingV1().NetworkPolicies(namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(cur)
		_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("updating NetworkPolicy %s/%s: %w", namespace, name, err)
	}
	return nil
}

// DeletePolicy deletes a policy.
func (c *Cluster) DeletePolicy(ctx context.Context, namespace, name string) error {
	if err := c.Client.NetworkingV1().NetworkPolicies(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("deleting NetworkPolicy %s/%s: %w", namespace, name, err)
	}
	return nil
}

// ApplyScenario creates what a scenario (docs/scenario-format.md) describes:
// its namespaces with their labels and annotations, its pods (on their node, or spread over
// the cluster's nodes as the compiler does) with their IPs and ports, and its
// policies (created, or updated when they exist). Pods that already exist are
// left as they are. Probes are not run (see ProbeScenario).
func (c *Cluster) ApplyScenario(ctx context.Context, s *scenario.Scenario) error {
	nss := map[string]map[string]string{}
	annotations := map[string]map[string]string{}
	var order []string
	for _, ns := range s.Namespaces {
		if _, ok := nss[ns.Name]; !ok {
			order = append(order, ns.Name)
		}
		nss[ns.Name] = ns.Labels
		annotations[ns.Name] = ns.Annotations
	}
	for _, p := range s.Pods {
		if _, ok := nss[p.Namespace]; !ok {
			nss[p.Namespace] = nil
			order = append(order, p.Namespace)
		}
	}
	for _, np := range s.Policies {
		if _, ok := nss[np.Namespace]; !ok {
			nss[np.Namespace] = nil
			order = append(order, np.Namespace)
		}
	}
	for _, name := range order {
		if err := c.EnsureNamespace(ctx, name, nss[name]); err != nil {
			return err
		}
		if a := annotations[name]; len(a) > 0 {
			if err := c.AnnotateNamespace(ctx, name, a); err != nil {
				return err
			}
		}
	}
	existing := map[string]bool{}
	for _, k := range c.Pods() {
		existing[k] = true
	}
	var errs []error
	for i := range s.Pods {
		sp := &s.Pods[i]
		if existing[sp.Key()] {
			continue
		}
		if sp.HostNetwork {
			errs = append(errs, fmt.Errorf("pod %s: hostNetwork pods are not supported by the harness", sp.Key()))
			continue
		}
		p := Pod{Namespace: sp.Namespace, Name: sp.Name, Labels: sp.Labels, Node: s.PodNode(sp.Key(), c.nodes), IPs: sp.Addrs()}
		for _, port := range sp.Ports {
			proto := corev1.ProtocolTCP
			if port.Protocol != "" {
				proto = corev1.Protocol(strings.ToUpper(port.Protocol))
			}
			p.Ports = append(p.Ports, corev1.ContainerPort{Name: port.Name, ContainerPort: port.Port, Protocol: proto})
		}
		if _, err := c.CreatePod(ctx, p); err != nil {
			errs = append(errs, err)
		}
	}
	for i := range s.Policies {
		if _, err := c.ApplyPolicy(ctx, &s.Policies[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ListInputs lists what the agents compile from: every Pod, Namespace,
// NetworkPolicy and Node of the API, and its ClusterNetworkPolicies while
// their CRD is installed, as compiler input for the cluster-wide view.
func (c *Cluster) ListInputs(ctx context.Context) (compile.Input, error) {
	var in compile.Input
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing pods: %w", err)
	}
	nss, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing namespaces: %w", err)
	}
	pols, err := c.Client.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing network policies: %w", err)
	}
	for i := range pods.Items {
		in.Pods = append(in.Pods, &pods.Items[i])
	}
	for i := range nss.Items {
		in.Namespaces = append(in.Namespaces, &nss.Items[i])
	}
	for i := range pols.Items {
		in.Policies = append(in.Policies, &pols.Items[i])
	}
	return in, c.listClusterInputs(ctx, &in)
}

// Program builds the cluster-wide program (`nftpolicy eval`'s view) from
// the API's current objects.
func (c *Cluster) Program(ctx context.Context) (*compile.Program, error) {
	in, err := c.ListInputs(ctx)
	if err != nil {
		return nil, err
	}
	return compile.Build(in), nil
}

// waitCtx bounds a wait by d unless ctx has an earlier deadline.
func waitCtx(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
