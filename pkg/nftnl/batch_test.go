package nftnl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// The element writer before it encoded batches into one buffer: text to
// elements of byte slices, then mdlayher/netlink's attribute encoder, one
// netlink.Message per element message. Kept here only as the reference
// of TestElementBatchMatchesReference.

type refElement struct {
	key, keyEnd []byte
	flags       uint32
	verdict     int32
	chain       string
	data        []byte
	hasVerdict  bool
	udata       []byte
	timeoutMS   uint64
}

func (e *refElement) encodedLen() int {
	return 4 + 8 + len(e.key) + 8 + len(e.keyEnd) + 8 + 16 + len(e.chain) + 8 + len(e.data) + 4 + len(e.udata) + 8 + 12
}

func refEncode(l *Layout, e *knftables.Element, forDelete bool) ([]refElement, error) {
	if len(e.Key) != len(l.key) {
		return nil, fmt.Errorf("element %q has %d key fields, the set's type has %d", strings.Join(e.Key, " . "), len(e.Key), len(l.key))
	}
	concat := len(l.key) > 1
	var start, end []byte
	for i, k := range l.key {
		first, last, err := refParseField(k, e.Key[i])
		if err != nil {
			return nil, err
		}
		if !slices.Equal(first, last) && !l.interval {
			return nil, fmt.Errorf("range %q in a set without the interval flag", e.Key[i])
		}
		start = refAppendField(start, first, concat)
		end = refAppendField(end, last, concat)
	}
	el := refElement{key: start}
	if !forDelete {
		if l.verdict {
			if len(e.Value) != 1 {
				return nil, fmt.Errorf("verdict map element %q needs one verdict", strings.Join(e.Key, " . "))
			}
			code, chain, err := refParseVerdict(e.Value[0])
			if err != nil {
				return nil, err
			}
			el.hasVerdict, el.verdict, el.chain = true, code, chain
		} else if l.data != nil {
			if len(e.Value) != len(l.data) {
				return nil, fmt.Errorf("map element %q: data fields", strings.Join(e.Key, " . "))
			}
			for i, k := range l.data {
				v, last, err := refParseField(k, e.Value[i])
				if err != nil {
					return nil, err
				}
				if !slices.Equal(v, last) {
					return nil, fmt.Errorf("map data %q is a range", e.Value[i])
				}
				el.data = refAppendField(el.data, v, len(l.data) > 1)
			}
		} else if len(e.Value) != 0 {
			return nil, fmt.Errorf("set element %q has a value", strings.Join(e.Key, " . "))
		}
		if e.Comment != nil {
			if len(*e.Comment) > knftables.CommentLengthMax {
				return nil, fmt.Errorf("element comment longer than %d bytes", knftables.CommentLengthMax)
			}
			el.udata = appendUdata(nil, udataSetElemComment, append([]byte(*e.Comment), 0))
		}
	}
	switch {
	case !l.interval:
		return []refElement{el}, nil
	case concat:
		el.keyEnd = end
		return []refElement{el}, nil
	}
	after := slices.Clone(end)
	if !increment(after) {
		if !forDelete {
			var f [4]byte
			binary.NativeEndian.PutUint32(f[:], setElemFIntervalOpen)
			el.udata = appendUdata(el.udata, udataSetElemFlags, f[:])
		}
		return []refElement{el}, nil
	}
	return []refElement{el, {key: after, flags: unix.NFT_SET_ELEM_INTERVAL_END}}, nil
}

func refAppendField(b, f []byte, pad bool) []byte {
	b = append(b, f...)
	if pad {
		for n := len(f); n%4 != 0; n++ {
			b = append(b, 0)
		}
	}
	return b
}

