package nftnl

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/internal/scratchns"
)

// scratchNetns creates the test's network namespace (scratchns.New).
func scratchNetns(t testing.TB) (string, *os.File) {
	t.Helper()
	return scratchns.New(t, "sets")
}

func nftIn(t testing.TB, ns, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// runTx runs a knftables transaction's text with nft in the namespace.
func runTx(t *testing.T, ns string, tx *knftables.Transaction) {
	t.Helper()
	nftIn(t, ns, tx.String(), "-f", "-")
}

// listSets returns the sets and maps of a table as nft -j lists them,
// without handles and the table name, elements sorted (a hash set lists
// in the order of its random hash seed).
func listSets(t *testing.T, ns, table string) map[string]map[string]any {
	t.Helper()
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(nftIn(t, ns, "", "-j", "list", "table", "inet", table)), &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, o := range doc.Nftables {
		for kind, v := range o {
			if kind != "set" && kind != "map" {
				continue
			}
			delete(v, "handle")
			delete(v, "table")
			if elems, ok := v["elem"].([]any); ok {
				s := make([]string, len(elems))
				for i, e := range elems {
					b, _ := json.Marshal(e)
					s[i] = string(b)
				}
				sort.Strings(s)
				v["elem"] = s
			}
			out[kind+" "+v["name"].(string)] = v
		}
	}
	return out
}

// propSet is a set of the property test and the pool its contents are
// drawn from (for interval sets, non-overlapping).
type propSet struct {
	set  *compile.Set
	pool []knftables.Element
}

func propSets(r *rand.Rand) []propSet {
	interval := []knftables.SetFlag{knftables.IntervalFlag}
	addr := func(v4 bool) string {
		if v4 {
			return netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))}).String()
		}
		var b [16]byte
		b[0], b[1], b[15], b[14] = 0xfd, 0, byte(r.IntN(256)), byte(r.IntN(4))
		return netip.AddrFrom16(b).String()
	}
	proto := func() string { return []string{"tcp", "udp", "sctp"}[r.IntN(3)] }
	comment := func() *string {
		if r.IntN(3) == 0 {
			return nil
		}
		c := fmt.Sprintf("ns-%d/pod-%d", r.IntN(50), r.IntN(1000))
		return &c
	}
	var out []propSet
	plain := func(name, typ string, key func() []string) {
		p := propSet{set: &compile.Set{Key: keyOf(typ), Set: &knftables.Set{Name: name, Type: typ}}}
		seen := map[string]bool{}
		for len(p.pool) < 40 {
			k := key()
			if !seen[strings.Join(k, ".")] {
				seen[strings.Join(k, ".")] = true
				p.pool = append(p.pool, knftables.Element{Key: k, Comment: comment()})
			}
		}
		out = append(out, p)
	}
	plain("a4", "ipv4_addr", func() []string { return []string{addr(true)} })
	plain("a6", "ipv6_addr", func() []string { return []string{addr(false)} })
	plain("self4", "ipv4_addr . ipv4_addr", func() []string { a := addr(true); return []string{a, a} })
	plain("named4", "ipv4_addr . inet_proto . inet_service", func() []string {
		return []string{addr(true), proto(), fmt.Sprint(r.IntN(65536))}
	})
	plain("named6", "ipv6_addr . inet_proto . inet_service", func() []string {
		return []string{addr(false), proto(), fmt.Sprint(r.IntN(65536))}
	})
	// Interval sets: one candidate per slot of the value space, so that
	// candidates never overlap; a whole slot is sometimes taken, making
	// neighbours adjacent; the first and last slots reach the ends.
	ranges := func(name, typ string, bits int, format func(lo, hi uint64) []string) {
		p := propSet{set: &compile.Set{Key: keyOf(typ), Set: &knftables.Set{Name: name, Type: typ, Flags: interval}}}
		const slots = 32
		slot := uint64(1) << (bits - 5)
		for i := uint64(0); i < slots; i++ {
			base := i * slot
			var lo, hi uint64
			switch r.IntN(4) {
			case 0: // the whole slot
				lo, hi = base, base+slot-1
			case 1: // one value
				lo = base + r.Uint64N(slot)
				hi = lo
			case 2: // an aligned block
				size := uint64(1) << r.IntN(bits-5)
				lo = base + r.Uint64N(slot/size)*size
				hi = lo + size - 1
			default: // any range
				lo = base + r.Uint64N(slot)
				hi = lo + r.Uint64N(base+slot-lo)
			}
			p.pool = append(p.pool, knftables.Element{Key: format(lo, hi), Comment: comment()})
		}
		out = append(out, p)
	}
	v4 := func(x uint64) netip.Addr {
		return netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, uint32(x))))
	}
	addrText := func(a, b netip.Addr) string {
		if a == b {
			return a.String()
		}
		for bits := 0; bits <= a.BitLen(); bits++ {
			if p := netip.PrefixFrom(a, bits); p.Masked().Addr() == a && lastOf(p) == b {
				return p.String()
			}
		}
		return a.String() + "-" + b.String()
	}
	ranges("cidr4", "ipv4_addr", 32, func(lo, hi uint64) []string { return []string{addrText(v4(lo), v4(hi))} })
	// IPv6 ranges span whole /64s: the values are the upper 64 bits.
	v6 := func(x uint64, fill byte) netip.Addr {
		var b [16]byte
		binary.BigEndian.PutUint64(b[:], x)
		for i := 8; i < 16; i++ {
			b[i] = fill
		}
		return netip.AddrFrom16(b)
	}
	ranges("cidr6", "ipv6_addr", 64, func(lo, hi uint64) []string { return []string{addrText(v6(lo, 0), v6(hi, 0xff))} })
	port := func(lo, hi uint64) string {
		if lo == hi {
			return fmt.Sprint(lo)
		}
		return fmt.Sprintf("%d-%d", lo, hi)
	}
	ranges("svc", "inet_service", 16, func(lo, hi uint64) []string { return []string{port(lo, hi)} })
	ranges("ports", "inet_proto . inet_service", 16, func(lo, hi uint64) []string { return []string{proto(), port(lo, hi)} })
	for _, name := range []string{"vmap4", "vmap6"} {
		typ := "ipv4_addr : verdict"
		if name == "vmap6" {
			typ = "ipv6_addr : verdict"
		}
		p := propSet{set: &compile.Set{Key: keyOf(typ), Map: &knftables.Map{Name: name, Type: typ}}}
		seen := map[string]bool{}
		for len(p.pool) < 40 {
			k := addr(name == "vmap4")
			if !seen[k] {
				seen[k] = true
				v := []string{"goto chain-a", "jump chain-b", "accept", "drop"}[r.IntN(4)]
				p.pool = append(p.pool, knftables.Element{Key: []string{k}, Value: []string{v}, Comment: comment()})
			}
		}
		out = append(out, p)
	}
	return out
}

