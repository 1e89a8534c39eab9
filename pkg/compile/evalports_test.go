package compile

import (
	"fmt"
	"net/netip"
	"testing"
)

// TestEvalPortMatches checks PortMatches and the rules' port filters
// against the ports of the Match itself, resolved on the pod as the kernel
// ruleset does (Pod.NamedPort: the first container port of a name and
// protocol): for inline and spilled matches, narrow and wide ranges, named
// ports of small and large interned indices, any-protocol named ports,
// pods whose ports repeat a name, and a destination that is not a pod. A
// port filter may let a rule through that does not match, never the
// reverse.
func TestEvalPortMatches(t *testing.T) {
	// The filler names come after the others, so that rules name ports
	// below, within and past both the filters' (32) and the queries' (64)
	// bit ranges.
	var filler []NamedPortRef
	for i := 0; i < 70; i++ {
		filler = append(filler, NamedPortRef{Name: fmt.Sprintf("filler-%d", i), Protocol: ProtoTCP})
	}
	matches := []Match{
		{AllPorts: true},
		{Ports: []PortRange{{ProtoTCP, 8080, 8080}}},
		{Ports: []PortRange{{ProtoUDP, 53, 53}, {ProtoTCP, 53, 53}}},
		{Ports: []PortRange{{ProtoTCP, 8000, 8030}}},
		{Ports: []PortRange{{ProtoTCP, 8000, 8100}}},
		{Ports: []PortRange{{ProtoTCP, 4000, 4200}}},
		{Ports: []PortRange{{ProtoTCP, 443, 443}, {ProtoUDP, 100, 60000}}},
		{Ports: []PortRange{{ProtoTCP, 1, 2}, {ProtoTCP, 80, 80}, {ProtoUDP, 443, 443}}},
		{NamedPorts: []NamedPortRef{{"http", ProtoTCP}}},
		{NamedPorts: []NamedPortRef{{"dns", ProtoUDP}, {"metrics", ProtoTCP}}},
		{NamedPorts: []NamedPortRef{{"http", 0}}},
		{Ports: []PortRange{{ProtoTCP, 9090, 9090}}, NamedPorts: []NamedPortRef{{"metrics", ProtoTCP}, {"grpc", ProtoTCP}, {"http", ProtoTCP}}},
		{NamedPorts: filler},
		{NamedPorts: []NamedPortRef{{"filler-65", ProtoTCP}}},
		{NamedPorts: []NamedPortRef{{"filler-33", 0}}},
	}
	pods := []Pod{
		{PodInfo: &PodInfo{Ports: []ContainerPort{{"http", ProtoTCP, 8080}, {"metrics", ProtoTCP, 9090}, {"grpc", ProtoTCP, 50051}}}},
		{PodInfo: &PodInfo{Ports: []ContainerPort{{"http", ProtoTCP, 8081}, {"http", ProtoTCP, 8080}, {"dns", ProtoUDP, 53}, {"dns", ProtoTCP, 5353}}}},
		{PodInfo: &PodInfo{Ports: []ContainerPort{{"filler-65", ProtoTCP, 7000}, {"filler-33", ProtoUDP, 7001}, {"http", ProtoUDP, 8080},
			{"metrics", ProtoTCP, 9091}, {"grpc", ProtoTCP, 50052}}}},
		{PodInfo: &PodInfo{}},
	}
	p := &Program{Pods: pods}
	for i := range p.Pods {
		p.Pods[i].Subject = subjectFor(false)
		p.Pods[i].IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})}
	}
	ix := &indexer{p: p, x: &p.Eval, names: map[string]int32{}}
	for i := range matches {
		for _, np := range matches[i].NamedPorts {
			ix.intern(np.Name)
		}
	}
	if ix.names["http"] >= filterNames || ix.names["filler-65"] < namesInMask {
		t.Fatalf("port names interned as %v", ix.names)
	}
	ix.pods()
	x := &p.Eval
	ems, filters := make([]EvalMatch, len(matches)), make([]uint64, len(matches))
	spilled := 0
	for i := range matches {
		ems[i], filters[i] = ix.match(&matches[i]), ix.portFilter(&matches[i])
		if ems[i].Spill >= 0 {
			spilled++
		}
	}
	if spilled == 0 {
		t.Fatal("no match spilled: the spilled path is not tested")
	}
	ports := []uint16{0, 1, 2, 3, 53, 80, 99, 100, 443, 4095, 4096, 4200, 4201, 4999, 60000, 60001, 5353, 7000, 7001, 7999, 8000, 8030, 8031, 8050, 8080, 8081, 8100, 8101, 9090, 9091, 50051, 50052, 65535}
	filtered := 0
	for pi := -1; pi < len(pods); pi++ {
		var dst *PodRecord
		if pi >= 0 {
			dst = x.RecordByAddr(p.Pods[pi].IPs[0])
		}
		for _, proto := range []Protocol{ProtoTCP, ProtoUDP, ProtoSCTP} {
			for _, port := range ports {
				q := PortQuery{Dst: dst, Proto: proto, Port: port}
				x.ResolveNames(&q)
				for i := range matches {
					want := matches[i].AllPorts
					for _, pr := range matches[i].Ports {
						want = want || pr.Protocol == proto && pr.First <= port && port <= pr.Last
					}
					for _, np := range matches[i].NamedPorts {
						if pi < 0 || np.Protocol != 0 && np.Protocol != proto {
							continue
						}
						n, ok := p.Pods[pi].NamedPort(np.Name, proto)
						want = want || ok && n == port
					}
					if got := x.PortMatches(&ems[i], &q); got != want {
						t.Errorf("match %d, pod %d, %v/%d: PortMatches %v, want %v", i, pi, proto, port, got, want)
					}
					if filters[i]&q.Filter == 0 {
						filtered++
						if want {
							t.Errorf("match %d, pod %d, %v/%d: the port filter rules out a matching port", i, pi, proto, port)
						}
					}
				}
			}
		}
	}
	if filtered == 0 {
		t.Error("the port filters never ruled a rule out")
	}
	// A range too long for the ports' residues is summarized by its blocks
	// of ports: a port in another block is ruled out.
	wide := ix.portFilter(&Match{Ports: []PortRange{{ProtoTCP, 8000, 8100}}})
	for _, c := range []struct {
		port uint16
		out  bool
	}{{443, true}, {50051, true}, {12287, true}, {8080, false}, {4096, false}, {8191, false}, {8192, true}} {
		q := PortQuery{Proto: ProtoTCP, Port: c.port}
		x.ResolveNames(&q)
		if out := wide&q.Filter == 0; out != c.out {
			t.Errorf("range 8000-8100, port %d: ruled out %v, want %v", c.port, out, c.out)
		}
	}
}