func refParseField(k fieldKind, s string) (first, last []byte, err error) {
	switch k {
	case kindIPv4, kindIPv6:
		var a, b netip.Addr
		if strings.Contains(s, "/") {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, nil, err
			}
			x := p.Addr().AsSlice()
			for i := p.Bits(); i < len(x)*8; i++ {
				x[i/8] |= 0x80 >> (i % 8)
			}
			a = p.Addr()
			b, _ = netip.AddrFromSlice(x)
		} else if lo, hi, ok := strings.Cut(s, "-"); ok {
			if a, err = netip.ParseAddr(lo); err == nil {
				b, err = netip.ParseAddr(hi)
			}
		} else {
			a, err = netip.ParseAddr(s)
			b = a
		}
		if err != nil {
			return nil, nil, err
		}
		return a.AsSlice(), b.AsSlice(), nil
	case kindProto:
		if p, ok := compile.ProtocolByName(s); ok {
			return []byte{byte(p)}, []byte{byte(p)}, nil
		}
		n, err := strconv.ParseUint(s, 10, 8)
		return []byte{byte(n)}, []byte{byte(n)}, err
	case kindService:
		lo, hi, isRange := strings.Cut(s, "-")
		a, err := strconv.ParseUint(lo, 10, 16)
		b := a
		if err == nil && isRange {
			b, err = strconv.ParseUint(hi, 10, 16)
		}
		return binary.BigEndian.AppendUint16(nil, uint16(a)), binary.BigEndian.AppendUint16(nil, uint16(b)), err
	}
	return nil, nil, fmt.Errorf("unknown field kind %d", k)
}

// typedOf is the typed element of an element's text in a set of layout l,
// its fields read as the reference reads them (refParseField).
func typedOf(l *Layout, e *knftables.Element) (compile.Element, error) {
	out := compile.Element{Shape: l.shape, Comment: e.Comment}
	if !l.typed || len(e.Key) != len(l.key) || len(e.Value) > 1 {
		return out, fmt.Errorf("element %q: not one of the typed shapes of the set's type", e.Key)
	}
	if len(e.Value) == 1 {
		if _, chain, err := refParseVerdict(e.Value[0]); err != nil {
			return out, err
		} else {
			word, _, _ := strings.Cut(strings.TrimSpace(e.Value[0]), " ")
			out.Verdict, out.Chain = refVerdictKinds[word], chain
		}
	}
	for i, k := range l.key {
		first, last, err := refParseField(k, e.Key[i])
		if err != nil {
			return out, err
		}
		switch k {
		case kindIPv4, kindIPv6:
			a, _ := netip.AddrFromSlice(first)
			b, _ := netip.AddrFromSlice(last)
			if i > 0 {
				if a != out.Addr || b != a {
					return out, fmt.Errorf("element %q: the address fields differ", e.Key)
				}
				continue
			}
			out.Addr = a
			if b != a {
				out.Last = &b
			}
		case kindProto:
			out.Ports.Protocol = compile.Protocol(first[0])
		case kindService:
			out.Ports.First, out.Ports.Last = binary.BigEndian.Uint16(first), binary.BigEndian.Uint16(last)
		}
	}
	return out, nil
}

// mustTyped is typedOf of an element of set s.
func mustTyped(t testing.TB, s *compile.Set, e *knftables.Element) compile.Element {
	t.Helper()
	l, err := LayoutOf(s)
	if err != nil {
		t.Fatal(err)
	}
	te, err := typedOf(&l, e)
	if err != nil {
		t.Fatal(err)
	}
	return te
}

type refChanges struct {
	set      string
	del, add []refElement
}

func refMessages(table string, changes []refChanges) ([]netlink.Message, error) {
	batchHeader := func(t uint16) netlink.Message {
		return netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(t), Flags: netlink.Request},
			Data:   nfgenmsg(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES),
		}
	}
	msgs := []netlink.Message{batchHeader(unix.NFNL_MSG_BATCH_BEGIN)}
	emit := func(set string, op uint16, flags netlink.HeaderFlags, els []refElement) error {
		for len(els) > 0 {
			n, size := 0, 0
			for n < len(els) && (n == 0 || size+els[n].encodedLen() <= elementListBytes) {
				size += els[n].encodedLen()
				n++
			}
			data, err := refElementMessage(table, set, els[:n])
			if err != nil {
				return err
			}
			msgs = append(msgs, netlink.Message{
				Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | op), Flags: flags},
				Data:   data,
			})
			els = els[n:]
		}
		return nil
	}
	for _, c := range changes {
		if err := emit(c.set, unix.NFT_MSG_DELSETELEM, netlink.Request|netlink.Acknowledge, c.del); err != nil {
			return nil, err
		}
	}
	for _, c := range changes {
		if err := emit(c.set, unix.NFT_MSG_NEWSETELEM, netlink.Request|netlink.Acknowledge|netlink.Create, c.add); err != nil {
			return nil, err
		}
	}
	if len(msgs) == 1 {
		return nil, nil
	}
	return append(msgs, batchHeader(unix.NFNL_MSG_BATCH_END)), nil
}

