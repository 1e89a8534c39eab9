package controller

import "github.com/nftpolicy/nftpolicy/pkg/compile"

// fingerprintBits keeps the fingerprint exact in a float64 gauge.
const fingerprintBits = 48

// InputsFingerprint identifies the objects a sync was compiled from: the
// kind, namespace, name and resourceVersion of every Pod, Namespace,
// NetworkPolicy and ClusterNetworkPolicy of in, and the name, labels and
// addresses of every Node, whatever their order. Nodes count by content, not
// resourceVersion: their status heartbeats change the latter every few
// seconds and the agent deliberately does not sync on them. The agent exports the
// fingerprint of its last committed sync (nftpolicy_last_synced_inputs_fingerprint);
// computed over the API's current objects, it tells a client that every
// change it made is in force, without sleeping or comparing clocks. It is
// 48 bits wide so that the gauge holds it exactly.
func InputsFingerprint(in compile.Input) uint64 {
	sum, _ := inputsSum(in)
	return finishInputs(sum)
}

// objectTerm is one object's term of the fingerprint's sum.
func objectTerm(kind byte, ns, name, rv string) uint64 {
	h := fnvByte(fnvOffset64, kind)
	h = fnvByte(fnvString(h, ns), 0)
	h = fnvByte(fnvString(h, name), 0)
	return mix64(fnvString(h, rv))
}

func podTerm(p *compile.PodInfo) uint64 {
	return objectTerm('p', p.Namespace, p.Name, p.ResourceVersion)
}

func finishInputs(sum uint64) uint64 { return mix64(sum) >> (64 - fingerprintBits) }

// inputsSum is the fingerprint before mixing, and the pods' terms by key,
// so that pod changes can update it one by one.
func inputsSum(in compile.Input) (uint64, map[string]uint64) {
	// A sum of well-mixed per-object hashes does not depend on the order of
	// the informers' lists, so nothing is sorted or allocated per object.
	var sum uint64
	add := func(kind byte, ns, name, rv string) { sum += objectTerm(kind, ns, name, rv) }
	pods := make(map[string]uint64, len(in.Pods)+len(in.PodInfos))
	for _, p := range in.Pods {
		h := objectTerm('p', p.Namespace, p.Name, p.ResourceVersion)
		pods[p.Namespace+"/"+p.Name] = h
		sum += h
	}
	for _, p := range in.PodInfos {
		h := podTerm(p)
		pods[p.Key] = h
		sum += h
	}
	for _, ns := range in.Namespaces {
		sum += namespaceTerm(ns)
	}
	for _, np := range in.Policies {
		add('P', np.Namespace, np.Name, np.ResourceVersion)
	}
	for _, cnp := range in.ClusterPolicies {
		add('C', "", cnp.Name, cnp.ResourceVersion)
	}
	for _, n := range in.Nodes {
		// Labels and addresses hash as sums too: map order is random.
		var ls, as uint64
		for k, v := range n.Labels {
			ls += mix64(fnvString(fnvByte(fnvString(fnvOffset64, k), 0), v))
		}
		for _, a := range n.Status.Addresses {
			as += mix64(fnvString(fnvByte(fnvString(fnvOffset64, string(a.Type)), 0), a.Address))
		}
		h := fnvByte(fnvString(fnvByte(fnvOffset64, 'N'), n.Name), 0)
		sum += mix64(mix64(h^ls) ^ as)
	}
	return sum, pods
}

// mix64 is SplitMix64's finalizer: every input bit affects every output bit.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// FNV-1a, inlined so that hashing strings does not allocate.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

func fnvByte(h uint64, b byte) uint64 { return (h ^ uint64(b)) * fnvPrime64 }

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = fnvByte(h, s[i])
	}
	return h
}
