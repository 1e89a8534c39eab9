package compile

import (
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// NamespaceNameLabel is the immutable label the API server sets on every
// namespace to its name.
const NamespaceNameLabel = "kubernetes.io/metadata.name"

// StagedAnnotation, set to "true" on a NetworkPolicy or a
// ClusterNetworkPolicy, or on a Namespace for all its NetworkPolicies,
// stages them: they are not enforced (Staged, Input.EnforceStaged).
const StagedAnnotation = "nftpolicy.io/staged"

// Input is everything the program is built from.
type Input struct {
	// NodeName is the node whose pods are enforced; empty means every pod
	// is local (the cluster-wide view used by `nftpolicy eval`).
	NodeName string
	// NodeIPs are the node's own addresses. Traffic between them and the
	// node's pods is always allowed.
	NodeIPs    []netip.Addr
	Namespaces []*corev1.Namespace
	Pods       []*corev1.Pod
	// PodInfos are pods already read (the agent's informer stores them so);
	// Build reads Pods into this form and uses both.
	PodInfos []*PodInfo
	Policies []*networkingv1.NetworkPolicy
	// ClusterPolicies are policy.networking.k8s.io ClusterNetworkPolicies:
	// the Admin tier decides before NetworkPolicy v1, the Baseline tier after.
	ClusterPolicies []*npav1beta1.ClusterNetworkPolicy
	// Nodes are the cluster's nodes: ClusterNetworkPolicy `nodes` peers match
	// the addresses in their status.
	Nodes []*corev1.Node
	// PodCIDRs, when set, are the cluster's pod address ranges, replacing
	// the Nodes' spec.podCIDRs (the agent's --pod-cidrs). New connections of
	// addresses inside them that no known pod holds wait for the agent to
	// learn the pod (docs/semantics.md).
	PodCIDRs []netip.Prefix
	// EnforceStaged builds the program as if the staged policies
	// (StagedAnnotation) were enforced too: what they would do. By
	// default they do not exist for the program.
	EnforceStaged bool
	// Budgets bound what NetworkPolicies make (budget.go); zero fields
	// take their defaults.
	Budgets Budgets
}

// Build compiles the input into a program. It never fails: problems in
// policies are reported in Program.Problems and the offending parts allow
// nothing. Build is pure and deterministic: the same input gives the same
// program whatever the order of its slices.
func Build(in Input) *Program { return BuildCached(in, nil) }

// Cache keeps per-object work (pods read into PodInfos) between builds.
// Informers and tests hand out the same pointer for an unchanged object, so
// a pod read once is not read again. A nil *Cache is valid and caches
// nothing. Not safe for concurrent builds.
type Cache struct {
	pods map[*corev1.Pod]*PodInfo
}

// NewCache returns an empty cache.
func NewCache() *Cache { return &Cache{pods: map[*corev1.Pod]*PodInfo{}} }

// infos returns the input's pods as PodInfos: PodInfos, then Pods read
// (through the cache, which then holds exactly in.Pods).
func (c *Cache) infos(in Input) []*PodInfo {
	if len(in.Pods) == 0 {
		return in.PodInfos
	}
	out := make([]*PodInfo, 0, len(in.PodInfos)+len(in.Pods))
	out = append(out, in.PodInfos...)
	var next map[*corev1.Pod]*PodInfo
	if c != nil {
		next = make(map[*corev1.Pod]*PodInfo, len(in.Pods))
	}
	for _, p := range in.Pods {
		var pi *PodInfo
		if c != nil {
			if pi = c.pods[p]; pi == nil {
				pi = NewPodInfo(p)
			}
			next[p] = pi
		} else {
			pi = NewPodInfo(p)
		}
		out = append(out, pi)
	}
	if c != nil {
		c.pods = next
	}
	return out
}

// BuildCached is Build with a cache of per-object work; the result is the
// same as Build's.
func BuildCached(in Input, cache *Cache) *Program {
	b := newBuilder(in)
	b.cache = cache
	return b.build(in)
}

func (b *builder) build(in Input) *Program {
	return b.buildFrom(in, b.cache.infos(in))
}

func (b *builder) buildFrom(in Input, pods []*PodInfo) *Program {
	b.buildNodes(in.Nodes)
	b.prog.PodCIDRs = podCIDRs(in)
	b.buildPods(pods)
	b.collectStaged(in)
	b.markStaged()
	pols := make([]*networkingv1.NetworkPolicy, 0, len(in.Policies))
	for _, np := range in.Policies {
		if b.enforced(np) {
			pols = append(pols, np)
		}
	}
	sort.Slice(pols, func(i, j int) bool { return policyKey(pols[i]) < policyKey(pols[j]) })
	for i, np := range pols {
		if i > 0 && policyKey(pols[i-1]) == policyKey(np) {
			continue // duplicate object; the first wins
		}
		b.prog.Policies = append(b.prog.Policies, b.compilePolicy(np))
	}
	b.prog.NamespaceCosts = b.nsCost
	b.finish()
	b.compileClusterPolicies(b.enforcedClusterPolicies(in.ClusterPolicies))
	b.prog.buildEvalIndex()
	b.prog.Source = in
	return b.prog
}

func policyKey(np *networkingv1.NetworkPolicy) string { return np.Namespace + "/" + np.Name }

type builder struct {
	prog     *Program
	nsLabels map[string]labels.Set
	byNS     map[string][]PodID
	sels     map[string]SelectorID
	nsMatch  map[string][]string
	cache    *Cache
	// stagedNS are the namespaces whose NetworkPolicies are staged, nil
	// when the input enforces staged policies (enforced).
	stagedNS map[string]bool
	// staged are the staged policies' selections, by name
	// (staged_subjects.go).
	staged []stagedSubject

	// budgets bound what resolved NetworkPolicies make; nsCost is what
	// each namespace's have been charged so far (budget.go). metered is
	// false in a Tracker's scratch builder, which knows no pods: the
	// Tracker bounds a policy change itself (trackedCost).
	budgets Budgets
	nsCost  map[string]int
	metered bool
	// overBudget makes the policies compiled rejected for their budget: a
	// Tracker's scratch builder sets it for a version checkCost proved
	// the build rejects.
	overBudget bool
	// parsed holds the peer selectors chargePeer parsed, for compileRule;
	// meter charges the object being built.
	parsed map[*metav1.LabelSelector]labels.Selector
	meter  costMeter
	// peerScopes lists, by key, the namespace selectors of the selecting
	// peers of each NetworkPolicy built (costMeter.scopes).
	peerScopes map[string][]labels.Selector

	nodeLabels map[string]labels.Set
	nodeNames  []string
	nodeSets   map[string]NodeSetID

	// What the program's selections were made with, by ID: a Tracker
	// places a changed pod with them without building again.
	targets  []labels.Selector // NetworkPolicy podSelector (Everything when invalid)
	subjects []clusterSubject
	selMatch []selMatcher

	// Peer sets shared by content (peershare.go): the content of each set
	// by ID, the sets of ShareMinMembers pods or more by content, the
	// matchers of the peers that use a set interned for another and, in
	// order, the aliases made (to undo a rejected object's); podHash
	// caches the pods' key hashes, scratch the members being matched.
	selContent []shareKey
	shares     map[shareKey][]SelectorID
	aliasMatch map[SelectorID][]selMatcher
	aliasLog   []aliasEntry
	podHash    []uint64
	scratch    []PodID
	// peerKeys lists, by key, the canonical keys (selectionKey) of each
	// admitted NetworkPolicy's selecting peers, distinct, in the order
	// they were interned: the order decides which peer names a shared set
	// and the order of its aliases, so the Tracker applies an edit that
	// keeps the keys of its shared sets in place (checkPolicyShares).
	peerKeys map[string][]string
}

// selMatcher is a parsed pod-selecting peer: podSel in namespace ns, or in
// the namespaces nsSel matches when nsSel is set.
type selMatcher struct {
	ns            string
	nsSel, podSel labels.Selector
}

func newBuilder(in Input) *builder {
	b := &builder{
		prog: &Program{
			Node:    in.NodeName,
			NodeIPs: append([]netip.Addr(nil), in.NodeIPs...),
		},
		nsLabels: map[string]labels.Set{},
		byNS:     map[string][]PodID{},
		sels:     map[string]SelectorID{},
		nsMatch:  map[string][]string{},
		nodeSets: map[string]NodeSetID{},
		budgets:  in.Budgets,
		metered:  true,
	}
	b.budgets.Defaults()
	if !in.EnforceStaged {
		b.stagedNS = map[string]bool{}
	}
	for _, ns := range in.Namespaces {
		l := labels.Set{}
		for k, v := range ns.Labels {
			l[k] = v
		}
		// The API server sets this label; objects from older servers or
		// hand-made inputs may lack it.
		l[NamespaceNameLabel] = ns.Name
		b.nsLabels[ns.Name] = l
		if !in.EnforceStaged && Staged(ns) {
			b.stagedNS[ns.Name] = true
		}
	}
	// Shared: namespaces only pods name are added as the build finds them.
	b.prog.NamespaceLabels = b.nsLabels
	return b
}

func (b *builder) namespaceLabels(ns string) labels.Set {
	if l, ok := b.nsLabels[ns]; ok {
		return l
	}
	l := labels.Set{NamespaceNameLabel: ns}
	b.nsLabels[ns] = l
	return l
}

// eligible reports whether policies apply to the pod at all: host-network
// pods are not selected and not matched as pods, and pods in a terminal
// phase no longer own their IPs.
func eligible(p *corev1.Pod) bool {
	if p.Spec.HostNetwork {
		return false
	}
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

func podIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range p.Status.PodIPs {
		out = appendAddr(out, ip.IP)
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		out = appendAddr(out, p.Status.PodIP)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Is4() && !out[j].Is4() })
	return out
}

