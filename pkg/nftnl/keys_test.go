package nftnl

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// TestParseField: every field kind's text forms (values, prefixes, ranges,
// protocol names) decode to their first and last values in network byte
// order, and malformed text is an error, never a panic.
func TestParseField(t *testing.T) {
	for _, c := range []struct {
		kind        fieldKind
		text        string
		first, last string // hex; empty: an error
	}{
		{kindIPv4, "10.1.2.3", "0a010203", "0a010203"},
		{kindIPv4, "10.1.0.0/16", "0a010000", "0a01ffff"},
		{kindIPv4, "0.0.0.0/0", "00000000", "ffffffff"},
		{kindIPv4, "10.0.0.1/32", "0a000001", "0a000001"},
		{kindIPv4, "10.0.0.5-10.0.0.9", "0a000005", "0a000009"},
		{kindIPv4, "10.0.0.9-10.0.0.5", "", ""}, // descending
		{kindIPv4, "10.1.0.1/16", "", ""},       // host bits
		{kindIPv4, "fd00::1", "", ""},           // other family
		{kindIPv4, "10.0.0.1-fd00::1", "", ""},  // mixed range
		{kindIPv4, "::ffff:10.0.0.1", "", ""},   // IPv4-mapped
		{kindIPv4, "10.0.0.256", "", ""},
		{kindIPv4, "", "", ""},
		{kindIPv4, "10.0.0.0/33", "", ""},
		{kindIPv6, "fd00::1", "fd000000000000000000000000000001", "fd000000000000000000000000000001"},
		{kindIPv6, "fd00::/112", "fd000000000000000000000000000000", "fd00000000000000000000000000ffff"},
		{kindIPv6, "fe80::1%eth0", "", ""}, // zone
		{kindIPv6, "10.0.0.1", "", ""},
		{kindProto, "tcp", "06", "06"},
		{kindProto, "udp", "11", "11"},
		{kindProto, "sctp", "84", "84"},
		{kindProto, "58", "3a", "3a"},
		{kindProto, "256", "", ""},
		{kindProto, "-1", "", ""},
		{kindProto, "nosuchproto", "", ""},
		{kindService, "80", "0050", "0050"},
		{kindService, "0", "0000", "0000"},
		{kindService, "65535", "ffff", "ffff"},
		{kindService, "8000-8080", "1f40", "1f90"},
		{kindService, "8080-8000", "", ""},
		{kindService, "65536", "", ""},
		{kindService, "http", "", ""},
		{kindService, "80-", "", ""},
		{kindService, "", "", ""},
	} {
		first, last := make([]byte, c.kind.size()), make([]byte, c.kind.size())
		err := parseField(c.kind, c.text, first, last)
		if c.first == "" {
			if err == nil {
				t.Errorf("kind %d %q: decoded to %x-%x, want an error", c.kind, c.text, first, last)
			}
			continue
		}
		if err != nil {
			t.Errorf("kind %d %q: %v", c.kind, c.text, err)
			continue
		}
		if got, want := hex.EncodeToString(first)+"-"+hex.EncodeToString(last), c.first+"-"+c.last; got != want {
			t.Errorf("kind %d %q: %s, want %s", c.kind, c.text, got, want)
		}
	}
}

// TestFormatFieldInvertsParseField: a single value's bytes format back to
// text that decodes to the same bytes, protocols and ports as numbers.
func TestFormatFieldInvertsParseField(t *testing.T) {
	for _, c := range []struct {
		kind fieldKind
		text string
		want string
	}{
		{kindIPv4, "192.0.2.9", "192.0.2.9"},
		{kindIPv6, "fd00:0:0::9", "fd00::9"},
		{kindProto, "tcp", "6"},
		{kindService, "53", "53"},
	} {
		b, again := make([]byte, c.kind.size()), make([]byte, c.kind.size())
		if err := parseField(c.kind, c.text, b, make([]byte, len(b))); err != nil {
			t.Fatalf("%q: %v", c.text, err)
		}
		got := formatField(c.kind, b)
		if got != c.want {
			t.Errorf("formatField(parseField(%q)) = %q, want %q", c.text, got, c.want)
		}
		if err := parseField(c.kind, got, again, make([]byte, len(b))); err != nil || !bytes.Equal(again, b) {
			t.Errorf("%q: its text %q decodes to %x, %v", c.text, got, again, err)
		}
	}
}

// FuzzParseField: any text either fails or decodes to a first value no
// greater than the last, and a single value's formatted text decodes to
// the same bytes.
func FuzzParseField(f *testing.F) {
	for _, s := range []string{"10.0.0.1", "10.0.0.0/8", "10.0.0.1-10.0.0.3", "fd00::/64", "tcp", "17", "80", "1-65535", "::ffff:1.2.3.4", "1.2.3.4/33"} {
		for k := kindIPv4; k <= kindService; k++ {
			f.Add(uint8(k), s)
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, text string) {
		k := fieldKind(kind % uint8(kindService+1))
		first, last := make([]byte, k.size()), make([]byte, k.size())
		if parseField(k, text, first, last) != nil {
			return
		}
		if bytes.Compare(first, last) > 0 {
			t.Fatalf("kind %d %q: first %x after last %x", k, text, first, last)
		}
		if !bytes.Equal(first, last) {
			return
		}
		again := make([]byte, k.size())
		if err := parseField(k, formatField(k, first), again, make([]byte, k.size())); err != nil || !bytes.Equal(again, first) {
			t.Fatalf("kind %d %q: %x formats as %q, which decodes to %x, %v", k, text, first, formatField(k, first), again, err)
		}
	})
}
