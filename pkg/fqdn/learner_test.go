package fqdn_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

const webScenario = `
pods:
  - {namespace: x, name: a, ips: [10.0.0.1, "fd00::1"], node: n1}
  - {namespace: y, name: b, ip: 10.0.0.2, node: n1}
clusterNetworkPolicies:
  - apiVersion: policy.networking.k8s.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: web}
    spec:
      tier: Admin
      priority: 1
      subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}
      egress:
        - {name: names, action: Accept, to: [{domainNames: [Www.Example.com., "*.example.org"]}]}
`

var server = netip.MustParseAddr("10.96.0.10")

type rr struct {
	name, cname string
	addr        string
	ttl         uint32
}

// reply builds a DNS response to one question.
func reply(t *testing.T, q string, qt dnsmessage.Type, truncated bool, rrs ...rr) []byte {
	t.Helper()
	return build(t, truncated, []dnsmessage.Question{{Name: dnsmessage.MustNewName(q), Type: qt, Class: dnsmessage.ClassINET}}, rrs)
}

// build builds a DNS response with the questions and the records, in order.
func build(t *testing.T, truncated bool, qs []dnsmessage.Question, rrs []rr) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{Response: true, Truncated: truncated})
	_ = b.StartQuestions()
	for _, q := range qs {
		if err := b.Question(q); err != nil {
			t.Fatal(err)
		}
	}
	_ = b.StartAnswers()
	for _, r := range rrs {
		h := dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(r.name), Class: dnsmessage.ClassINET, TTL: r.ttl}
		var err error
		switch a := netip.MustParseAddr(orZero(r.addr)); {
		case r.cname != "":
			err = b.CNAMEResource(h, dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(r.cname)})
		case a.Is4():
			err = b.AResource(h, dnsmessage.AResource{A: a.As4()})
		default:
			err = b.AAAAResource(h, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func orZero(s string) string {
	if s == "" {
		return "0.0.0.0"
	}
	return s
}

type fakeWriter struct {
	got     [][]fqdn.Element
	deleted [][]fqdn.Element
	err     error
	// discard keeps nothing (benchmarks).
	discard bool
}

func (w *fakeWriter) DeleteElements(_ context.Context, els []fqdn.Element) error {
	if w.err != nil {
		return w.err
	}
	w.deleted = append(w.deleted, els)
	return nil
}

func (w *fakeWriter) WriteElements(_ context.Context, els []fqdn.Element) error {
	if w.err != nil || w.discard {
		return w.err
	}
	w.got = append(w.got, els)
	return nil
}

func newLearner(t *testing.T, w fqdn.Writer, failOpen bool) (*fqdn.Learner, *compile.Program, *time.Time) {
	t.Helper()
	sc, err := scenario.Parse([]byte(webScenario))
	if err != nil {
		t.Fatal(err)
	}
	prog := compile.Build(sc.Input("n1", nil, nil))
	now := time.Unix(1000, 0)
	l, err := fqdn.New(fqdn.Config{Program: func() *compile.Program { return prog }, Writer: w,
		Trusted: func(a netip.Addr) bool { return a == server }, MinTTL: 5 * time.Second, MaxTTL: time.Hour, FailOpen: failOpen,
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return l, prog, &now
}

var (
	podA4 = netip.MustParseAddr("10.0.0.1")
	podA6 = netip.MustParseAddr("fd00::1")
	podB  = netip.MustParseAddr("10.0.0.2")
	web   = []compile.DomainPattern{{Suffix: "www.example.com"}, {Suffix: "example.org", Wildcard: true}}
)

func TestLearn(t *testing.T) {
	w := &fakeWriter{}
	l, prog, now := newLearner(t, w, false)
	set4 := compile.FQDNSetName(&prog.ClusterPolicies[0], 0, true)
	set6 := compile.FQDNSetName(&prog.ClusterPolicies[0], 0, false)
	ctx := context.Background()

	// CNAME chain: the question matches; the addresses are at the chain's end;
	// the TTL is the chain's smallest, clamped up to the minimum.
	r := l.Learn(ctx, server, podA4, reply(t, "WWW.example.com.", dnsmessage.TypeA, false,
		rr{name: "www.example.com.", cname: "edge.cdn.test.", ttl: 60},
		rr{name: "edge.cdn.test.", addr: "192.0.2.1", ttl: 2}))
	if !r.Release || r.Learned != 1 {
		t.Fatalf("Learn = %+v", r)
	}
	want := []fqdn.Element{{Set: set4, Pod: podA4, Addr: netip.MustParseAddr("192.0.2.1"), Timeout: 5 * time.Second}}
	if len(w.got) != 1 || !slices.Equal(w.got[0], want) {
		t.Fatalf("written %+v, want %+v", w.got, want)
	}
	if !l.Resolved(podA4, netip.MustParseAddr("192.0.2.1"), web) || l.Resolved(podB, netip.MustParseAddr("192.0.2.1"), web) {
		t.Errorf("Resolved: the pod that looked the name up, and only it")
	}
	*now = now.Add(6 * time.Second)
	if l.Resolved(podA4, netip.MustParseAddr("192.0.2.1"), web) {
		t.Errorf("Resolved after the TTL")
	}

	// An AAAA answer received on the pod's IPv4 address pairs with its IPv6 one.
	w.got = nil
	l.Learn(ctx, server, podA4, reply(t, "a.b.example.org.", dnsmessage.TypeAAAA, false, rr{name: "a.b.example.org.", addr: "2001:db8::1", ttl: 7200}))
	want = []fqdn.Element{{Set: set6, Pod: podA6, Addr: netip.MustParseAddr("2001:db8::1"), Timeout: time.Hour}}
	if len(w.got) != 1 || !slices.Equal(w.got[0], want) {
		t.Fatalf("written %+v, want %+v", w.got, want)
	}
	if !l.Resolved(podA6, netip.MustParseAddr("2001:db8::1"), web) {
		t.Errorf("Resolved from the pod's IPv6 address")
	}

	for _, tc := range []struct {
		name  string
		src   netip.Addr
		dst   netip.Addr
		msg   []byte
		cause string
	}{
		{"untrusted", netip.MustParseAddr("10.9.9.9"), podA4, reply(t, "www.example.com.", dnsmessage.TypeA, false, rr{name: "www.example.com.", addr: "192.0.2.9", ttl: 60}), fqdn.CauseUntrusted},
		{"wildcard needs a label", server, podA4, reply(t, "example.org.", dnsmessage.TypeA, false, rr{name: "example.org.", addr: "192.0.2.9", ttl: 60}), fqdn.CauseNoMatch},
		{"no rule for the pod", server, podB, reply(t, "www.example.com.", dnsmessage.TypeA, false, rr{name: "www.example.com.", addr: "192.0.2.9", ttl: 60}), fqdn.CauseNoMatch},
		{"truncated", server, podA4, reply(t, "www.example.com.", dnsmessage.TypeA, true, rr{name: "www.example.com.", addr: "192.0.2.9", ttl: 60}), fqdn.CauseTruncated},
		{"garbage", server, podA4, []byte{1, 2, 3}, fqdn.CauseMalformed},
		{"cut short", server, podA4, reply(t, "www.example.com.", dnsmessage.TypeA, false, rr{name: "www.example.com.", addr: "192.0.2.9", ttl: 60})[:30], fqdn.CauseMalformed},
		{"no address", server, podA4, reply(t, "www.example.com.", dnsmessage.TypeA, false), fqdn.CauseNoAddress},
	} {
		w.got = nil
		r := l.Learn(ctx, tc.src, tc.dst, tc.msg)
		if !r.Release || r.Cause != tc.cause || len(w.got) != 0 {
			t.Errorf("%s: Learn = %+v, wrote %v; want released, cause %s, nothing written", tc.name, r, w.got, tc.cause)
		}
	}
}

func TestLearnWriteFailure(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		l, _, _ := newLearner(t, &fakeWriter{err: errors.New("refused")}, failOpen)
		r := l.Learn(context.Background(), server, podA4, reply(t, "www.example.com.", dnsmessage.TypeA, false, rr{name: "www.example.com.", addr: "192.0.2.1", ttl: 60}))
		if r.Release != failOpen || r.Cause != fqdn.CauseWriteError {
			t.Errorf("failOpen=%v: Learn = %+v", failOpen, r)
		}
		if l.Resolved(podA4, netip.MustParseAddr("192.0.2.1"), web) {
			t.Errorf("failOpen=%v: an answer the kernel does not hold is resolved for the evaluator", failOpen)
		}
	}
}

func TestDNSPayload(t *testing.T) {
	msg := []byte("dns!")
	udp := append([]byte{0, 53, 4, 0, 0, 12, 0, 0}, msg...)
	if got, err := fqdn.DNSPayload(17, append(make([]byte, 20), udp...), 20); err != nil || string(got) != "dns!" {
		t.Errorf("UDP: %q, %v", got, err)
	}
	tcp := make([]byte, 20)
	tcp[12] = 5 << 4
	if got, err := fqdn.DNSPayload(6, append(make([]byte, 20), append(tcp, 0, 4, 'd', 'n', 's', '!')...), 20); err != nil || string(got) != "dns!" {
		t.Errorf("TCP: %q, %v", got, err)
	}
	if got, err := fqdn.DNSPayload(6, append(make([]byte, 20), tcp...), 20); err != nil || got != nil {
		t.Errorf("TCP without data: %q, %v", got, err)
	}
	if _, err := fqdn.DNSPayload(6, append(make([]byte, 20), append(tcp, 0, 9, 'd')...), 20); fqdn.Cause(err) != fqdn.CauseSplit {
		t.Errorf("TCP message over several segments: %v", err)
	}
	if _, err := fqdn.DNSPayload(17, append(make([]byte, 20), 0, 53, 4, 0, 0, 99, 0, 0), 20); fqdn.Cause(err) != fqdn.CauseMalformed {
		t.Errorf("UDP length beyond the packet: %v", err)
	}
}