// preferred decides which of two pods owns a contested IP: a pod that is not
// being deleted, then the newer one, then the smaller key.
func preferred(a, b *PodInfo) bool {
	ad, bd := a.DeletionTimestamp != nil, b.DeletionTimestamp != nil
	if ad != bd {
		return !ad
	}
	at, bt := a.CreationTimestamp.Time, b.CreationTimestamp.Time
	if !at.Equal(bt) {
		return at.After(bt)
	}
	return a.Key < b.Key
}

// addrOwners maps pod addresses to the index of the pod owning them:
// IPv4 addresses by their 32 bits (the map's fast path for such keys;
// every pod of a cluster has one), others whole.
type addrOwners struct {
	v4    map[uint32]int
	other map[netip.Addr]int
}

func newAddrOwners(n int) addrOwners {
	return addrOwners{v4: make(map[uint32]int, n), other: map[netip.Addr]int{}}
}

func (o addrOwners) get(a netip.Addr) (int, bool) {
	if a.Is4() {
		i, ok := o.v4[addr4(a)]
		return i, ok
	}
	i, ok := o.other[a]
	return i, ok
}

func (o addrOwners) set(a netip.Addr, i int) {
	if a.Is4() {
		o.v4[addr4(a)] = i
		return
	}
	o.other[a] = i
}

