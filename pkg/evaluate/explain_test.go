package evaluate_test

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// applyChange re-decides a connection after a nearest miss's change: another
// protocol and port, relabelled objects (the program is rebuilt), or another
// remote address. It returns the verdict of the miss's direction.
func applyChange(t *testing.T, in compile.Input, prog *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16, m evaluate.Miss) bool {
	t.Helper()
	c := m.Change
	switch {
	case c.Port != 0 || c.Protocol != 0:
		proto, port = c.Protocol, c.Port
	case c.Pod != "" || c.Namespace != "":
		relabel := func(l map[string]string) map[string]string {
			out := map[string]string{}
			for k, v := range l {
				out[k] = v
			}
			for k, v := range c.SetLabels {
				out[k] = v
			}
			for _, k := range c.RemoveLabels {
				delete(out, k)
			}
			return out
		}
		changed := in
		changed.Pods = append(changed.Pods[:0:0], in.Pods...)
		changed.Namespaces = append(changed.Namespaces[:0:0], in.Namespaces...)
		found := false
		for i, p := range changed.Pods {
			if c.Pod == p.Namespace+"/"+p.Name {
				cp := p.DeepCopy()
				cp.Labels = relabel(cp.Labels)
				changed.Pods[i], found = cp, true
			}
		}
		for i, ns := range changed.Namespaces {
			if c.Namespace == ns.Name {
				cn := ns.DeepCopy()
				cn.Labels = relabel(cn.Labels)
				changed.Namespaces[i], found = cn, true
			}
		}
		if !found {
			t.Fatalf("miss %+v names no object of the input", m)
		}
		prog = compile.Build(changed)
	case c.Remote.IsValid():
		if m.Direction == compile.Egress {
			dst = c.Remote
		} else {
			src = c.Remote
		}
	default:
		t.Fatalf("miss %+v suggests no change", m)
	}
	v := evaluate.Evaluate(prog, src, dst, proto, port)
	if m.Direction == compile.Egress {
		return v.Egress
	}
	return v.Ingress
}

// checkExplanations explains every ordered pair of pods of a program: the
// verdict is Evaluate's, a denial names a policy, an allowed connection has
// no nearest miss, and every nearest miss's change, applied, lets the
// direction through. It counts the conditions seen.
func checkExplanations(t *testing.T, in compile.Input, prog *compile.Program, pods []string, proto compile.Protocol, port uint16,
	policyNames []string, seen map[evaluate.Condition]int) (denials, withMiss int) {
	t.Helper()
	for _, from := range pods {
		for _, to := range pods {
			if from == to {
				continue
			}
			src, dst := ct.GridIP(from), ct.GridIP(to)
			ex := evaluate.Explain(prog, src, dst, proto, port)
			if v := evaluate.Evaluate(prog, src, dst, proto, port); v != ex.Verdict {
				t.Fatalf("%s -> %s: Explain's verdict %+v differs from Evaluate's %+v", from, to, ex.Verdict, v)
			}
			if ex.Allowed {
				if len(ex.NearestMiss) != 0 {
					t.Errorf("%s -> %s allowed, but nearest misses %+v", from, to, ex.NearestMiss)
				}
				continue
			}
			denials++
			named := false
			for _, n := range policyNames {
				named = named || strings.Contains(ex.Reason(), n)
			}
			if !named {
				t.Errorf("%s -> %s %s %d denied: reason %q names no policy of %v", from, to, proto, port, ex.Reason(), policyNames)
			}
			if len(ex.NearestMiss) > 0 {
				withMiss++
			}
			for _, m := range ex.NearestMiss {
				if m.Condition == "" || m.Detail == "" || m.Rule == "" {
					t.Errorf("%s -> %s: incomplete miss %+v", from, to, m)
				}
				if (m.Direction == compile.Egress && ex.Egress) || (m.Direction == compile.Ingress && ex.Ingress) {
					t.Errorf("%s -> %s: miss %+v for a direction that allowed", from, to, m)
				}
				seen[m.Condition]++
				if !applyChange(t, in, prog, src, dst, proto, port, m) {
					t.Errorf("%s -> %s %s %d: applying the nearest miss %q (%s: %s) does not allow %s",
						from, to, proto, port, m.Rule, m.Condition, m.Detail, m.Direction)
				}
			}
		}
	}
	return denials, withMiss
}

