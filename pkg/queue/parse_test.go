package queue

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// ipv4 builds an IPv4 header (with optional options) followed by l4.
func ipv4(proto uint8, src, dst string, fragField uint16, options []byte, l4 []byte) []byte {
	ihl := 20 + len(options)
	b := make([]byte, ihl+len(l4))
	b[0] = 0x40 | byte(ihl/4)
	binary.BigEndian.PutUint16(b[2:4], uint16(len(b)))
	binary.BigEndian.PutUint16(b[6:8], fragField)
	b[8] = 64
	b[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	copy(b[20:], options)
	copy(b[ihl:], l4)
	return b
}

// ipv6 builds an IPv6 header followed by rest (extension headers and l4).
func ipv6(next uint8, src, dst string, rest []byte) []byte {
	b := make([]byte, 40+len(rest))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:6], uint16(len(rest)))
	b[6] = next
	b[7] = 64
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
	copy(b[40:], rest)
	return b
}

// ports is the first 4 bytes of a TCP/UDP/SCTP header plus padding.
func ports(sp, dp uint16, pad int) []byte {
	b := make([]byte, 4+pad)
	binary.BigEndian.PutUint16(b[0:2], sp)
	binary.BigEndian.PutUint16(b[2:4], dp)
	return b
}

// ext builds a generic IPv6 extension header (hop-by-hop, routing, dest opts)
// of 8*(hdrExtLen+1) bytes.
func ext(next uint8, hdrExtLen uint8) []byte {
	b := make([]byte, 8*(int(hdrExtLen)+1))
	b[0] = next
	b[1] = hdrExtLen
	return b
}

// frag6 builds an IPv6 fragment header with offset in 8-byte units.
func frag6(next uint8, offset uint16, more bool) []byte {
	b := make([]byte, 8)
	b[0] = next
	f := offset << 3
	if more {
		f |= 1
	}
	binary.BigEndian.PutUint16(b[2:4], f)
	binary.BigEndian.PutUint32(b[4:8], 0xdeadbeef)
	return b
}