func (b *builder) buildPods(pods []*PodInfo) {
	cands := make([]*PodInfo, 0, len(pods))
	for _, p := range pods {
		if p.takesPart() {
			cands = append(cands, p)
		}
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].Key < cands[j].Key })
	// Settle IP reuse: each address belongs to one pod.
	owner := newAddrOwners(len(cands))
	for i, c := range cands {
		for _, ip := range c.IPs {
			if j, ok := owner.get(ip); !ok || preferred(c, cands[j]) {
				owner.set(ip, i)
			}
		}
	}
	out := make([]Pod, 0, len(cands))
	for i, c := range cands {
		if i > 0 && cands[i-1].Key == c.Key {
			continue
		}
		ips := c.IPs
		for _, ip := range c.IPs {
			if j, _ := owner.get(ip); j != i {
				// Contested: keep only the addresses this pod owns.
				ips = nil
				for _, ip := range c.IPs {
					if j, _ := owner.get(ip); j == i {
						ips = append(ips, ip)
					}
				}
				break
			}
		}
		if len(ips) == 0 {
			continue
		}
		id := PodID(len(out))
		local := b.prog.Node == "" || c.Node == b.prog.Node
		out = append(out, Pod{PodInfo: c, IPs: ips, Subject: subjectFor(local), Local: local})
		b.byNS[c.Namespace] = append(b.byNS[c.Namespace], id)
	}
	b.prog.Pods = out
}

