package nftnl

import (
	"context"
	"encoding/binary"
	"errors"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A full sync needs the names of the table's chains, sets and maps (what to
// flush and delete). knftables' ListAll runs `nft --json --terse list
// table`, and nft 1.0.6 fetches every rule and every set element for it
// before printing only the names, on every restart of the agent and every
// periodic full sync. Dumping the chains and sets over netlink returns
// their declarations alone (no rules, no elements).

// NFT_SET_* flags of a set's declaration (linux/netfilter/nf_tables.h).
const (
	nftSetAnonymous = 0x1
	nftSetMap       = 0x8
	nftSetObject    = 0x40
)

// BaseChains is the key of ListTable's answer that lists the chains
// hooked to the network stack (among those of "chain"); no object type
// has that name.
const BaseChains = "base chain"

// ListTable returns the names of the table's chains ("chain"), sets
// ("set") and maps ("map", verdict and data maps and object maps alike), as
// knftables' ListAll does, and of its base chains (BaseChains); anonymous
// sets (the { a, b } of rules) are not listed, nft's listing does not show
// them either. A table that does not exist has none. The second map holds the
// declarations of the sets and maps it names, by name.
func (w *Conn) ListTable(ctx context.Context) (map[string][]string, map[string]*SetDecl, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn == nil {
		if err := w.dial(); err != nil {
			return nil, nil, err
		}
	}
	out := map[string][]string{}
	decls := map[string]*SetDecl{}
	err := w.dump(ctx, unix.NFT_MSG_GETCHAIN, unix.NFTA_CHAIN_TABLE, func(ad *netlink.AttributeDecoder) {
		var table, name string
		hooked := false
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_CHAIN_TABLE:
				table = ad.String()
			case unix.NFTA_CHAIN_NAME:
				name = ad.String()
			case unix.NFTA_CHAIN_HOOK:
				hooked = true
			}
		}
		if table == w.table && name != "" {
			out["chain"] = append(out["chain"], name)
			if hooked {
				out[BaseChains] = append(out[BaseChains], name)
			}
		}
	})
	if err == nil {
		err = w.dump(ctx, unix.NFT_MSG_GETSET, unix.NFTA_SET_TABLE, func(ad *netlink.AttributeDecoder) {
			table, k := parseKernelSet(ad)
			switch {
			case table != w.table || k.name == "" || k.flags&nftSetAnonymous != 0:
				return
			case k.flags&(nftSetMap|nftSetObject) != 0:
				out["map"] = append(out["map"], k.name)
			default:
				out["set"] = append(out["set"], k.name)
			}
			decls[k.name] = &k
		})
	}
	if errors.Is(err, unix.ENOENT) {
		// The set dump names the table, and the kernel refuses to dump
		// the sets of a table that does not exist.
		return map[string][]string{}, map[string]*SetDecl{}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return out, decls, nil
}

// dump runs one nf_tables dump request of the inet family, restricted to
// the table where the kernel supports it (replies are filtered by the
// caller anyway), and hands each reply's attributes to fn.
func (w *Conn) dump(ctx context.Context, msgType uint16, tableAttr uint16, fn func(*netlink.AttributeDecoder)) error {
	ae := netlink.NewAttributeEncoder()
	ae.String(tableAttr, w.table)
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	return w.dumpMessages(ctx, msgType, attrs, func(b []byte) error {
		ad, err := netlink.NewAttributeDecoder(b)
		if err != nil {
			return err
		}
		ad.ByteOrder = binary.BigEndian
		fn(ad)
		return ad.Err()
	})
}