func refElementMessage(table, set string, els []refElement) ([]byte, error) {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(list *netlink.AttributeEncoder) error {
		for i := range els {
			e := &els[i]
			list.Nested(unix.NFTA_LIST_ELEM, func(ne *netlink.AttributeEncoder) error {
				ne.Nested(unix.NFTA_SET_ELEM_KEY, func(k *netlink.AttributeEncoder) error {
					k.Bytes(unix.NFTA_DATA_VALUE, e.key)
					return nil
				})
				if e.keyEnd != nil {
					ne.Nested(nftaSetElemKeyEnd, func(k *netlink.AttributeEncoder) error {
						k.Bytes(unix.NFTA_DATA_VALUE, e.keyEnd)
						return nil
					})
				}
				if e.flags != 0 {
					ne.Uint32(unix.NFTA_SET_ELEM_FLAGS, e.flags)
				}
				if e.timeoutMS != 0 {
					ne.Uint64(unix.NFTA_SET_ELEM_TIMEOUT, e.timeoutMS)
				}
				switch {
				case e.hasVerdict:
					ne.Nested(unix.NFTA_SET_ELEM_DATA, func(d *netlink.AttributeEncoder) error {
						d.Nested(unix.NFTA_DATA_VERDICT, func(v *netlink.AttributeEncoder) error {
							v.Uint32(unix.NFTA_VERDICT_CODE, uint32(e.verdict))
							if e.chain != "" {
								v.String(unix.NFTA_VERDICT_CHAIN, e.chain)
							}
							return nil
						})
						return nil
					})
				case e.data != nil:
					ne.Nested(unix.NFTA_SET_ELEM_DATA, func(d *netlink.AttributeEncoder) error {
						d.Bytes(unix.NFTA_DATA_VALUE, e.data)
						return nil
					})
				}
				if len(e.udata) > 0 {
					ne.Bytes(unix.NFTA_SET_ELEM_USERDATA, e.udata)
				}
				return nil
			})
		}
		return nil
	})
	attrs, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	return append(nfgenmsg(unix.NFPROTO_INET, 0), attrs...), nil
}

// wireMessage is one message of a batch as the comparison sees it: the
// header without sequence and port id, the part of its data before the
// element list (nfgenmsg, table, set), and the element list's
// NFTA_LIST_ELEM attributes.
type wireMessage struct {
	typ, flags uint16
	prefix     []byte
	elements   [][]byte
	raw        []byte
}

// splitElementMessage cuts a message's data into its prefix and elements.
func splitElementMessage(t *testing.T, typ, flags uint16, data []byte) wireMessage {
	t.Helper()
	m := wireMessage{typ: typ, flags: flags, raw: data}
	if typ == unix.NFNL_MSG_BATCH_BEGIN || typ == unix.NFNL_MSG_BATCH_END {
		m.prefix = data
		return m
	}
	off := nfgenmsgLen
	for off < len(data) {
		l := int(binary.NativeEndian.Uint16(data[off:]))
		at := binary.NativeEndian.Uint16(data[off+2:])
		if at&^unix.NLA_F_NESTED != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			off += align4(l)
			continue
		}
		if at&unix.NLA_F_NESTED == 0 {
			t.Fatalf("element list without the nested flag")
		}
		if l-nlaHeaderLen > elementListBytes {
			t.Errorf("element list of %d bytes, more than %d", l-nlaHeaderLen, elementListBytes)
		}
		m.prefix = data[:off]
		for e := off + nlaHeaderLen; e < off+l; {
			el := int(binary.NativeEndian.Uint16(data[e:]))
			m.elements = append(m.elements, data[e:e+align4(el)])
			e += align4(el)
		}
		if off+align4(l) != len(data) {
			t.Fatalf("attributes after the element list")
		}
		return m
	}
	t.Fatalf("element message without an element list")
	return m
}