func containerPorts(p *corev1.Pod) []ContainerPort {
	n := 0
	for _, cs := range [][]corev1.Container{p.Spec.Containers, p.Spec.InitContainers} {
		for i := range cs {
			n += len(cs[i].Ports)
		}
	}
	if n == 0 {
		return nil
	}
	// One allocation, not one per doubling: every pod of the cluster is
	// read here.
	out := make([]ContainerPort, 0, n)
	add := func(cs []corev1.Container, sidecarsOnly bool) {
		for _, c := range cs {
			if sidecarsOnly && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
				continue
			}
			for _, cp := range c.Ports {
				if cp.ContainerPort < 1 || cp.ContainerPort > 65535 {
					continue
				}
				proto := ProtoTCP
				if cp.Protocol != "" {
					var ok bool
					if proto, ok = ParseProtocol(string(cp.Protocol)); !ok {
						continue
					}
				}
				out = append(out, ContainerPort{Name: cp.Name, Protocol: proto, Port: uint16(cp.ContainerPort)})
			}
		}
	}
	add(p.Spec.Containers, false)
	// Sidecars (restartable init containers) serve for the pod's lifetime.
	add(p.Spec.InitContainers, true)
	if len(out) == 0 {
		return nil
	}
	return out
}

// compilePolicyShape validates a policy and compiles its rules without
// resolving which pods anything selects.
func (b *builder) compilePolicyShape(np *networkingv1.NetworkPolicy) Policy {
	return b.compile(np, false)
}

func (b *builder) compilePolicy(np *networkingv1.NetworkPolicy) Policy {
	return b.compile(np, true)
}

func (b *builder) compile(np *networkingv1.NetworkPolicy, resolve bool) Policy {
	key := policyKey(np)
	pr := &problems{policy: key}
	id := PolicyID(len(b.prog.Policies))
	pol := Policy{Namespace: np.Namespace, Name: np.Name, Key: key}
	pol.IsolatesIngress, pol.IsolatesEgress = pr.policyTypes(&np.Spec)

	spec := field.NewPath("spec")
	target, ok := pr.parseSelector(spec.Child("podSelector"), &np.Spec.PodSelector)
	targetValid := ok
	if !ok {
		// We cannot know which pods the author meant: isolate the whole
		// namespace and allow nothing, the reading that cannot widen access.
		target = labels.Everything()
	}
	if resolve {
		b.targets = append(b.targets, target)
		for _, pid := range b.byNS[np.Namespace] {
			pod := &b.prog.Pods[pid]
			if pod.Local && target.Matches(labels.Set(pod.Labels)) {
				pol.Selected = append(pol.Selected, pid)
			}
		}
	}
	cost := NetworkPolicyCost(np)
	if cost > MaxPolicyCost {
		// Not compiled: the policy isolates its pods and allows nothing,
		// as one whose podSelector cannot be parsed.
		pr.rejectCost(cost, "no rule of it allows anything and it still isolates the pods it selects")
		pol.Rejected, pol.RejectedFor = true, RejectedCost
		pol.Problems = pr.list
		return pol
	}
	if resolve && b.overBudget {
		// A Tracker's scratch builder, for a version the build would
		// reject for its budget (Tracker.checkCost): what chargeBudget
		// makes of it, without resolving its peers.
		pol.Cost, pol.Rejected, pol.RejectedFor = b.budgets.Policy, true, RejectedBudget
		pr.rejectBudget(RejectedBudget, b.budgets, np.Namespace)
		pol.Problems = pr.list
		return pol
	}
	if resolve && b.metered && b.chargeBudget(pr, np, &pol, cost) != "" {
		// Rejected as above, having made nothing.
		pol.Problems = pr.list
		return pol
	}
	for i, r := range np.Spec.Ingress {
		pol.Ingress = append(pol.Ingress, b.compileRule(pr, id, key, Ingress, i, spec.Child("ingress").Index(i), np.Namespace, r.From, r.Ports, resolve))
	}
	for i, r := range np.Spec.Egress {
		pol.Egress = append(pol.Egress, b.compileRule(pr, id, key, Egress, i, spec.Child("egress").Index(i), np.Namespace, r.To, r.Ports, resolve))
	}
	if !targetValid {
		for i := range pol.Ingress {
			pol.Ingress[i].Disabled = true
		}
		for i := range pol.Egress {
			pol.Egress[i].Disabled = true
		}
	}
	pol.Problems = pr.list
	return pol
}