func lastOf(p netip.Prefix) netip.Addr {
	a := p.Addr().AsSlice()
	for i := p.Bits(); i < len(a)*8; i++ {
		a[i/8] |= 0x80 >> (i % 8)
	}
	last, _ := netip.AddrFromSlice(a)
	return last
}

// TestNetlinkElementsMatchNFT adds and deletes random elements of every
// kind of set nftpolicy declares, with nft in one table and with the
// netlink writer in another of the same namespace, and compares what nft
// lists of both after every round.
func TestNetlinkElementsMatchNFT(t *testing.T) {
	ns, f := scratchNetns(t)
	for seed := uint64(1); seed <= 4; seed++ {
		r := rand.New(rand.NewPCG(seed, 13))
		sets := propSets(r)
		// Fresh tables a (nft) and b (netlink), the same declarations.
		a, b := fmt.Sprintf("a%d", seed), fmt.Sprintf("b%d", seed)
		w := NewConn(b, int(f.Fd()))
		defer w.Close()
		for _, table := range []string{a, b} {
			tx := knftables.NewFake(knftables.InetFamily, table).NewTransaction()
			tx.Add(&knftables.Table{})
			for _, c := range []string{"chain-a", "chain-b"} {
				tx.Add(&knftables.Chain{Name: c})
			}
			for _, p := range sets {
				if p.set.Map != nil {
					tx.Add(p.set.Map)
				} else {
					tx.Add(p.set.Set)
				}
			}
			runTx(t, ns, tx)
		}
		current := make([]map[int]bool, len(sets))
		for i := range current {
			current[i] = map[int]bool{}
		}
		for round := 0; round < 6; round++ {
			// nft 1.0.6 refuses, in one transaction, to add an interval
			// it deletes ("overlaps with an existing one"): its deletions
			// go first, on their own. The kernel takes both in one batch.
			tx := knftables.NewFake(knftables.InetFamily, a).NewTransaction()
			addTx := knftables.NewFake(knftables.InetFamily, a).NewTransaction()
			var changes []testChange
			for i, p := range sets {
				c := testChange{set: p.set}
				next := map[int]bool{}
				for j := range p.pool {
					if r.IntN(2) == 0 {
						next[j] = true
					}
				}
				remove := func(e knftables.Element) {
					tx.Delete(elementOf(t, p.set, e))
					c.del = append(c.del, e)
				}
				// Changed comments and verdicts: deleted and added again.
				for j := range p.pool {
					if !current[i][j] || !next[j] || r.IntN(5) != 0 {
						continue
					}
					e := p.pool[j]
					remove(e)
					if e.Comment == nil {
						e.Comment = ptrStr("changed")
					} else {
						e.Comment = nil
					}
					if e.Value != nil {
						e.Value = []string{"goto chain-b"}
					}
					p.pool[j] = e
					delete(current[i], j)
				}
				for j := range p.pool {
					switch {
					case current[i][j] && !next[j]:
						remove(p.pool[j])
					case next[j] && !current[i][j]:
						e := p.pool[j]
						addTx.Add(elementOf(t, p.set, e))
						c.add = append(c.add, e)
					}
				}
				current[i] = next
				changes = append(changes, c)
			}
			runTx(t, ns, tx)
			runTx(t, ns, addTx)
			if err := w.Write(context.Background(), testBatch(t, w, changes)); err != nil {
				t.Fatalf("seed %d round %d: netlink batch: %v", seed, round, err)
			}
			want, got := listSets(t, ns, a), listSets(t, ns, b)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("seed %d round %d: nft (-) and netlink (+) sets differ:\n%s", seed, round, diff)
			}
		}
	}
}