// parseBatch reads an encoded batch back, checking its headers.
func parseBatch(t *testing.T, buf []byte) []wireMessage {
	t.Helper()
	var out []wireMessage
	for off := 0; off < len(buf); {
		if len(buf)-off < nlmsgHeaderLen {
			t.Fatalf("%d bytes after the last message", len(buf)-off)
		}
		l := int(binary.NativeEndian.Uint32(buf[off:]))
		if l%4 != 0 || l < nlmsgHeaderLen+nfgenmsgLen || off+l > len(buf) {
			t.Fatalf("message at %d: bad length %d", off, l)
		}
		typ := binary.NativeEndian.Uint16(buf[off+4:])
		flags := binary.NativeEndian.Uint16(buf[off+6:])
		out = append(out, splitElementMessage(t, typ, flags, buf[off+nlmsgHeaderLen:off+l]))
		off += l
	}
	return out
}

// refWire is what the reference's messages are on the wire.
func refWire(t *testing.T, msgs []netlink.Message) []wireMessage {
	t.Helper()
	var out []wireMessage
	for _, m := range msgs {
		if len(m.Data)%4 != 0 {
			t.Fatalf("reference message data of %d bytes", len(m.Data))
		}
		out = append(out, splitElementMessage(t, uint16(m.Header.Type), uint16(m.Header.Flags), m.Data))
	}
	return out
}

// compareBatches compares the reference's messages with the new encoder's:
// the same element attributes, byte for byte and in order, under the same
// headers, table and set; and, where both cut the lists into as many
// messages, the same message bytes. (The new encoder cuts a list at its
// exact size, the reference at an estimate: it may need fewer messages.)
func compareBatches(t *testing.T, want, got []wireMessage) {
	t.Helper()
	type flat struct {
		typ, flags uint16
		prefix     string
		element    string
	}
	flatten := func(ms []wireMessage) []flat {
		var out []flat
		for _, m := range ms {
			if m.elements == nil {
				out = append(out, flat{m.typ, m.flags, string(m.prefix), ""})
			}
			for _, e := range m.elements {
				out = append(out, flat{m.typ, m.flags, string(m.prefix), string(e)})
			}
		}
		return out
	}
	w, g := flatten(want), flatten(got)
	if len(w) != len(g) {
		t.Fatalf("%d elements and batch messages, the reference has %d", len(g), len(w))
	}
	for i := range w {
		if w[i] != g[i] {
			t.Fatalf("entry %d differs:\nreference %x %x %x %x\ngot       %x %x %x %x", i,
				w[i].typ, w[i].flags, w[i].prefix, w[i].element, g[i].typ, g[i].flags, g[i].prefix, g[i].element)
		}
	}
	if len(want) == len(got) {
		for i := range want {
			if !bytes.Equal(want[i].raw, got[i].raw) {
				t.Fatalf("message %d differs:\nreference %x\ngot       %x", i, want[i].raw, got[i].raw)
			}
		}
	}
}

// equivalenceSets is the wide table of TestElementBatchMatchesReference:
// every layout the writer supports.
func equivalenceSets(r *rand.Rand) []propSet {
	sets := propSets(r)
	c := func(s string) *string { return &s }
	interval := []knftables.SetFlag{knftables.IntervalFlag}
	return append(sets,
		propSet{set: &compile.Set{Key: keyOf("ipv4_addr"), Set: &knftables.Set{Name: "open4", Type: "ipv4_addr", Flags: interval}}, pool: []knftables.Element{
			{Key: []string{"255.255.255.0/24"}, Comment: c("to the end")},
			{Key: []string{"0.0.0.0/1"}},
			{Key: []string{"10.0.0.1-10.0.0.255"}, Comment: c("")},
		}},
		propSet{set: &compile.Set{Key: keyOf("ipv6_addr"), Set: &knftables.Set{Name: "open6", Type: "ipv6_addr", Flags: interval}}, pool: []knftables.Element{
			{Key: []string{"ffff::/16"}},
			{Key: []string{"fd00::/8"}, Comment: c("ula")},
			{Key: []string{"2001:db8::1"}},
		}},
		propSet{set: &compile.Set{Key: keyOf("inet_service"), Set: &knftables.Set{Name: "openports", Type: "inet_service", Flags: interval}}, pool: []knftables.Element{
			{Key: []string{"65000-65535"}},
			{Key: []string{"0"}},
		}},
		propSet{set: &compile.Set{Key: keyOf("inet_proto . inet_service : verdict"), Map: &knftables.Map{Name: "verdicts", Type: "inet_proto . inet_service : verdict", Flags: interval}}, pool: []knftables.Element{
			{Key: []string{"tcp", "1-1023"}, Value: []string{"accept"}},
			{Key: []string{"udp", "53"}, Value: []string{"return"}, Comment: c("r")},
			{Key: []string{"icmpv6", "0"}, Value: []string{" jump  a-chain-with-a-long-name "}},
		}},
	)
}