func (b *builder) compileRule(pr *problems, pol PolicyID, key string, dir Direction, idx int, path *field.Path,
	ns string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, resolve bool) Rule {
	r := Rule{Policy: pol, Direction: dir, Index: idx}
	r.Name = key + " " + dir.String() + "[" + itoa(idx) + "]"
	r.AllowReason = "allowed by " + r.Name
	peerField := "from"
	if dir == Egress {
		peerField = "to"
	}
	r.AllPeers = len(peers) == 0
	var blocks []IPRange
	var seenSels map[SelectorID]bool
	for i, peer := range peers {
		pp := path.Child(peerField).Index(i)
		hasSel := peer.PodSelector != nil || peer.NamespaceSelector != nil
		switch {
		case peer.IPBlock != nil && hasSel:
			pr.add(pp, "may not specify both ipBlock and another peer; this peer matches nothing")
		case peer.IPBlock != nil:
			if rs, ok := b.ipBlock(pr, pp.Child("ipBlock"), peer.IPBlock); ok {
				blocks = append(blocks, rs...)
			}
		case hasSel:
			if id, ok := b.selectorPeer(pr, pp, ns, peer, resolve); ok {
				n := len(r.Selectors)
				r.Selectors = appendNew(r.Selectors, &seenSels, id)
				// A rule is a user once, however many of its peers
				// use the set (peers shared by content: any number).
				if resolve && len(r.Selectors) > n {
					s := &b.prog.Selectors[id]
					s.Users = append(s.Users, r.Name)
				}
			}
		default:
			pr.add(pp, "must specify a peer; this peer matches nothing")
		}
	}
	r.IPBlocks = normalizeRanges(blocks)

	r.AllPorts = len(ports) == 0
	var seenNamed map[NamedPortRef]bool
	for i, np := range ports {
		p, ok := pr.parsePort(path.Child("ports").Index(i), np)
		if !ok {
			continue
		}
		if p.named != "" {
			r.NamedPorts = appendNew(r.NamedPorts, &seenNamed, NamedPortRef{Name: p.named, Protocol: p.proto})
			continue
		}
		r.Ports = append(r.Ports, PortRange{Protocol: p.proto, First: p.first, Last: p.last})
	}
	r.Ports = normalizePorts(r.Ports)
	return r
}

// appendNew appends x to list unless the list holds it already, in constant
// time: a rule's lists are as long as its author makes them. seen indexes
// the list once it is long enough for scanning it to cost more.
func appendNew[T comparable](list []T, seen *map[T]bool, x T) []T {
	if *seen == nil {
		if len(list) < 16 {
			if slices.Contains(list, x) {
				return list
			}
			return append(list, x)
		}
		*seen = make(map[T]bool, 2*len(list))
		for _, y := range list {
			(*seen)[y] = true
		}
	}
	if (*seen)[x] {
		return list
	}
	(*seen)[x] = true
	return append(list, x)
}

// normalizePorts sorts port ranges and merges overlapping or adjacent ranges
// of the same protocol, as nftables interval sets require.
func normalizePorts(in []PortRange) []PortRange {
	if len(in) == 0 {
		return nil
	}
	sort.Slice(in, func(i, j int) bool {
		if in[i].Protocol != in[j].Protocol {
			return in[i].Protocol < in[j].Protocol
		}
		if in[i].First != in[j].First {
			return in[i].First < in[j].First
		}
		return in[i].Last < in[j].Last
	})
	out := in[:1]
	for _, p := range in[1:] {
		last := &out[len(out)-1]
		if p.Protocol == last.Protocol && uint32(p.First) <= uint32(last.Last)+1 {
			if p.Last > last.Last {
				last.Last = p.Last
			}
			continue
		}
		out = append(out, p)
	}
	return out
}

func (b *builder) ipBlock(pr *problems, path *field.Path, blk *networkingv1.IPBlock) ([]IPRange, bool) {
	cidr, err := parseCIDR(blk.CIDR)
	if err != nil {
		pr.add(path.Child("cidr"), "%v; this peer matches nothing", err)
		return nil, false
	}
	var except []netip.Prefix
	for i, e := range blk.Except {
		ep, err := parseCIDR(e)
		if err != nil {
			pr.add(path.Child("except").Index(i), "%v; this peer matches nothing", err)
			return nil, false
		}
		if ep.Addr().Is4() != cidr.Addr().Is4() || ep.Bits() <= cidr.Bits() || !cidr.Contains(ep.Addr()) {
			pr.add(path.Child("except").Index(i), "%s must be a strict subset of cidr %s; this peer matches nothing", e, blk.CIDR)
			return nil, false
		}
		except = append(except, ep)
	}
	return blockRanges(cidr, except), true
}

