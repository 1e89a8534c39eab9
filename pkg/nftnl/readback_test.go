package nftnl

import (
	"slices"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// TestDecodeKey: a key read from the kernel turns back into the text the
// desired element has (protocols as numbers), for single and concatenated
// keys; a key of the wrong length is an error.
func TestDecodeKey(t *testing.T) {
	for _, c := range []struct {
		typ  string
		key  []string
		want []string
	}{
		{"ipv4_addr", []string{"10.1.2.3"}, []string{"10.1.2.3"}},
		{"ipv6_addr", []string{"fd00::1:2"}, []string{"fd00::1:2"}},
		{"inet_service", []string{"8080"}, []string{"8080"}},
		{"ipv4_addr . ipv4_addr", []string{"10.0.0.1", "192.0.2.9"}, []string{"10.0.0.1", "192.0.2.9"}},
		{"ipv6_addr . inet_proto . inet_service", []string{"fd00::9", "tcp", "53"}, []string{"fd00::9", "6", "53"}},
	} {
		l, err := LayoutOf(&compile.Set{Set: &knftables.Set{Name: "s", Type: c.typ}})
		if err != nil {
			t.Fatal(err)
		}
		var els [2]Element
		n, err := l.encode(&knftables.Element{Key: c.key}, true, &els)
		if err != nil || n != 1 {
			t.Fatalf("%s %v: encode: %v", c.typ, c.key, err)
		}
		key := els[0].key()
		got, err := l.DecodeKey(key)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: DecodeKey(encode(%v)) = %v, %v; want %v", c.typ, c.key, got, err, c.want)
		}
		if _, err := l.DecodeKey(append(key, 0)); err == nil {
			t.Errorf("%s: a key one byte too long decoded", c.typ)
		}
		if _, err := l.DecodeKey(key[:len(key)-1]); err == nil {
			t.Errorf("%s: a key one byte too short decoded", c.typ)
		}
	}
}