// elementOf is what nft is given for an element of the pool: the text of
// its typed element (mustTyped), the element the netlink writer encodes.
func elementOf(t testing.TB, s *compile.Set, e knftables.Element) *knftables.Element {
	te := mustTyped(t, s, &e)
	return s.Knft(&te)
}

// TestNetlinkBatchAllOrNothing: a batch with valid additions and one
// deletion of a missing element is refused as a whole, and the writer's
// next batch, on a new connection, works.
func TestNetlinkBatchAllOrNothing(t *testing.T) {
	ns, f := scratchNetns(t)
	nftIn(t, ns, "add table inet t\n"+
		"add set inet t peers { type ipv4_addr ; }\n"+
		"add set inet t cidrs { type ipv4_addr ; flags interval ; }\n"+
		"add element inet t peers { 10.0.0.1 comment \"x/a\" }\n", "-f", "-")
	before := listSets(t, ns, "t")
	w := NewConn("t", int(f.Fd()))
	defer w.Close()
	el := func(key string) []knftables.Element {
		return []knftables.Element{{Key: []string{key}, Comment: ptrStr("y/b")}}
	}
	peers, cidrs := set("ipv4_addr"), set("ipv4_addr", knftables.IntervalFlag)
	peers.Set.Name, cidrs.Set.Name = "peers", "cidrs"
	err := w.Write(context.Background(), testBatch(t, w, []testChange{
		{set: peers, add: el("10.0.0.2")},
		{set: cidrs, add: el("192.168.0.0/16")},
		{set: peers, del: el("10.9.9.9")}, // not in the set
	}))
	if err == nil {
		t.Fatal("deleting a missing element did not fail the batch")
	}
	if !strings.Contains(err.Error(), "no such file or directory") {
		t.Errorf("error %q does not say the element is missing", err)
	} else {
		t.Logf("refused as expected: %v", err)
	}
	if diff := cmp.Diff(before, listSets(t, ns, "t")); diff != "" {
		t.Fatalf("the refused batch changed the kernel (-before +after):\n%s", diff)
	}
	if err := w.Write(context.Background(), testBatch(t, w, []testChange{{set: peers, add: el("10.0.0.2")}})); err != nil {
		t.Fatalf("batch after a failure: %v", err)
	}
	// An element with a comment is listed as an object: look for the
	// addresses.
	got := fmt.Sprint(listSets(t, ns, "t")["set peers"]["elem"])
	if !strings.Contains(got, `"10.0.0.1"`) || !strings.Contains(got, `"10.0.0.2"`) {
		t.Errorf("peers after the second batch: %s", got)
	}
}

