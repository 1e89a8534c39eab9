package conntrack

import (
	"encoding/binary"
	"hash"
	"hash/fnv"
	"net/netip"
	"slices"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Affected returns the addresses of the local pods of cur whose connections
// may be decided differently by cur than by old: a pod whose isolating
// NetworkPolicies or ClusterNetworkPolicies (as subject) differ in which
// policies they are or in what they say, including the membership of every
// peer set they name; a pod new to the program or whose addresses changed
// (an address reused by another pod); and every local pod when the node's
// own addresses changed. A nil old affects nothing: the first program
// revokes nothing, as no earlier decision exists to be revoked.
//
// It errs on the side of including: an affected address only costs an
// evaluation of the conntrack entries touching it.
func Affected(old, cur *compile.Program) []netip.Addr {
	if old == nil || cur == nil {
		return nil
	}
	of, nf := newFingerprinter(old), newFingerprinter(cur)
	nodeChanged := !slices.Equal(old.NodeIPs, cur.NodeIPs)
	var out []netip.Addr
	for i := range cur.Pods {
		pod := &cur.Pods[i]
		if !pod.Local {
			continue
		}
		oid, ok := old.PodByKey(pod.Key)
		if ok && !nodeChanged && old.Pods[oid].Local && of.pod(oid) == nf.pod(compile.PodID(i)) {
			continue
		}
		out = append(out, pod.IPs...)
	}
	// A local pod's address now held by nobody, or by a remote pod: its
	// entries belong to a pod that is gone (reused address, deleted pod).
	for i := range old.Pods {
		pod := &old.Pods[i]
		if !pod.Local {
			continue
		}
		for _, ip := range pod.IPs {
			if id, ok := cur.PodByIP(ip); !ok || cur.Pods[id].Key != pod.Key {
				out = append(out, ip)
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out)
}

// fingerprinter hashes what decides a local pod's connections, memoizing
// per policy, cluster policy, selector and node set.
type fingerprinter struct {
	p         *compile.Program
	policies  map[compile.PolicyID]uint64
	cpolicies map[compile.ClusterPolicyID]uint64
	selectors map[compile.SelectorID]uint64
	allPods   uint64
	hasAll    bool
}

func newFingerprinter(p *compile.Program) *fingerprinter {
	return &fingerprinter{p: p, policies: map[compile.PolicyID]uint64{},
		cpolicies: map[compile.ClusterPolicyID]uint64{}, selectors: map[compile.SelectorID]uint64{}}
}

func putString(h hash.Hash64, s string) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
	h.Write(n[:])
	h.Write([]byte(s))
}

func putUint(h hash.Hash64, v uint64) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], v)
	h.Write(n[:])
}

func putAddrs(h hash.Hash64, addrs []netip.Addr) {
	putUint(h, uint64(len(addrs)))
	for _, a := range addrs {
		b, _ := a.MarshalBinary()
		h.Write(b)
	}
}

func putPorts(h hash.Hash64, ports []compile.ContainerPort) {
	putUint(h, uint64(len(ports)))
	for _, p := range ports {
		putString(h, p.Name)
		putUint(h, uint64(p.Protocol)<<16|uint64(p.Port))
	}
}

// pod hashes the local pod's own addresses and ports (ingress named ports
// resolve on it) and every policy that decides for it, in order.
func (f *fingerprinter) pod(id compile.PodID) uint64 {
	pod := &f.p.Pods[id]
	h := fnv.New64a()
	putAddrs(h, pod.IPs)
	putPorts(h, pod.Ports)
	for _, ids := range [][]compile.PolicyID{pod.IngressPolicies, pod.EgressPolicies} {
		putUint(h, uint64(len(ids)))
		for _, pid := range ids {
			putUint(h, f.policy(pid))
		}
	}
	for _, ids := range [][]compile.ClusterPolicyID{pod.AdminIngress, pod.AdminEgress, pod.BaselineIngress, pod.BaselineEgress} {
		putUint(h, uint64(len(ids)))
		for _, cid := range ids {
			putUint(h, f.clusterPolicy(cid))
		}
	}
	return h.Sum64()
}

