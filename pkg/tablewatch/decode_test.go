package tablewatch

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// notification builds one nf_tables notification of family with the string
// attributes attrs (type, value pairs) and the sender's port id.
func notification(t *testing.T, msg uint8, family uint8, portID uint32, attrs ...any) netlink.Message {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	for i := 0; i+1 < len(attrs); i += 2 {
		switch v := attrs[i+1].(type) {
		case string:
			ae.String(attrs[i].(uint16), v)
		case uint32:
			ae.Uint32(attrs[i].(uint16), v)
		}
	}
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | uint16(msg)), PID: portID},
		Data:   append([]byte{family, unix.NFNETLINK_V0, 0, 0}, b...),
	}
}

func newGen(t *testing.T, gen, pid, portID uint32, proc string) netlink.Message {
	return notification(t, unix.NFT_MSG_NEWGEN, unix.NFPROTO_UNSPEC, portID,
		uint16(unix.NFTA_GEN_ID), gen, uint16(unix.NFTA_GEN_PROC_PID), pid, uint16(unix.NFTA_GEN_PROC_NAME), proc)
}

// decodeAll feeds msgs and returns the transactions they end.
func decodeAll(d *Decoder, msgs []netlink.Message) []Transaction {
	var out []Transaction
	for _, m := range msgs {
		if tx, ok := d.Decode(m); ok {
			out = append(out, tx)
		}
	}
	return out
}

// TestDecodeTransactions: the changes of the watched inet table are grouped
// up to the NEWGEN that ends their transaction, which names the committing
// process; other tables, families and subsystems are left out.
func TestDecodeTransactions(t *testing.T) {
	d := &Decoder{Table: "nftpolicy"}
	const inet, ip = unix.NFPROTO_INET, unix.NFPROTO_IPV4
	msgs := []netlink.Message{
		// nft flush ruleset by pid 4242: rules, a chain, a set, the table;
		// and another table's deletion, and ip nftpolicy's.
		notification(t, unix.NFT_MSG_DELRULE, inet, 4242, uint16(unix.NFTA_RULE_TABLE), "nftpolicy", uint16(unix.NFTA_RULE_CHAIN), "input"),
		notification(t, unix.NFT_MSG_DELCHAIN, inet, 4242, uint16(unix.NFTA_CHAIN_TABLE), "nftpolicy", uint16(unix.NFTA_CHAIN_NAME), "input"),
		notification(t, unix.NFT_MSG_DELSET, inet, 4242, uint16(unix.NFTA_SET_TABLE), "nftpolicy", uint16(unix.NFTA_SET_NAME), "pods-v4"),
		notification(t, unix.NFT_MSG_DELTABLE, inet, 4242, uint16(unix.NFTA_TABLE_NAME), "nftpolicy"),
		notification(t, unix.NFT_MSG_DELTABLE, inet, 4242, uint16(unix.NFTA_TABLE_NAME), "kube-proxy"),
		notification(t, unix.NFT_MSG_DELTABLE, ip, 4242, uint16(unix.NFTA_TABLE_NAME), "nftpolicy"),
		{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_QUEUE<<8 | 1)}, Data: []byte{1, 0, 0, 0}},
		newGen(t, 10, 4242, 4242, "nft"),
		// Another table only: a transaction that does not touch ours.
		notification(t, unix.NFT_MSG_NEWCHAIN, inet, 99, uint16(unix.NFTA_CHAIN_TABLE), "filter", uint16(unix.NFTA_CHAIN_NAME), "x"),
		newGen(t, 11, 99, 99, "nft"),
		// A chain created and a set flushed in one transaction.
		notification(t, unix.NFT_MSG_NEWCHAIN, inet, 5, uint16(unix.NFTA_CHAIN_TABLE), "nftpolicy", uint16(unix.NFTA_CHAIN_NAME), "c"),
		notification(t, unix.NFT_MSG_DELSETELEM, inet, 5, uint16(unix.NFTA_SET_ELEM_LIST_TABLE), "nftpolicy", uint16(unix.NFTA_SET_ELEM_LIST_SET), "s"),
		newGen(t, 12, 777, 5, "nftpolicy"),
		// One element deleted; a truncated message is skipped.
		notification(t, unix.NFT_MSG_DELSETELEM, inet, 31, uint16(unix.NFTA_SET_ELEM_LIST_TABLE), "nftpolicy", uint16(unix.NFTA_SET_ELEM_LIST_SET), "vmap-x"),
		{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELRULE)}, Data: []byte{1, 0}},
		{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELRULE)}, Data: []byte{1, 0, 0, 0, 200, 0, 1}},
		newGen(t, 13, 31, 31, "nft"),
	}
	txs := decodeAll(d, msgs)
	if len(txs) != 4 {
		t.Fatalf("got %d transactions, want 4: %+v", len(txs), txs)
	}
	flush := txs[0]
	if flush.Gen != 10 || flush.PID != 4242 || flush.PortID != 4242 || flush.Proc != "nft" || !flush.Touched() {
		t.Errorf("flush: %+v", flush)
	}
	if got, want := flush.Summary(), "delete rule input, delete chain input, delete set pods-v4, delete table"; got != want {
		t.Errorf("flush summary %q, want %q", got, want)
	}
	if flush.Counts["table"] != 1 || flush.Counts["rule"] != 1 || len(flush.Counts) != 4 {
		t.Errorf("flush counts %v", flush.Counts)
	}
	if txs[1].Touched() || txs[1].Gen != 11 {
		t.Errorf("another table's transaction: %+v", txs[1])
	}
	if got := txs[2].Summary(); got != "add chain c, delete element s" || txs[2].PID != 777 || txs[2].Proc != "nftpolicy" {
		t.Errorf("second transaction: %q %+v", got, txs[2])
	}
	if got := txs[3].Summary(); got != "delete element vmap-x" {
		t.Errorf("element: %q", got)
	}
}

