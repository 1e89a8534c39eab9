package nftnl

import (
	"bytes"
	"net/netip"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// TestDecodeKey: a key read from the kernel turns back into the element's
// key, for single and concatenated keys; a key of the wrong length, a self
// key whose addresses differ and a key of an interval set are errors.
func TestDecodeKey(t *testing.T) {
	a := netip.MustParseAddr
	for _, c := range []struct {
		typ string
		el  compile.Element
	}{
		{"ipv4_addr", compile.AddrElement(a("10.1.2.3"), nil)},
		{"ipv6_addr", compile.AddrElement(a("fd00::1:2"), nil)},
		{"inet_service", compile.Element{Ports: compile.PortRange{First: 8080, Last: 8080}, Shape: compile.ShapePorts}},
		{"ipv4_addr . ipv4_addr", compile.Element{Addr: a("10.0.0.1"), Shape: compile.ShapeAddrAddr}},
		{"ipv6_addr . inet_proto . inet_service", compile.Element{Addr: a("fd00::9"),
			Ports: compile.PortRange{Protocol: compile.ProtoTCP, First: 53, Last: 53}, Shape: compile.ShapeAddrProtoPort}},
		{"inet_proto . inet_service", compile.Element{Ports: compile.PortRange{Protocol: 200, First: 1, Last: 1}, Shape: compile.ShapeProtoPorts}},
	} {
		l, err := LayoutOf(&compile.Set{Key: keyOf(c.typ), Set: &knftables.Set{Name: "s", Type: c.typ}})
		if err != nil {
			t.Fatal(err)
		}
		var els [2]Element
		n, err := l.encode(&c.el, true, &els)
		if err != nil || n != 1 {
			t.Fatalf("%s %s: encode: %v", c.typ, c.el.Text(), err)
		}
		key := els[0].key()
		got, err := l.DecodeKey(key)
		if err != nil || !got.SameKey(&c.el) {
			t.Errorf("%s: DecodeKey(encode(%s)) = %s, %v", c.typ, c.el.Text(), got.Text(), err)
		}
		if _, err := l.DecodeKey(append(key, 0)); err == nil {
			t.Errorf("%s: a key one byte too long decoded", c.typ)
		}
		if _, err := l.DecodeKey(key[:len(key)-1]); err == nil {
			t.Errorf("%s: a key one byte too short decoded", c.typ)
		}
	}
	self, _ := LayoutOf(&compile.Set{Key: keyOf("ipv4_addr . ipv4_addr"), Set: &knftables.Set{Name: "s", Type: "ipv4_addr . ipv4_addr"}})
	if e, err := self.DecodeKey([]byte{10, 0, 0, 1, 10, 0, 0, 2}); err == nil {
		t.Errorf("a self key of two addresses decoded to %s", e.Text())
	}
	ranges, _ := LayoutOf(&compile.Set{Key: keyOf("ipv4_addr"), Set: &knftables.Set{Name: "s", Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag}}})
	if e, err := ranges.DecodeKey([]byte{10, 0, 0, 1}); err == nil {
		t.Errorf("a key of an interval set decoded to %s", e.Text())
	}
}

// FuzzDecodeKey: any bytes either fail to decode or decode to an element
// whose key encodes to the same bytes.
func FuzzDecodeKey(f *testing.F) {
	types := []string{"ipv4_addr", "ipv6_addr", "inet_service", "ipv4_addr . ipv4_addr", "ipv6_addr . ipv6_addr",
		"ipv4_addr . inet_proto . inet_service", "ipv6_addr . inet_proto . inet_service", "inet_proto . inet_service"}
	for i := range types {
		f.Add(uint8(i), []byte{10, 0, 0, 1, 10, 0, 0, 1})
		f.Add(uint8(i), []byte{6, 0, 0, 0, 0, 80, 0, 0})
	}
	f.Fuzz(func(t *testing.T, typ uint8, key []byte) {
		l, err := LayoutOf(&compile.Set{Key: keyOf(types[int(typ)%len(types)]), Set: &knftables.Set{Name: "s", Type: types[int(typ)%len(types)]}})
		if err != nil {
			t.Fatal(err)
		}
		e, err := l.DecodeKey(key)
		if err != nil {
			return
		}
		var els [2]Element
		if n, err := l.encode(&e, true, &els); err != nil || n != 1 || !bytes.Equal(els[0].key(), key) {
			t.Fatalf("%x decodes to %s, which encodes to %x (%d, %v)", key, e.Text(), els[0].key(), n, err)
		}
	})
}
