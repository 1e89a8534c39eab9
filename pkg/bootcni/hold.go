package bootcni

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Names of the hold's objects in table inet nftpolicy. The agent renders
// none of them, so its first full sync deletes them with the rest of what
// it does not want, in the transaction that installs its ruleset.
const (
	SetHoldV4    = "boot-hold-v4"
	SetHoldV6    = "boot-hold-v6"
	ChainHoldFwd = "boot-hold-forward"
	ChainHoldIn  = "boot-hold-input"
)

// holdPriority is the agent's base chains' priority (compile's "filter -
// 5"): after conntrack and Service DNAT, so a held pod reached through a
// Service is held too.
var holdPriority = nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 5)

var table = &nftables.Table{Family: nftables.TableFamilyINet, Name: compile.TableName}

// HoldState says what Hold found in the kernel.
type HoldState int

const (
	// AgentEnforces: the table holds the agent's ruleset (its forward
	// chain); nothing was written.
	AgentEnforces HoldState = iota
	// HoldCreated: there was no hold; the table, the hold's sets and
	// chains were created with the addresses in them.
	HoldCreated
	// HoldExtended: the hold was there; the addresses were added to it.
	HoldExtended
)

func (s HoldState) String() string {
	switch s {
	case AgentEnforces:
		return "agent enforces"
	case HoldCreated:
		return "hold created"
	case HoldExtended:
		return "hold extended"
	}
	return fmt.Sprintf("HoldState(%d)", int(s))
}

// Hold makes the kernel of conn's network namespace drop the traffic of
// addrs until the agent's ruleset is in table inet nftpolicy: if the
// agent's forward chain is there, it does nothing; otherwise it adds addrs
// to the hold, creating the hold first if needed, in one transaction.
//
// Between its listing and its commit the agent may install its ruleset;
// the hold's objects then sit in the agent's table as an outside change,
// which the agent's table watch repairs (deleting them). Either way the
// pod is never unenforced: it is held a little longer.
func Hold(conn *nftables.Conn, addrs []netip.Addr) (HoldState, error) {
	chains, err := tableChains(conn)
	if err != nil {
		return 0, err
	}
	if chains[compile.ChainForward] {
		return AgentEnforces, nil
	}
	v4, v6 := holdSets()
	state := HoldExtended
	if chains[ChainHoldFwd] && chains[ChainHoldIn] {
		// The sets exist: name them without declaring them again.
		if err := addElements(conn, v4, v6, addrs); err != nil {
			return 0, err
		}
	} else {
		state = HoldCreated
		conn.AddTable(table)
		if err := declareHold(conn, v4, v6, addrs); err != nil {
			return 0, err
		}
	}
	if err := conn.Flush(); err != nil {
		return 0, fmt.Errorf("holding %v in table inet %s: %w", addrs, compile.TableName, err)
	}
	return state, nil
}

// Release removes addrs from the hold (a pod deleted before the agent's
// first sync). Without a hold, or for addresses it does not hold, it does
// nothing: a CNI DEL must succeed when there is nothing left to undo.
func Release(conn *nftables.Conn, addrs []netip.Addr) error {
	chains, err := tableChains(conn)
	if err != nil || !chains[ChainHoldFwd] {
		return err
	}
	v4, v6 := holdSets()
	for _, s := range []*nftables.Set{v4, v6} {
		present, err := conn.GetSetElements(s)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading set %s: %w", s.Name, err)
		}
		var del []nftables.SetElement
		for _, a := range addrs {
			for _, e := range present {
				if ip, ok := netip.AddrFromSlice(e.Key); ok && ip == a.Unmap() {
					del = append(del, nftables.SetElement{Key: e.Key})
				}
			}
		}
		if len(del) == 0 {
			continue
		}
		if err := conn.SetDeleteElements(s, del); err != nil {
			return err
		}
	}
	if err := conn.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("releasing %v from the hold: %w", addrs, err)
	}
	return nil
}