// TestElementBatchMatchesReference encodes random changes of every layout
// with the batch encoder and with the reference (the encoder it replaced)
// and compares the bytes.
func TestElementBatchMatchesReference(t *testing.T) {
	w := NewConn("nftpolicy", 0)
	for seed := uint64(1); seed <= 20; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		sets := equivalenceSets(r)
		var changes []testChange
		var ref []refChanges
		for _, p := range sets {
			l, err := LayoutOf(p.set)
			if err != nil {
				t.Fatalf("%s: %v", p.set.Name(), err)
			}
			// The pool is both the old and the new elements: a random part
			// of it deleted, another added.
			d := testChange{set: p.set}
			rc := refChanges{set: p.set.Name()}
			for i := range p.pool {
				e := &p.pool[i]
				te := mustTyped(t, p.set, e)
				// The reference reads the typed element's text.
				text := te.Knft()
				for _, forDelete := range []bool{false, true} {
					var els [2]Element
					n, err := l.encode(&te, forDelete, &els)
					if err != nil {
						t.Fatalf("%s %v: %v", rc.set, e.Key, err)
					}
					for j := range n {
						checkEncodedLen(t, &els[j])
					}
					ref, err := refEncode(&l, &text, forDelete)
					if err != nil {
						t.Fatalf("%s %v: reference: %v", rc.set, e.Key, err)
					}
					switch r.IntN(3) {
					case 0:
						if forDelete {
							d.del = append(d.del, *e)
							rc.del = append(rc.del, ref...)
						}
					case 1:
						if !forDelete {
							d.add = append(d.add, *e)
							rc.add = append(rc.add, ref...)
						}
					}
				}
			}
			changes = append(changes, d)
			ref = append(ref, rc)
		}
		b, err := encodeChanges(w, changes)
		if err != nil {
			t.Fatal(err)
		}
		want, err := refMessages(w.table, ref)
		if err != nil {
			t.Fatal(err)
		}
		got := b.finish()
		if want == nil {
			if got != nil {
				t.Fatalf("seed %d: a batch for no changes", seed)
			}
			continue
		}
		compareBatches(t, refWire(t, want), parseBatch(t, got))
	}
}

// checkEncodedLen compares encodedLen with the bytes appendElement writes.
func checkEncodedLen(t *testing.T, e *Element) {
	t.Helper()
	var b Batch
	b.appendElement(e)
	if len(b.buf) != e.encodedLen() {
		t.Fatalf("element %x: encodedLen %d, %d bytes written", e.key(), e.encodedLen(), len(b.buf))
	}
}