// BenchmarkNetlinkWriter is the writer alone (no diff): one element with a
// comment, alternately added and deleted; compare with
// BenchmarkOnePodBatch/google-nftables.
func BenchmarkNetlinkWriter(b *testing.B) {
	ns, f := scratchNetns(b)
	nftIn(b, ns, "add table inet t\nadd set inet t peers { type ipv4_addr ; }\n", "-f", "-")
	w := NewConn("t", int(f.Fd()))
	defer w.Close()
	peers := set("ipv4_addr")
	peers.Set.Name = "peers"
	e := []knftables.Element{{Key: []string{"10.2.0.1"}, Comment: ptrStr("ns/new-pod")}}
	add := []testChange{{set: peers, add: e}}
	del := []testChange{{set: peers, del: e}}
	i := 0
	for b.Loop() {
		d := add
		if i%2 == 1 {
			d = del
		}
		i++
		batch, err := encodeChanges(w, d)
		if err == nil {
			err = w.Write(context.Background(), batch)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// testBatch encodes changes as a sync does (encodeChanges).
func testBatch(t testing.TB, w *Conn, changes []testChange) *Batch {
	t.Helper()
	b, err := encodeChanges(w, changes)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNetlinkWriterAfterBatchDeadline: the connection that wrote a batch
// serves the next dump and batch after the batch's deadline has passed (a
// deadline left on the socket failed the next request's write, and the
// listing of a full sync with it).
func TestNetlinkWriterAfterBatchDeadline(t *testing.T) {
	ns, f := scratchNetns(t)
	nftIn(t, ns, "add table inet t\nadd chain inet t c\nadd set inet t peers { type ipv4_addr ; }\n", "-f", "-")
	w := NewConn("t", int(f.Fd()))
	defer w.Close()
	w.timeout = 50 * time.Millisecond
	peers := set("ipv4_addr")
	peers.Set.Name = "peers"
	for i, key := range []string{"10.0.0.1", "10.0.0.2"} {
		if err := w.Write(context.Background(), testBatch(t, w, []testChange{{set: peers, add: []knftables.Element{{Key: []string{key}}}}})); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		time.Sleep(3 * w.timeout)
		objs, err := w.tableObjects(context.Background())
		if err != nil {
			t.Fatalf("listing after batch %d: %v", i, err)
		}
		if !slices.Equal(objs["chain"], []string{"c"}) || !slices.Equal(objs["set"], []string{"peers"}) {
			t.Fatalf("listing after batch %d: %v", i, objs)
		}
	}
}
