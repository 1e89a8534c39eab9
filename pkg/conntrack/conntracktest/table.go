// Package conntracktest has a conntrack table for tests of what streams
// and deletes entries (the revoker, preview): fixed entries, and the
// deletions recorded. It is not internal so that cmd/ tests can use it;
// the product must not.
package conntracktest

import (
	"net/netip"

	ct "github.com/ti-mo/conntrack"
)

// Table holds Flows, streamed in order whatever the family asked, and
// records what is deleted (it stays in Flows).
type Table struct {
	Flows   []ct.Flow
	Deleted []ct.Flow
}

// Stream calls fn with a copy of each entry.
func (t *Table) Stream(_ uint8, fn func(*ct.Flow) error) error {
	for i := range t.Flows {
		f := t.Flows[i]
		if err := fn(&f); err != nil {
			return err
		}
	}
	return nil
}

// Delete records f.
func (t *Table) Delete(f ct.Flow) error { t.Deleted = append(t.Deleted, f); return nil }

// TCP is the entry of a TCP connection from src:sport to dst:dport,
// without NAT.
func TCP(src, dst string, sport, dport uint16) ct.Flow {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	return ct.Flow{
		TupleOrig:  ct.Tuple{IP: ct.IPTuple{SourceAddress: s, DestinationAddress: d}, Proto: ct.ProtoTuple{Protocol: 6, SourcePort: sport, DestinationPort: dport}},
		TupleReply: ct.Tuple{IP: ct.IPTuple{SourceAddress: d, DestinationAddress: s}, Proto: ct.ProtoTuple{Protocol: 6, SourcePort: dport, DestinationPort: sport}},
	}
}

// Echo is the entry of an ICMP echo (ICMPv6 when the addresses are IPv6)
// from src to dst with the echo identifier id: the request's type in the
// original tuple, the reply's in the reply tuple, as the kernel keeps it.
func Echo(src, dst string, id uint16) ct.Flow {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	req, rep := ct.ProtoTuple{Protocol: 1, ICMPv4: true, ICMPID: id, ICMPType: 8}, ct.ProtoTuple{Protocol: 1, ICMPv4: true, ICMPID: id, ICMPType: 0}
	if s.Is6() {
		req = ct.ProtoTuple{Protocol: 58, ICMPv6: true, ICMPID: id, ICMPType: 128}
		rep = ct.ProtoTuple{Protocol: 58, ICMPv6: true, ICMPID: id, ICMPType: 129}
	}
	return ct.Flow{
		TupleOrig:  ct.Tuple{IP: ct.IPTuple{SourceAddress: s, DestinationAddress: d}, Proto: req},
		TupleReply: ct.Tuple{IP: ct.IPTuple{SourceAddress: d, DestinationAddress: s}, Proto: rep},
	}
}

// Generic is the entry of a protocol conntrack tracks without ports (or
// with keys in the ports' place, as GRE), from src to dst.
func Generic(src, dst string, proto uint8) ct.Flow {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	return ct.Flow{
		TupleOrig:  ct.Tuple{IP: ct.IPTuple{SourceAddress: s, DestinationAddress: d}, Proto: ct.ProtoTuple{Protocol: proto}},
		TupleReply: ct.Tuple{IP: ct.IPTuple{SourceAddress: d, DestinationAddress: s}, Proto: ct.ProtoTuple{Protocol: proto}},
	}
}
