package tablewatch

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nftaFlowtableName is NFTA_FLOWTABLE_NAME, missing from x/sys/unix.
const nftaFlowtableName = 2

// maxChanges bounds the changes a Transaction keeps by name (what a log line
// shows); Counts counts them all. A flush of a big table notifies every
// rule.
const maxChanges = 16

// Change is one object of the watched table that a transaction created or
// deleted.
type Change struct {
	// Kind is table, chain, rule, set, element, object or flowtable.
	Kind string
	// Deleted is true for a deletion, false for a creation or update.
	Deleted bool
	// Name is the chain's, set's, object's or flowtable's name; a rule's
	// chain; an element's set; empty for the table.
	Name string
}

func (c Change) String() string {
	op := "add"
	if c.Deleted {
		op = "delete"
	}
	if c.Name == "" {
		return op + " " + c.Kind
	}
	return op + " " + c.Kind + " " + c.Name
}

// Transaction is what one committed nf_tables transaction changed in the
// watched table, and who committed it: the kernel ends each transaction's
// notifications with an NFT_MSG_NEWGEN message carrying the new generation
// and the committing process.
type Transaction struct {
	// Gen is the ruleset generation the transaction made.
	Gen uint32
	// PID and Proc are the committing task's id (a thread's, in the
	// kernel's initial pid namespace) and command name.
	PID  uint32
	Proc string
	// PortID is the netlink port id of the socket that sent the batch.
	PortID uint32
	// Changes are the first changes of the watched table (at most
	// maxChanges); Counts counts all of them by kind.
	Changes []Change
	Counts  map[string]int
}

// Touched reports whether the transaction changed the watched table.
func (t *Transaction) Touched() bool { return len(t.Counts) > 0 }

// Summary is a short text of the changes, for logs and Events.
func (t *Transaction) Summary() string {
	parts := make([]string, 0, len(t.Changes)+1)
	n := 0
	for _, c := range t.Changes {
		parts = append(parts, c.String())
	}
	for _, k := range t.Counts {
		n += k
	}
	if n > len(t.Changes) {
		parts = append(parts, fmt.Sprintf("and %d more", n-len(t.Changes)))
	}
	return strings.Join(parts, ", ")
}

// Decoder groups the notifications of one namespace into transactions and
// keeps the changes of one table. Not safe for concurrent use.
type Decoder struct {
	// Table is the inet table watched.
	Table string
	cur   Transaction
}

// Reset drops the transaction being read (its notifications were lost).
func (d *Decoder) Reset() { d.cur = Transaction{} }

// kinds maps an nf_tables message type to the kind it changes and whether
// it deletes; the DESTROY messages are notified as DEL ones.
var kinds = map[uint8]struct {
	kind    string
	deleted bool
	nameAt  uint16 // the attribute holding the object's (or its parent's) name
}{
	unix.NFT_MSG_NEWTABLE:     {"table", false, 0},
	unix.NFT_MSG_DELTABLE:     {"table", true, 0},
	unix.NFT_MSG_NEWCHAIN:     {"chain", false, unix.NFTA_CHAIN_NAME},
	unix.NFT_MSG_DELCHAIN:     {"chain", true, unix.NFTA_CHAIN_NAME},
	unix.NFT_MSG_NEWRULE:      {"rule", false, unix.NFTA_RULE_CHAIN},
	unix.NFT_MSG_DELRULE:      {"rule", true, unix.NFTA_RULE_CHAIN},
	unix.NFT_MSG_NEWSET:       {"set", false, unix.NFTA_SET_NAME},
	unix.NFT_MSG_DELSET:       {"set", true, unix.NFTA_SET_NAME},
	unix.NFT_MSG_NEWSETELEM:   {"element", false, unix.NFTA_SET_ELEM_LIST_SET},
	unix.NFT_MSG_DELSETELEM:   {"element", true, unix.NFTA_SET_ELEM_LIST_SET},
	unix.NFT_MSG_NEWOBJ:       {"object", false, unix.NFTA_OBJ_NAME},
	unix.NFT_MSG_DELOBJ:       {"object", true, unix.NFTA_OBJ_NAME},
	unix.NFT_MSG_NEWFLOWTABLE: {"flowtable", false, nftaFlowtableName},
	unix.NFT_MSG_DELFLOWTABLE: {"flowtable", true, nftaFlowtableName},
}

// Decode reads one notification; it returns the transaction when m ends
// one (NFT_MSG_NEWGEN). Messages of other subsystems, families or tables
// are skipped; malformed ones too (a notification never widens anything:
// at worst one is missed, and the periodic full sync remains).
func (d *Decoder) Decode(m netlink.Message) (Transaction, bool) {
	if uint16(m.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES || len(m.Data) < 4 {
		return Transaction{}, false
	}
	msg := uint8(m.Header.Type)
	family := m.Data[0]
	attrs := m.Data[4:]
	if msg == unix.NFT_MSG_NEWGEN {
		t := d.cur
		d.cur = Transaction{}
		t.PortID = m.Header.PID
		readGen(attrs, &t)
		return t, true
	}
	k, ok := kinds[msg]
	if !ok {
		return Transaction{}, false
	}
	// NFTA_TABLE_NAME and every object's NFTA_*_TABLE are attribute 1.
	table, name := tableAndName(attrs, k.nameAt)
	if family != unix.NFPROTO_INET || table != d.Table {
		return Transaction{}, false
	}
	if d.cur.Counts == nil {
		d.cur.Counts = map[string]int{}
	}
	d.cur.Counts[k.kind]++
	if len(d.cur.Changes) < maxChanges {
		d.cur.Changes = append(d.cur.Changes, Change{Kind: k.kind, Deleted: k.deleted, Name: name})
	}
	return Transaction{}, false
}

// tableAndName returns attribute 1 (the table) and attribute nameAt as
// strings; empty when absent or malformed.
func tableAndName(b []byte, nameAt uint16) (table, name string) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "", ""
	}
	for ad.Next() {
		switch ad.Type() {
		case 1:
			table = ad.String()
		case nameAt:
			if nameAt != 0 {
				name = ad.String()
			}
		}
	}
	if ad.Err() != nil {
		return "", ""
	}
	return table, name
}

func readGen(b []byte, t *Transaction) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_GEN_ID:
			t.Gen = ad.Uint32()
		case unix.NFTA_GEN_PROC_PID:
			t.PID = ad.Uint32()
		case unix.NFTA_GEN_PROC_NAME:
			t.Proc = ad.String()
		}
	}
	_ = ad.Err()
}