func (f *fingerprinter) policy(id compile.PolicyID) uint64 {
	if v, ok := f.policies[id]; ok {
		return v
	}
	pol := &f.p.Policies[id]
	h := fnv.New64a()
	putString(h, pol.Key)
	for _, d := range []compile.Direction{compile.Ingress, compile.Egress} {
		rules := pol.Rules(d)
		putUint(h, uint64(len(rules)))
		for ri := range rules {
			f.rule(h, &rules[ri].Match, rules[ri].MatchesNothing(), 1, d)
		}
	}
	f.policies[id] = h.Sum64()
	return f.policies[id]
}

func (f *fingerprinter) clusterPolicy(id compile.ClusterPolicyID) uint64 {
	if v, ok := f.cpolicies[id]; ok {
		return v
	}
	cp := &f.p.ClusterPolicies[id]
	h := fnv.New64a()
	putString(h, cp.Name)
	putUint(h, uint64(cp.Tier)<<32|uint64(uint32(cp.Priority)))
	for _, d := range []compile.Direction{compile.Ingress, compile.Egress} {
		rules := cp.Rules(d)
		putUint(h, uint64(len(rules)))
		for ri := range rules {
			r := &rules[ri]
			putString(h, r.Name)
			f.rule(h, &r.Match, r.MatchesNothing(), uint64(r.Action), d)
		}
	}
	f.cpolicies[id] = h.Sum64()
	return f.cpolicies[id]
}

// rule hashes one rule: what it does (action; 0 when it matches nothing)
// and, when it can match, its match.
func (f *fingerprinter) rule(h hash.Hash64, m *compile.Match, nothing bool, action uint64, d compile.Direction) {
	if nothing {
		putUint(h, 0)
		return
	}
	putUint(h, action)
	f.match(h, m, d)
}

// match hashes a rule's peers (pod sets by member, node sets by address,
// address ranges, domain names) and ports.
func (f *fingerprinter) match(h hash.Hash64, m *compile.Match, d compile.Direction) {
	if m.AllPeers {
		putUint(h, 1)
	} else {
		putUint(h, 2)
		putUint(h, uint64(len(m.Selectors)))
		for _, s := range m.Selectors {
			putUint(h, f.selector(s))
		}
		putUint(h, uint64(len(m.Nodes)))
		for _, n := range m.Nodes {
			putAddrs(h, f.p.NodeSets[n].Addrs)
		}
		putUint(h, uint64(len(m.IPBlocks)))
		for _, b := range m.IPBlocks {
			putAddrs(h, []netip.Addr{b.From, b.To})
		}
		// domainNames: what the names resolve to is asked at decision
		// time, the same for both programs; the names are the program's.
		putUint(h, uint64(len(m.Domains)))
		for _, p := range m.Domains {
			putString(h, p.String())
		}
	}
	if m.AllPorts {
		putUint(h, 1)
		return
	}
	putUint(h, uint64(len(m.Ports)))
	for _, p := range m.Ports {
		putUint(h, uint64(p.Protocol)<<32|uint64(p.First)<<16|uint64(p.Last))
	}
	putUint(h, uint64(len(m.NamedPorts)))
	for _, np := range m.NamedPorts {
		putString(h, np.Name)
		putUint(h, uint64(np.Protocol))
	}
	// Egress named ports resolve on the destination pod: with every peer
	// allowed, that is any pod of the program.
	if len(m.NamedPorts) > 0 && d == compile.Egress && m.AllPeers {
		putUint(h, f.everyPod())
	}
}

// selector hashes a peer set by its members: their keys, addresses and
// ports (egress named ports resolve on them).
func (f *fingerprinter) selector(id compile.SelectorID) uint64 {
	if v, ok := f.selectors[id]; ok {
		return v
	}
	sel := &f.p.Selectors[id]
	h := fnv.New64a()
	putString(h, sel.Key)
	putUint(h, uint64(len(sel.Members)))
	for _, pid := range sel.Members {
		pod := &f.p.Pods[pid]
		putString(h, pod.Key)
		putAddrs(h, pod.IPs)
		putPorts(h, pod.Ports)
	}
	v := h.Sum64()
	f.selectors[id] = v
	return v
}

func (f *fingerprinter) everyPod() uint64 {
	if f.hasAll {
		return f.allPods
	}
	h := fnv.New64a()
	for i := range f.p.Pods {
		pod := &f.p.Pods[i]
		putString(h, pod.Key)
		putAddrs(h, pod.IPs)
		putPorts(h, pod.Ports)
	}
	f.allPods, f.hasAll = h.Sum64(), true
	return f.allPods
}