// Held returns the addresses the hold holds (none without a hold).
func Held(conn *nftables.Conn) ([]netip.Addr, error) {
	chains, err := tableChains(conn)
	if err != nil || !chains[ChainHoldFwd] {
		return nil, err
	}
	var out []netip.Addr
	v4, v6 := holdSets()
	for _, s := range []*nftables.Set{v4, v6} {
		els, err := conn.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("reading set %s: %w", s.Name, err)
		}
		for _, e := range els {
			if ip, ok := netip.AddrFromSlice(e.Key); ok {
				out = append(out, ip)
			}
		}
	}
	return out, nil
}

// tableChains returns the names of the chains of table inet nftpolicy
// (none when there is no table).
func tableChains(conn *nftables.Conn) (map[string]bool, error) {
	all, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("listing the inet chains: %w", err)
	}
	out := map[string]bool{}
	for _, c := range all {
		if c.Table != nil && c.Table.Name == compile.TableName {
			out[c.Name] = true
		}
	}
	return out, nil
}

func holdSets() (v4, v6 *nftables.Set) {
	return &nftables.Set{Table: table, Name: SetHoldV4, KeyType: nftables.TypeIPAddr},
		&nftables.Set{Table: table, Name: SetHoldV6, KeyType: nftables.TypeIP6Addr}
}

// split returns addrs' elements per family (IPv4-mapped IPv6 addresses as
// IPv4: the kernel sees them as such on the wire).
func split(addrs []netip.Addr) (v4, v6 []nftables.SetElement) {
	for _, a := range addrs {
		a = a.Unmap()
		if a.Is4() {
			b := a.As4()
			v4 = append(v4, nftables.SetElement{Key: b[:]})
		} else if a.Is6() {
			b := a.As16()
			v6 = append(v6, nftables.SetElement{Key: b[:]})
		}
	}
	return v4, v6
}

func addElements(conn *nftables.Conn, v4, v6 *nftables.Set, addrs []netip.Addr) error {
	e4, e6 := split(addrs)
	if len(e4) > 0 {
		if err := conn.SetAddElements(v4, e4); err != nil {
			return err
		}
	}
	if len(e6) > 0 {
		if err := conn.SetAddElements(v6, e6); err != nil {
			return err
		}
	}
	return nil
}

// declareHold adds to conn's batch the hold's sets (with addrs) and its
// two base chains: forward drops every packet from or to a held address;
// input drops new connections from one (the replies of a held pod to the
// node's own connections, the kubelet's probes, still pass).
func declareHold(conn *nftables.Conn, v4, v6 *nftables.Set, addrs []netip.Addr) error {
	e4, e6 := split(addrs)
	if err := conn.AddSet(v4, e4); err != nil {
		return err
	}
	if err := conn.AddSet(v6, e6); err != nil {
		return err
	}
	accept := nftables.ChainPolicyAccept
	fwd := conn.AddChain(&nftables.Chain{Table: table, Name: ChainHoldFwd, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: holdPriority, Policy: &accept})
	in := conn.AddChain(&nftables.Chain{Table: table, Name: ChainHoldIn, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: holdPriority, Policy: &accept})
	for _, s := range []*nftables.Set{v4, v6} {
		conn.AddRule(&nftables.Rule{Table: table, Chain: fwd, Exprs: dropAddr(s, true, false)})
		conn.AddRule(&nftables.Rule{Table: table, Chain: fwd, Exprs: dropAddr(s, false, false)})
		conn.AddRule(&nftables.Rule{Table: table, Chain: in, Exprs: dropAddr(s, true, true)})
	}
	return nil
}

// dropAddr is `[ct state new] ip|ip6 saddr|daddr @set counter drop`.
func dropAddr(s *nftables.Set, source, onlyNew bool) []expr.Any {
	proto, off, n := byte(unix.NFPROTO_IPV4), uint32(12), uint32(4)
	if s.KeyType == nftables.TypeIP6Addr {
		proto, off, n = unix.NFPROTO_IPV6, 8, 16
	}
	if !source {
		off += n
	}
	var out []expr.Any
	if onlyNew {
		out = append(out,
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}})
	}
	return append(out,
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop})
}