// TestDecodeBoundsChanges: a transaction of many changes keeps the first
// ones by name and counts all.
func TestDecodeBoundsChanges(t *testing.T) {
	d := &Decoder{Table: "nftpolicy"}
	var msgs []netlink.Message
	for range 1000 {
		msgs = append(msgs, notification(t, unix.NFT_MSG_DELRULE, unix.NFPROTO_INET, 1, uint16(unix.NFTA_RULE_TABLE), "nftpolicy", uint16(unix.NFTA_RULE_CHAIN), "c"))
	}
	msgs = append(msgs, newGen(t, 1, 1, 1, "nft"))
	txs := decodeAll(d, msgs)
	if len(txs) != 1 || len(txs[0].Changes) != maxChanges || txs[0].Counts["rule"] != 1000 {
		t.Fatalf("got %+v", txs)
	}
	if !strings.HasSuffix(txs[0].Summary(), "and 984 more") {
		t.Errorf("summary %q", txs[0].Summary())
	}
}

// TestOwner: the agent's own transactions (its pid or one of its threads,
// its nft children by pid or port id, another agent or this one in a pid
// namespace by name, another agent's nft child) are own; any other
// process's are outside.
func TestOwner(t *testing.T) {
	procs := map[uint32]struct {
		name string
		ppid uint32
	}{
		500: {"nft", 400}, 400: {AgentProcName, 1}, // another agent's nft
		600: {"nft", 300}, 300: {"bash", 1}, // an administrator's nft
	}
	o := &Owner{self: 100, proc: func(pid uint32) (string, uint32, bool) {
		p, ok := procs[pid]
		return p.name, p.ppid, ok
	}, thread: func(tid uint32) bool { return tid == 101 }}
	o.AddChild(200)
	for i := range recentChildren - 1 {
		o.AddChild(1000 + i) // 200 is still among the recent ones
	}
	cases := []struct {
		name string
		tx   Transaction
		own  bool
	}{
		{"self", Transaction{PID: 100, Proc: "x"}, true},
		{"a thread of self", Transaction{PID: 101, Proc: "x"}, true},
		{"child by pid", Transaction{PID: 200, PortID: 9, Proc: "nft"}, true},
		{"child by port id (pid namespace)", Transaction{PID: 88200, PortID: 200, Proc: "nft"}, true},
		{"another process", Transaction{PID: 70, Proc: "x"}, false},
		{"an agent by name (another, or this one in a pid namespace)", Transaction{PID: 71, Proc: AgentProcName}, true},
		{"another agent's nft", Transaction{PID: 500, PortID: 500, Proc: "nft"}, true},
		{"an administrator's nft", Transaction{PID: 600, PortID: 600, Proc: "nft"}, false},
		{"an exited nft", Transaction{PID: 601, PortID: 601, Proc: "nft"}, false},
	}
	for _, c := range cases {
		if got := o.Own(&c.tx); got != c.own {
			t.Errorf("%s: own %v, want %v", c.name, got, c.own)
		}
	}
	o.AddChild(2000) // pushes 200 out
	if o.Own(&Transaction{PID: 200, PortID: 200, Proc: "nft"}) {
		t.Error("a child older than the last recentChildren is still own")
	}
}