// ah builds an authentication header with payload length pl (4-byte units - 2).
func ah(next uint8, pl uint8) []byte {
	b := make([]byte, (int(pl)+2)*4)
	b[0] = next
	b[1] = pl
	return b
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

const (
	c4 = "10.0.0.1"
	s4 = "10.0.1.2"
	c6 = "fd00::1"
	s6 = "fd00:1::2"
)

func TestParsePacket(t *testing.T) {
	tcp4 := ipv4(6, c4, s4, 0x4000 /* DF */, nil, ports(40000, 80, 16))
	longHop := ext(17, 20) // 168 bytes: beyond a 128-byte copy range
	tests := []struct {
		name string
		b    []byte
		want Packet
		err  error
	}{
		{name: "ipv4 tcp", b: tcp4,
			want: Packet{Family: 4, Src: netip.MustParseAddr(c4), Dst: netip.MustParseAddr(s4), Proto: 6, SrcPort: 40000, DstPort: 80}},
		{name: "ipv4 udp cut after ports", b: ipv4(17, c4, s4, 0, nil, ports(5353, 53, 0)),
			want: Packet{Family: 4, Src: netip.MustParseAddr(c4), Dst: netip.MustParseAddr(s4), Proto: 17, SrcPort: 5353, DstPort: 53}},
		{name: "ipv4 sctp", b: ipv4(132, c4, s4, 0, nil, ports(1, 2, 8)),
			want: Packet{Family: 4, Src: netip.MustParseAddr(c4), Dst: netip.MustParseAddr(s4), Proto: 132, SrcPort: 1, DstPort: 2}},
		{name: "ipv4 udplite", b: ipv4(136, c4, s4, 0, nil, ports(7, 8, 4)),
			want: Packet{Family: 4, Src: netip.MustParseAddr(c4), Dst: netip.MustParseAddr(s4), Proto: 136, SrcPort: 7, DstPort: 8}},
		{name: "ipv4 with options", b: ipv4(6, c4, s4, 0, []byte{1, 1, 1, 0, 7, 4, 0, 0}, ports(1234, 443, 16)),
			want: Packet{Family: 4, Src: netip.MustParseAddr(c4), Dst: netip.MustParseAddr(s4), Proto: 6, SrcPort: 1234, DstPort: 443}},
		{name: "ipv4 icmp has no ports", b: ipv4(1, c4, s4, 0, nil, []byte{8, 0, 0, 0, 0, 1, 0, 1}),
			want: Packet{Family: 4, Src: netip.MustParseAddr(c4), Dst: netip.MustParseAddr(s4), Proto: 1}},
		{name: "ipv4 first fragment has ports", b: ipv4(17, c4, s4, 0x2000 /* MF */, nil, ports(1000, 53, 4)),
			want: Packet{Family: 4, Src: netip.MustParseAddr(c4), Dst: netip.MustParseAddr(s4), Proto: 17, SrcPort: 1000, DstPort: 53}},
		{name: "ipv4 non-first fragment: ports 0", b: ipv4(17, c4, s4, 0x2000|185, nil, ports(1000, 53, 4)),
			want: Packet{Family: 4, Src: netip.MustParseAddr(c4), Dst: netip.MustParseAddr(s4), Proto: 17}},
		{name: "ipv4 last fragment, no payload copied", b: ipv4(6, c4, s4, 3, nil, nil),
			want: Packet{Family: 4, Src: netip.MustParseAddr(c4), Dst: netip.MustParseAddr(s4), Proto: 6}},
		{name: "ipv6 tcp", b: ipv6(6, c6, s6, ports(50000, 8080, 16)),
			want: Packet{Family: 6, Src: netip.MustParseAddr(c6), Dst: netip.MustParseAddr(s6), Proto: 6, SrcPort: 50000, DstPort: 8080}},
		{name: "ipv6 hop-by-hop + dstopts + udp", b: ipv6(0, c6, s6, cat(ext(60, 0), ext(17, 1), ports(1, 53, 4))),
			want: Packet{Family: 6, Src: netip.MustParseAddr(c6), Dst: netip.MustParseAddr(s6), Proto: 17, SrcPort: 1, DstPort: 53}},
		{name: "ipv6 routing + AH + tcp", b: ipv6(43, c6, s6, cat(ext(51, 2), ah(6, 4), ports(2, 22, 16))),
			want: Packet{Family: 6, Src: netip.MustParseAddr(c6), Dst: netip.MustParseAddr(s6), Proto: 6, SrcPort: 2, DstPort: 22}},
		{name: "ipv6 first fragment", b: ipv6(44, c6, s6, cat(frag6(17, 0, true), ports(9, 53, 4))),
			want: Packet{Family: 6, Src: netip.MustParseAddr(c6), Dst: netip.MustParseAddr(s6), Proto: 17, SrcPort: 9, DstPort: 53}},
		{name: "ipv6 non-first fragment: ports 0", b: ipv6(44, c6, s6, cat(frag6(17, 100, false), ports(9, 53, 4))),
			want: Packet{Family: 6, Src: netip.MustParseAddr(c6), Dst: netip.MustParseAddr(s6), Proto: 17}},
		{name: "ipv6 hop-by-hop + non-first fragment", b: ipv6(0, c6, s6, cat(ext(44, 0), frag6(6, 1, true))),
			want: Packet{Family: 6, Src: netip.MustParseAddr(c6), Dst: netip.MustParseAddr(s6), Proto: 6}},
		{name: "ipv6 icmpv6", b: ipv6(58, c6, s6, []byte{128, 0, 0, 0}),
			want: Packet{Family: 6, Src: netip.MustParseAddr(c6), Dst: netip.MustParseAddr(s6), Proto: 58}},
		{name: "ipv6 no next header", b: ipv6(59, c6, s6, nil),
			want: Packet{Family: 6, Src: netip.MustParseAddr(c6), Dst: netip.MustParseAddr(s6), Proto: 59}},
		{name: "ipv6 esp: no ports", b: ipv6(50, c6, s6, make([]byte, 16)),
			want: Packet{Family: 6, Src: netip.MustParseAddr(c6), Dst: netip.MustParseAddr(s6), Proto: 50}},
		{name: "ipv6 sctp after dstopts", b: ipv6(60, c6, s6, cat(ext(132, 0), ports(5, 6, 8))),
			want: Packet{Family: 6, Src: netip.MustParseAddr(c6), Dst: netip.MustParseAddr(s6), Proto: 132, SrcPort: 5, DstPort: 6}},

		{name: "empty", b: nil, err: ErrTruncated},
		{name: "version 5", b: []byte{0x50, 0, 0, 0}, err: ErrVersion},
		{name: "ipv4 short header", b: tcp4[:19], err: ErrTruncated},
		{name: "ipv4 ihl < 5", b: func() []byte { b := append([]byte(nil), tcp4...); b[0] = 0x44; return b }(), err: ErrHeader},
		{name: "ipv4 options cut", b: ipv4(6, c4, s4, 0, make([]byte, 20), nil)[:30], err: ErrTruncated},
		{name: "ipv4 tcp ports cut", b: tcp4[:23], err: ErrTruncated},
		{name: "ipv4 first fragment ports cut", b: ipv4(17, c4, s4, 0x2000, nil, []byte{1, 2}), err: ErrTruncated},
		{name: "ipv6 short header", b: ipv6(6, c6, s6, nil)[:39], err: ErrTruncated},
		{name: "ipv6 tcp ports cut", b: ipv6(6, c6, s6, []byte{1, 2, 3}), err: ErrTruncated},
		{name: "ipv6 ext header length byte missing", b: ipv6(0, c6, s6, []byte{17}), err: ErrTruncated},
		{name: "ipv6 ext header body cut", b: ipv6(0, c6, s6, ext(17, 3)[:20]), err: ErrTruncated},
		{name: "ipv6 ext headers beyond copy range", b: ipv6(0, c6, s6, cat(longHop, ports(1, 2, 0)))[:128], err: ErrTruncated},
		{name: "ipv6 fragment header cut", b: ipv6(44, c6, s6, frag6(17, 0, true)[:6]), err: ErrTruncated},
		{name: "ipv6 AH cut", b: ipv6(51, c6, s6, ah(6, 4)[:10]), err: ErrTruncated},
		{name: "ipv6 too many ext headers", b: ipv6(60, c6, s6, cat(ext(60, 0), ext(60, 0), ext(60, 0), ext(60, 0), ext(60, 0),
			ext(60, 0), ext(60, 0), ext(60, 0), ext(60, 0), ext(6, 0), ports(1, 2, 16))), err: ErrExtHeader},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePacket(tc.b)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("ParsePacket() error = %v, want %v (packet %+v)", err, tc.err, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePacket() error = %v", err)
			}
			if got != tc.want {
				t.Fatalf("ParsePacket() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestParsePacketPrefixes feeds every prefix of valid packets: it must never
// panic, and must either fail or return a consistent result.
func TestParsePacketPrefixes(t *testing.T) {
	pkts := [][]byte{
		ipv4(6, c4, s4, 0, []byte{1, 1, 1, 0}, ports(1, 80, 16)),
		ipv6(0, c6, s6, cat(ext(43, 0), ext(44, 1), frag6(51, 0, true), ah(17, 1), ports(1, 53, 4))),
	}
	for _, full := range pkts {
		want, err := ParsePacket(full)
		if err != nil {
			t.Fatalf("full packet: %v", err)
		}
		for n := 0; n < len(full); n++ {
			got, err := ParsePacket(full[:n])
			if err == nil && got != want {
				t.Errorf("prefix %d: %+v, want error or %+v", n, got, want)
			}
		}
	}
}

func TestParsePacketAllocs(t *testing.T) {
	pkts := [][]byte{
		ipv4(6, c4, s4, 0, nil, ports(40000, 80, 16)),
		ipv6(0, c6, s6, cat(ext(44, 0), frag6(17, 0, true), ports(1, 53, 4))),
		ipv6(6, c6, s6, []byte{1}), // error path
	}
	var sink Packet
	allocs := testing.AllocsPerRun(1000, func() {
		for _, b := range pkts {
			p, _ := ParsePacket(b)
			sink = p
		}
	})
	if allocs != 0 {
		t.Fatalf("ParsePacket allocates %v times per run, want 0", allocs)
	}
	_ = sink
}

func TestParseKernelQueueStats(t *testing.T) {
	in := "    0  12345     2 2   128     0     0       42  1\n" +
		"65535 4294967295 0 2 65535 7 9 4294967295 1\n"
	got, err := ParseKernelQueueStats(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []QueueStats{
		{QueueNum: 0, PeerPortID: 12345, QueueTotal: 2, CopyMode: 2, CopyRange: 128, IDSequence: 42},
		{QueueNum: 65535, PeerPortID: 4294967295, CopyMode: 2, CopyRange: 65535, QueueDropped: 7, UserDropped: 9, IDSequence: 4294967295},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if got, err := ParseKernelQueueStats(strings.NewReader("")); err != nil || got == nil || len(got) != 0 {
		t.Errorf("empty file: %v, %v; want empty non-nil slice", got, err)
	}
	if _, err := ParseKernelQueueStats(strings.NewReader("1 2 3\n")); err == nil {
		t.Error("short line: want error")
	}
	if _, err := ParseKernelQueueStats(strings.NewReader("70000 1 1 2 128 0 0 1 1\n")); err == nil {
		t.Error("queue number > 65535: want error")
	}
}

func TestRuntimeConfig(t *testing.T) {
	c := RuntimeConfig{AllowMark: 0x10000}.Defaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if c.Queues != 1 || c.CopyRange != DefaultCopyRange || c.MaxQueueLen != DefaultMaxQueueLen || c.ReadBuffer != DefaultMaxQueueLen*ReadBufferPerPacket || c.Logger.GetSink() == nil {
		t.Errorf("Defaults() = %+v", c)
	}
	bad := []RuntimeConfig{
		{}, // no mark
		{AllowMark: 1, QueueNum: 65535, Queues: 2}, // range overflow
		{AllowMark: 1, CopyRange: 20},
	}
	for i, b := range bad {
		if err := b.Defaults().Validate(); err == nil {
			t.Errorf("config %d: want error", i)
		}
	}
	if _, err := NewRuntime(RuntimeConfig{AllowMark: 1}, nil); err == nil {
		t.Error("nil decider: want error")
	}
}

func BenchmarkParsePacket(b *testing.B) {
	v4 := ipv4(6, c4, s4, 0x4000, nil, ports(40000, 80, 16))
	v6 := ipv6(0, c6, s6, cat(ext(6, 0), ports(40000, 443, 16)))
	b.Run("ipv4-tcp", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := ParsePacket(v4); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ipv6-hopbyhop-tcp", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := ParsePacket(v6); err != nil {
				b.Fatal(err)
			}
		}
	})
}