// selectorPeer interns a pod-selecting peer as a shared Selector.
func (b *builder) selectorPeer(pr *problems, path *field.Path, ns string, peer networkingv1.NetworkPolicyPeer, resolve bool) (SelectorID, bool) {
	podSel := labels.Everything()
	if peer.PodSelector != nil {
		s, ok := b.peerSelector(pr, path.Child("podSelector"), peer.PodSelector)
		if !ok {
			pr.add(path, "this peer matches nothing")
			return 0, false
		}
		podSel = s
	}
	var nsSel labels.Selector
	if peer.NamespaceSelector != nil {
		s, ok := b.peerSelector(pr, path.Child("namespaceSelector"), peer.NamespaceSelector)
		if !ok {
			pr.add(path, "this peer matches nothing")
			return 0, false
		}
		nsSel = s
	}
	if !resolve {
		return 0, true
	}
	return b.internSelector(ns, nsSel, podSel), true
}

// internSelector returns the shared peer set of the pods matching podSel in
// namespace ns (nsSel nil) or in the namespaces matching nsSel. NetworkPolicy
// and ClusterNetworkPolicy peers that say the same share one set, and so do
// peers that select the same pods, however they say it (peershare.go).
func (b *builder) internSelector(ns string, nsSel, podSel labels.Selector) SelectorID {
	id, _ := b.internSelectorKey(ns, nsSel, podSel)
	return id
}

// internSelectorKey is internSelector that also returns the peer's
// canonical key (selectionKey).
func (b *builder) internSelectorKey(ns string, nsSel, podSel labels.Selector) (SelectorID, string) {
	key, desc := selectionKey(ns, nsSel, podSel)
	if id, ok := b.sels[key]; ok {
		return id, key
	}
	m := selMatcher{ns: ns, nsSel: nsSel, podSel: podSel}
	members := b.matchMembers(m)
	content := b.contentOf(members)
	if id, ok := b.sharedWith(content, members); ok {
		b.alias(id, key, m)
		return id, key
	}
	members = slices.Clone(members)
	id := SelectorID(len(b.prog.Selectors))
	b.sels[key] = id
	b.selMatch = append(b.selMatch, m)
	b.noteContent(id, content)
	for _, pid := range members {
		// Selector IDs grow as selectors are created: each list stays sorted.
		b.prog.Pods[pid].MemberOf = append(b.prog.Pods[pid].MemberOf, id)
	}
	sel := Selector{Key: key, Description: desc, Members: members, PodSelector: podSel.String()}
	if nsSel == nil {
		sel.Namespace = ns
	} else {
		sel.NamespaceSelector = nsSel.String()
	}
	b.prog.Selectors = append(b.prog.Selectors, sel)
	return id, key
}

// selectionKey returns the canonical key of a pod-selecting peer (as
// internSelector takes it) and what it selects in words.
func selectionKey(ns string, nsSel, podSel labels.Selector) (key, desc string) {
	podDesc := "all pods"
	if !podSel.Empty() {
		podDesc = "pods with " + podSel.String()
	}
	if nsSel == nil {
		return "ns=" + ns + "|pods=" + podSel.String(), podDesc + " in namespace " + ns
	}
	key = "nssel=" + nsSel.String() + "|pods=" + podSel.String()
	if nsSel.Empty() {
		return key, podDesc + " in all namespaces"
	}
	return key, podDesc + " in namespaces with " + nsSel.String()
}

// matchMembers returns the pods a peer selects, sorted, in a scratch
// slice the next call reuses.
func (b *builder) matchMembers(m selMatcher) []PodID {
	members := b.scratch[:0]
	match := func(pids []PodID) {
		for _, pid := range pids {
			if m.podSel.Matches(labels.Set(b.prog.Pods[pid].Labels)) {
				members = append(members, pid)
			}
		}
	}
	if m.nsSel == nil {
		match(b.byNS[m.ns])
	} else {
		for _, n := range b.matchNamespaces(m.nsSel) {
			match(b.byNS[n])
		}
		slices.Sort(members)
	}
	b.scratch = members
	return members
}

// matchNamespaces returns the namespaces (with pods or listed) whose labels
// match the selector.
func (b *builder) matchNamespaces(sel labels.Selector) []string {
	key := sel.String()
	if m, ok := b.nsMatch[key]; ok {
		return m
	}
	var out []string
	seen := map[string]bool{}
	for ns := range b.byNS {
		seen[ns] = true
		if sel.Matches(b.namespaceLabels(ns)) {
			out = append(out, ns)
		}
	}
	sort.Strings(out)
	b.nsMatch[key] = out
	return out
}