func TestExplainNetpolCases(t *testing.T) {
	seen := map[evaluate.Condition]int{}
	var denials, withMiss int
	for _, c := range ct.NetpolCases() {
		t.Run(fmt.Sprintf("%02d %s", c.Num, c.Name), func(t *testing.T) {
			pods := append([]string(nil), c.Pods...)
			sort.Strings(pods)
			for _, st := range c.Steps {
				in := st.Grid(pods).Input(st.Policies, nil)
				prog := compile.Build(in)
				var names []string
				for _, np := range st.Policies {
					names = append(names, np.Namespace+"/"+np.Name)
				}
				for _, e := range st.Expect {
					// The expectation's port and protocol, and the other
					// protocols on the same port: misses by protocol.
					for _, proto := range []compile.Protocol{e.Proto, ct.TCP, ct.UDP, ct.SCTP} {
						d, w := checkExplanations(t, in, prog, pods, proto, e.Port, names, seen)
						denials, withMiss = denials+d, withMiss+w
					}
				}
			}
		})
	}
	t.Logf("%d denials, %d with nearest misses; conditions: %v", denials, withMiss, seen)
	for _, c := range []evaluate.Condition{evaluate.CondPort, evaluate.CondProtocol, evaluate.CondPodLabel, evaluate.CondNamespaceLabel, evaluate.CondCIDR, evaluate.CondCIDRExcept} {
		if seen[c] == 0 {
			t.Errorf("no nearest miss on %s in the 48 cases", c)
		}
	}
}

// TestExplainClusterNetworkPolicy: a ClusterNetworkPolicy Deny names its
// policy and rule; the Accept rule before it in the tier that misses by one
// condition is the nearest miss; a node peer's miss names the node address.
func TestExplainClusterNetworkPolicy(t *testing.T) {
	pods := []string{"x/a", "x/b", "y/a", "y/b"}
	g := ct.GridState{Pods: pods, NSLabels: map[string]map[string]string{"x": {"ns": "x"}, "y": {"ns": "y"}}}
	in := g.Input(nil, nil)
	in.Nodes = cnpNodes
	in.ClusterPolicies = cnps(
		ct.CNP("x-guard", "Admin", 10, ct.NamespacesSubject(ct.Sel("ns", "x")),
			ct.CNPIngress(
				ct.CNPRule("web-from-y", "Accept", ct.ToPods(ct.Sel("ns", "y"), ct.Sel("pod", "a"))).On(ct.Proto("TCP", 443)),
				ct.CNPRule("rest", "Deny", ct.ToNamespaces(ct.Sel()))),
			ct.CNPEgress(
				ct.CNPRule("to-n2", "Accept", ct.ToNodes(ct.Sel("zone", "b"))),
				ct.CNPRule("no-nodes", "Deny", ct.ToNetworks("172.18.0.0/16")))),
	)
	prog := compile.Build(in)
	if len(prog.Problems) > 0 {
		t.Fatalf("problems: %v", prog.Problems)
	}

	ex := evaluate.Explain(prog, ct.GridIP("y/a"), ct.GridIP("x/a"), ct.TCP, 80)
	if ex.Allowed || !strings.Contains(ex.IngressReason, "x-guard") || !strings.Contains(ex.IngressReason, "rule rest") {
		t.Fatalf("y/a -> x/a TCP 80: %+v; want denied by x-guard rule rest", ex.Verdict)
	}
	if len(ex.NearestMiss) != 1 || ex.NearestMiss[0].Condition != evaluate.CondPort || ex.NearestMiss[0].Change.Port != 443 ||
		!strings.Contains(ex.NearestMiss[0].Rule, "web-from-y") {
		t.Fatalf("y/a -> x/a TCP 80: nearest misses %+v; want web-from-y by port 443", ex.NearestMiss)
	}
	if !applyChange(t, in, prog, ct.GridIP("y/a"), ct.GridIP("x/a"), ct.TCP, 80, ex.NearestMiss[0]) {
		t.Error("port 443 does not allow y/a -> x/a")
	}

	ex = evaluate.Explain(prog, ct.GridIP("y/b"), ct.GridIP("x/a"), ct.TCP, 443)
	if len(ex.NearestMiss) != 1 || ex.NearestMiss[0].Condition != evaluate.CondPodLabel || ex.NearestMiss[0].Change.SetLabels["pod"] != "a" {
		t.Fatalf("y/b -> x/a TCP 443: nearest misses %+v; want a pod label pod=a", ex.NearestMiss)
	}
	if !applyChange(t, in, prog, ct.GridIP("y/b"), ct.GridIP("x/a"), ct.TCP, 443, ex.NearestMiss[0]) {
		t.Error("relabelling y/b does not allow y/b -> x/a")
	}

	n1 := netip.MustParseAddr("172.18.0.1")
	ex = evaluate.Explain(prog, ct.GridIP("x/a"), n1, ct.TCP, 10250)
	if ex.Allowed || len(ex.NearestMiss) != 1 || ex.NearestMiss[0].Condition != evaluate.CondNode ||
		ex.NearestMiss[0].Change.Remote != netip.MustParseAddr("172.18.0.2") {
		t.Fatalf("x/a -> n1: %+v %+v; want denied, nearest miss the zone=b node", ex.Verdict, ex.NearestMiss)
	}
	if !applyChange(t, in, prog, ct.GridIP("x/a"), n1, ct.TCP, 10250, ex.NearestMiss[0]) {
		t.Error("the zone=b node's address is not allowed")
	}
}