// TestElementBatchSplitsLists: a big change is cut into messages whose
// element lists stay below the attribute limit, with the same elements as
// the reference's, and encodedLen is the exact size of what is written.
func TestElementBatchSplitsLists(t *testing.T) {
	w := NewConn("nftpolicy", 0)
	s := &compile.Set{Key: keyOf("ipv6_addr : verdict"), Map: &knftables.Map{Name: "pods6", Type: "ipv6_addr : verdict"}}
	var texts []knftables.Element
	for i := range 6000 {
		texts = append(texts, knftables.Element{
			Key:     []string{netip.AddrFrom16([16]byte{0xfd, 15: byte(i), 14: byte(i >> 8)}).String()},
			Value:   []string{"goto ingress-ns-" + strconv.Itoa(i%37)},
			Comment: ptrStr(fmt.Sprintf("namespace-%d/pod-%d", i%37, i)),
		})
	}
	l, err := LayoutOf(s)
	if err != nil {
		t.Fatal(err)
	}
	d := testChange{set: s}
	rc := refChanges{set: "pods6"}
	var els [2]Element
	for i := range texts {
		d.add = append(d.add, texts[i])
		if i%3 == 0 {
			d.del = append(d.del, texts[i])
			del, _ := refEncode(&l, &texts[i], true)
			rc.del = append(rc.del, del...)
		}
		add, _ := refEncode(&l, &texts[i], false)
		rc.add = append(rc.add, add...)
		te := mustTyped(t, s, &texts[i])
		n, err := l.encode(&te, false, &els)
		if err != nil || n != 1 {
			t.Fatal(n, err)
		}
		checkEncodedLen(t, &els[0])
	}
	b, err := encodeChanges(w, []testChange{d})
	if err != nil {
		t.Fatal(err)
	}
	got := parseBatch(t, b.finish())
	if len(got) < 6 {
		t.Fatalf("%d messages: the lists were not cut", len(got))
	}
	if b.msgs != len(got)-2 {
		t.Errorf("batch counts %d element messages, has %d", b.msgs, len(got)-2)
	}
	want, err := refMessages(w.table, []refChanges{rc})
	if err != nil {
		t.Fatal(err)
	}
	compareBatches(t, refWire(t, want), got)
	t.Logf("%d messages (the reference: %d)", len(got), len(want))
}

// TestElementBatchTimed: AddTimed's elements (a key of two addresses and a
// timeout) are the reference's.
func TestElementBatchTimed(t *testing.T) {
	w := NewConn("nftpolicy", 0)
	b := w.NewBatch(2)
	var ref []refChanges
	for _, e := range []TimedElement{
		{Set: "fqdn4", Pod: netip.MustParseAddr("10.0.0.1"), Addr: netip.MustParseAddr("192.0.2.1"), Timeout: 90 * time.Second},
		{Set: "fqdn6", Pod: netip.MustParseAddr("fd00::1"), Addr: netip.MustParseAddr("2001:db8::1"), Timeout: time.Millisecond},
	} {
		el := timedElement(e)
		checkEncodedLen(t, &el)
		b.add(e.Set, unix.NFT_MSG_NEWSETELEM, &el)
		ref = append(ref, refChanges{set: e.Set, add: []refElement{{
			key: append(e.Pod.AsSlice(), e.Addr.AsSlice()...), timeoutMS: uint64(e.Timeout / time.Millisecond)}}})
	}
	want, err := refMessages(w.table, ref)
	if err != nil {
		t.Fatal(err)
	}
	compareBatches(t, refWire(t, want), parseBatch(t, b.finish()))
}

// testChange is one set's element changes in text form (typedOf turns
// them into typed elements).
type testChange struct {
	set      *compile.Set
	del, add []knftables.Element
}

// encodeChanges encodes changes into one batch of w as a sync does: every
// set's deletions, then every set's additions.
func encodeChanges(w *Conn, changes []testChange) (*Batch, error) {
	b := w.NewBatch(0)
	for _, del := range []bool{true, false} {
		for _, c := range changes {
			l, err := LayoutOf(c.set)
			if err != nil {
				return nil, err
			}
			els, write := c.add, b.AddElement
			if del {
				els, write = c.del, b.DeleteElement
			}
			for i := range els {
				te, err := typedOf(&l, &els[i])
				if err != nil {
					return nil, err
				}
				if err := write(c.set.Name(), &l, &te); err != nil {
					return nil, fmt.Errorf("set %s: %w", c.set.Name(), err)
				}
			}
		}
	}
	return b, nil
}

var refVerdictKinds = map[string]compile.VerdictKind{"accept": compile.VerdictAccept, "drop": compile.VerdictDrop, "return": compile.VerdictReturn,
	"jump": compile.VerdictJump, "goto": compile.VerdictGoto}

// refParseVerdict reads a knftables element's verdict: "accept", "drop",
// "return", "jump C" or "goto C".
func refParseVerdict(s string) (int32, string, error) {
	word, chain, _ := strings.Cut(strings.TrimSpace(s), " ")
	k, ok := refVerdictKinds[word]
	if !ok {
		return 0, "", fmt.Errorf("verdict %q: unknown", s)
	}
	v := compile.RuleVerdict{Kind: k, Chain: strings.TrimSpace(chain)}
	code, err := verdictCode(v)
	return code, v.Chain, err
}
