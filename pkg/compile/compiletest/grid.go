package compiletest

import (
	"fmt"
	"maps"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// The grid of the upstream NetworkPolicy e2e suite: namespaces x, y, z,
// each with pods a, b, c. Pod "ns/p" has the address 10.244.<ns>.<p> with
// namespaces and pods numbered from 1 (y/b is 10.244.2.2), the label
// pod=<p>, and serves the named ports serve-{80,81}-{tcp,udp,sctp}.
var (
	gridNamespaces = []string{"x", "y", "z"}
	gridPodNames   = []string{"a", "b", "c"}
)

// GridNamespaces returns the grid's namespace names, x, y and z.
func GridNamespaces() []string { return append([]string(nil), gridNamespaces...) }

// GridPods returns the nine pod keys ("x/a" ... "z/c"), sorted.
func GridPods() []string {
	var out []string
	for _, ns := range gridNamespaces {
		for _, p := range gridPodNames {
			out = append(out, ns+"/"+p)
		}
	}
	return out
}

func gridIndex(s string, names []string) int {
	for i, n := range names {
		if n == s {
			return i + 1
		}
	}
	return 0
}

// GridIP is the address of grid pod key ("ns/p"): 10.244.<ns>.<p>. A key
// outside the grid gets a 0 in the octet it does not match.
func GridIP(key string) netip.Addr {
	ns, p, _ := strings.Cut(key, "/")
	return netip.AddrFrom4([4]byte{10, 244, byte(gridIndex(ns, gridNamespaces)), byte(gridIndex(p, gridPodNames))})
}

// GridPorts are the container ports every grid pod serves: 80 and 81 on
// TCP, UDP and SCTP, named serve-<port>-<protocol>.
func GridPorts() []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, n := range []int32{80, 81} {
		for _, p := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP} {
			out = append(out, corev1.ContainerPort{Name: fmt.Sprintf("serve-%d-%s", n, strings.ToLower(string(p))), ContainerPort: n, Protocol: p})
		}
	}
	return out
}

// GridState is the grid's objects in one state: which pods exist, the
// labels added to namespaces (on top of kubernetes.io/metadata.name) and
// the labels that replace a pod's pod=<p>.
type GridState struct {
	Pods      []string
	NSLabels  map[string]map[string]string
	PodLabels map[string]map[string]string
}

// Labels returns the full label set of every namespace of the grid and of
// every pod of s.
func (s GridState) Labels() (nss, pods map[string]map[string]string) {
	nss, pods = map[string]map[string]string{}, map[string]map[string]string{}
	for _, ns := range gridNamespaces {
		nss[ns] = map[string]string{compile.NamespaceNameLabel: ns}
		maps.Copy(nss[ns], s.NSLabels[ns])
	}
	for _, k := range s.Pods {
		_, name, _ := strings.Cut(k, "/")
		pods[k] = map[string]string{"pod": name}
		if l, ok := s.PodLabels[k]; ok {
			pods[k] = maps.Clone(l)
		}
	}
	return nss, pods
}

// Input is the compiler input for s and policies: running pods with their
// grid address and ports, on the node nodeOf returns for their key ("n1"
// when nodeOf is nil).
func (s GridState) Input(policies []*networkingv1.NetworkPolicy, nodeOf func(key string) string) compile.Input {
	nss, podLabels := s.Labels()
	in := compile.Input{Policies: policies}
	for _, ns := range gridNamespaces {
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: nss[ns]}})
	}
	for _, key := range s.Pods {
		ns, name, _ := strings.Cut(key, "/")
		node := "n1"
		if nodeOf != nil {
			node = nodeOf(key)
		}
		ip := GridIP(key).String()
		in.Pods = append(in.Pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: podLabels[key]},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "server", Ports: GridPorts()}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
		})
	}
	return in
}

// --- truth tables ------------------------------------------------------------

// Delta changes the expected verdict of the pairs matching From -> To. A
// pattern is a pod key, "ns/*" (any pod of ns) or "*" (any pod).
type Delta struct {
	From, To string
	Allowed  bool
}

// Allow expects the pairs from -> to to connect.
func Allow(from, to string) Delta { return Delta{from, to, true} }

// Deny expects the pairs from -> to to be blocked.
func Deny(from, to string) Delta { return Delta{from, to, false} }

func patternMatches(pattern, key string) bool {
	if pattern == "*" {
		return true
	}
	if ns, ok := strings.CutSuffix(pattern, "/*"); ok {
		return strings.HasPrefix(key, ns+"/")
	}
	return pattern == key
}

// TruthTable holds a verdict for each ordered pair of distinct pods.
type TruthTable struct {
	Pods    []string
	Allowed map[[2]string]bool
}

// NewTruthTable starts with every pair of pods allowed and applies deltas
// in order; a later delta wins over an earlier one.
func NewTruthTable(pods []string, deltas []Delta) TruthTable {
	t := TruthTable{Pods: pods, Allowed: map[[2]string]bool{}}
	for _, f := range pods {
		for _, to := range pods {
			if f == to {
				continue
			}
			ok := true
			for _, d := range deltas {
				if patternMatches(d.From, f) && patternMatches(d.To, to) {
					ok = d.Allowed
				}
			}
			t.Allowed[[2]string{f, to}] = ok
		}
	}
	return t
}

// Render prints the table the way upstream's suite does: rows are sources,
// columns destinations, '.' allowed, 'X' denied, '-' loopback; cells that
// differ from other (when given) are followed by '*'.
func (t TruthTable) Render(other *TruthTable) string {
	var sb strings.Builder
	sb.WriteString("      ")
	for _, to := range t.Pods {
		fmt.Fprintf(&sb, "%-5s", to)
	}
	sb.WriteString("\n")
	for _, f := range t.Pods {
		fmt.Fprintf(&sb, "%-6s", f)
		for _, to := range t.Pods {
			cell := "-"
			if f != to {
				ok := t.Allowed[[2]string{f, to}]
				cell = "X"
				if ok {
					cell = "."
				}
				if other != nil && other.Allowed[[2]string{f, to}] != ok {
					cell += "*"
				}
			}
			fmt.Fprintf(&sb, "%-5s", cell)
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// VerdictWord is "allowed" or "denied".
func VerdictWord(ok bool) string {
	if ok {
		return "allowed"
	}
	return "denied"
}