// finish records which policies isolate each local pod and the reasons given
// when nothing allows its traffic.
func (b *builder) finish() {
	p := b.prog
	for i := range p.Policies {
		pol := &p.Policies[i]
		for _, pid := range pol.Selected {
			pod := &p.Pods[pid]
			if pol.IsolatesIngress {
				pod.IngressPolicies = append(pod.IngressPolicies, PolicyID(i))
			}
			if pol.IsolatesEgress {
				pod.EgressPolicies = append(pod.EgressPolicies, PolicyID(i))
			}
		}
		p.Problems = append(p.Problems, pol.Problems...)
	}
	reasons := map[string]string{}
	reason := func(pod *Pod, ids []PolicyID, dir Direction) string {
		s := deniedReason(p, pod, ids, dir)
		if r, ok := reasons[s]; ok {
			return r
		}
		reasons[s] = s
		return s
	}
	var order [2]int32
	for i := range p.Policies {
		for _, d := range []Direction{Ingress, Egress} {
			rules := p.Policies[i].Rules(d)
			for j := range rules {
				rules[j].Order = order[d]
				order[d]++
			}
		}
	}
	tables := map[string]int32{}
	for i := range p.Pods {
		pod := &p.Pods[i]
		if !pod.Local {
			continue // not a subject: notSubject says so
		}
		pod.IngressDenied = reason(pod, pod.IngressPolicies, Ingress)
		pod.EgressDenied = reason(pod, pod.EgressPolicies, Egress)
		pod.IngressTable = b.table(tables, pod.IngressPolicies, Ingress)
		pod.EgressTable = b.table(tables, pod.EgressPolicies, Egress)
	}
}

// deniedReason is the reason given when an isolated pod's traffic in one
// direction matches no rule of the policies ids ("" when not isolated).
func deniedReason(p *Program, pod *Pod, ids []PolicyID, dir Direction) string {
	if len(ids) == 0 {
		return ""
	}
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = p.Policies[id].Key
	}
	verb := "isolates"
	if len(ids) > 1 {
		verb = "isolate"
	}
	return strings.Join(names, ", ") + " " + verb + " " + pod.Key + " for " + dir.String() + "; no rule matched"
}

// tableKey identifies a combination of policies in one direction.
func tableKey(ids []PolicyID, d Direction) string {
	var key strings.Builder
	key.WriteString(d.String())
	for _, id := range ids {
		key.WriteByte(',')
		key.WriteString(itoa(int(id)))
	}
	return key.String()
}

// table returns the decision table of a combination of policies, building
// it the first time the combination is seen.
func (b *builder) table(seen map[string]int32, ids []PolicyID, d Direction) int32 {
	if len(ids) == 0 {
		return -1
	}
	key := tableKey(ids, d)
	if t, ok := seen[key]; ok {
		return t
	}
	p := b.prog
	idx := int32(len(p.Tables))
	p.Tables = append(p.Tables, buildTable(p, ids, d))
	seen[key] = idx
	return idx
}

// buildTable builds the decision table of a combination of policies.
func buildTable(p *Program, ids []PolicyID, d Direction) Table {
	t := Table{Policies: ids}
	for _, id := range ids {
		rules := p.Policies[id].Rules(d)
		for j := range rules {
			r := &rules[j]
			if r.MatchesNothing() {
				continue
			}
			if r.AllPeers {
				t.AnyPeer = append(t.AnyPeer, r)
				continue
			}
			for _, s := range r.Selectors {
				t.BySelector = append(t.BySelector, SelectorRule{Selector: s, Rule: r})
			}
			if len(r.IPBlocks) > 0 {
				t.Blocks = append(t.Blocks, r)
			}
		}
	}
	sort.SliceStable(t.BySelector, func(i, j int) bool {
		a, b := t.BySelector[i], t.BySelector[j]
		if a.Selector != b.Selector {
			return a.Selector < b.Selector
		}
		return a.Rule.Order < b.Rule.Order
	})
	return t
}

func itoa(i int) string {
	if i >= 0 && i < 10 {
		return string(rune('0' + i))
	}
	var buf [20]byte
	n := len(buf)
	neg := i < 0
	if neg {
		i = -i
	}
	for i > 0 {
		n--
		buf[n] = byte('0' + i%10)
		i /= 10
	}
	if neg {
		n--
		buf[n] = '-'
	}
	return string(buf[n:])
}
