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
