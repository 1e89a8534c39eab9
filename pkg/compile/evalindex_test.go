package compile

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"unsafe"
)

// TestEvalRecordSizes keeps the records a verdict reads at one cache line.
func TestEvalRecordSizes(t *testing.T) {
	if n := unsafe.Sizeof(PodRecord{}); n != 64 {
		t.Errorf("PodRecord is %d bytes, want 64", n)
	}
	if n := unsafe.Sizeof(EvalRule{}); n != 64 {
		t.Errorf("EvalRule is %d bytes, want 64", n)
	}
	if n := unsafe.Sizeof(EvalMatch{}); n != 48 {
		t.Errorf("EvalMatch is %d bytes, want 48", n)
	}
}

// TestPodByAddr checks the address tables against a map, with clustered
// and scattered IPv4 addresses (collisions and wrap-around at the end of
// the table), the extreme addresses, IPv6 and zoned IPv6.
func TestPodByAddr(t *testing.T) {
	for _, n := range []int{0, 1, 7, 100, 5000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 9))
			want := map[netip.Addr]PodID{}
			p := &Program{}
			add := func(a netip.Addr) {
				if _, dup := want[a]; dup {
					return
				}
				id := PodID(len(p.Pods))
				want[a] = id
				p.Pods = append(p.Pods, Pod{PodInfo: &PodInfo{}, IPs: []netip.Addr{a}, Subject: subjectFor(false)})
			}
			for i := 0; i < n; i++ {
				switch i % 5 {
				case 0:
					add(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}))
				case 1:
					add(netip.AddrFrom4([4]byte{byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())}))
				case 2:
					add(netip.AddrFrom16([16]byte{0xfd, 15: byte(i), 14: byte(i >> 8)}))
				case 3:
					add(netip.AddrFrom16([16]byte{0xfe, 0x80, 15: byte(i), 14: byte(i >> 8)}).WithZone("eth0"))
				default:
					add(netip.AddrFrom4([4]byte{0, 0, byte(i >> 8), byte(i)}))
				}
			}
			if n > 0 {
				add(netip.AddrFrom4([4]byte{}))
				add(netip.AddrFrom4([4]byte{255, 255, 255, 255}))
			}
			p.buildEvalIndex()
			for a, id := range want {
				if got, ok := p.PodByIP(a); !ok || got != id {
					t.Fatalf("PodByIP(%s) = %d, %v; want %d", a, got, ok, id)
				}
			}
			for i := 0; i < 2000; i++ {
				a := netip.AddrFrom4([4]byte{byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())})
				_, in := want[a]
				if _, ok := p.PodByIP(a); ok != in {
					t.Fatalf("PodByIP(%s) found %v, want %v", a, ok, in)
				}
			}
			for _, a := range []string{"fd00::ffff", "fe80::1", "fe80::1%eth1", "10.244.255.255"} {
				_, in := want[netip.MustParseAddr(a)]
				if _, ok := p.PodByIP(netip.MustParseAddr(a)); ok != in {
					t.Fatalf("PodByIP(%s) found %v, want %v", a, ok, in)
				}
			}
			v4 := 0
			for a := range want {
				if a.Is4() {
					v4++
				}
			}
			if 2*v4 > len(p.Eval.V4) {
				t.Errorf("%d slots for %d IPv4 addresses: more than half full", len(p.Eval.V4), v4)
			}
		})
	}
}

// TestDeniedReason checks the denial reasons read from the pods' records
// against the Pods' own, for reasons that fit a record and reasons too long
// for its length fields (left in the Pod), in both directions and through
// the IPv4 slots as well as Pods.
func TestDeniedReason(t *testing.T) {
	long := func(c string) string {
		b := make([]byte, 70000)
		for i := range b {
			b[i] = c[0]
		}
		return string(b)
	}
	reasons := [][2]string{
		{"", ""},
		{"ns/a isolates ns/p1 for ingress; no rule matched", ""},
		{"", "ns/b isolates ns/p2 for egress; no rule matched"},
		{long("i"), "ns/c isolates ns/p3 for egress; no rule matched"},
		{"ns/d isolates ns/p4 for ingress; no rule matched", long("e")},
		{long("x"), long("y")},
		{"ns/e isolates ns/p6 for ingress; no rule matched", "ns/e isolates ns/p6 for egress; no rule matched"},
	}
	p := &Program{}
	for i, r := range reasons {
		p.Pods = append(p.Pods, Pod{PodInfo: &PodInfo{}, IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})},
			Subject: &Subject{IngressTable: -1, EgressTable: -1, IngressDenied: r[0], EgressDenied: r[1]}, Local: true})
	}
	p.buildEvalIndex()
	for i, r := range reasons {
		pod := &p.Pods[i]
		if pod.IngressDenied != r[0] || pod.EgressDenied != r[1] {
			t.Fatalf("pod %d: the build changed its reasons", i)
		}
		for _, rec := range []*PodRecord{p.Eval.RecordByAddr(pod.IPs[0])} {
			if got := p.DeniedReason(rec, Ingress); got != r[0] {
				t.Errorf("pod %d: ingress reason %.40q, want %.40q", i, got, r[0])
			}
			if got := p.DeniedReason(rec, Egress); got != r[1] {
				t.Errorf("pod %d: egress reason %.40q, want %.40q", i, got, r[1])
			}
		}
		if r := p.Eval.RecordByAddr(pod.IPs[0]); (len(pod.IngressDenied) >= deniedSpilled) != (r.IngressDeniedLen == deniedSpilled) ||
			(len(pod.EgressDenied) >= deniedSpilled) != (r.EgressDeniedLen == deniedSpilled) {
			t.Errorf("pod %d: record lengths %d, %d for reasons of %d and %d bytes", i,
				r.IngressDeniedLen, r.EgressDeniedLen, len(pod.IngressDenied), len(pod.EgressDenied))
		}
	}
	if len(p.Eval.Denied) >= deniedSpilled {
		t.Errorf("Denied holds %d bytes: the long reasons were copied into it", len(p.Eval.Denied))
	}
}
