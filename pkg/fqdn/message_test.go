package fqdn_test

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
)

// message builds a DNS response with the questions (A unless the name
// starts with "aaaa:") and the records, in order.
func message(t *testing.T, questions []string, rrs ...rr) []byte {
	t.Helper()
	var qs []dnsmessage.Question
	for _, q := range questions {
		qt := dnsmessage.TypeA
		if n, ok := strings.CutPrefix(q, "aaaa:"); ok {
			q, qt = n, dnsmessage.TypeAAAA
		}
		qs = append(qs, dnsmessage.Question{Name: dnsmessage.MustNewName(q), Type: qt, Class: dnsmessage.ClassINET})
	}
	return build(t, false, qs, rrs)
}

// resolvedBy maps each answer address to the names that resolve to it,
// "name,name" in chain order (addresses of several answers joined by "|").
func resolvedBy(as []fqdn.Answer) map[string]string {
	out := map[string]string{}
	for _, a := range as {
		for _, addr := range a.Addrs {
			k := addr.String()
			if out[k] != "" {
				out[k] += "|"
			}
			out[k] += strings.Join(a.Names, ",")
		}
	}
	return out
}

func a(name, addr string) rr       { return rr{name: name, addr: addr, ttl: 60} }
func cname(name, target string) rr { return rr{name: name, cname: target, ttl: 60} }

// TestParseChains is the truth table of CNAME chain shapes: an address is
// resolved by a name only if the name owns its record or reaches the owner
// through the reply's CNAMEs along a chain from the question.
func TestParseChains(t *testing.T) {
	long := []rr{}
	for i := 0; i < 20; i++ {
		long = append(long, cname("c"+strconv.Itoa(i)+".test.", "c"+strconv.Itoa(i+1)+".test."))
	}
	long = append(long, a("c10.test.", "192.0.2.7"), a("c20.test.", "192.0.2.6"))
	for _, tc := range []struct {
		name string
		qs   []string
		rrs  []rr
		want map[string]string
	}{
		{"direct", []string{"q.test."}, []rr{a("q.test.", "192.0.2.1")}, map[string]string{"192.0.2.1": "q.test"}},
		{"alias then target", []string{"q.test."}, []rr{cname("q.test.", "t.test."), a("t.test.", "192.0.2.2")},
			map[string]string{"192.0.2.2": "q.test,t.test"}},
		{"target before alias", []string{"q.test."}, []rr{a("t.test.", "192.0.2.2"), cname("q.test.", "t.test.")},
			map[string]string{"192.0.2.2": "q.test,t.test"}},
		{"attack: the question's own address and a CNAME to the victim name", []string{"x.attacker.test."},
			[]rr{a("x.attacker.test.", "203.0.113.77"), cname("x.attacker.test.", "www.example.com.")},
			map[string]string{"203.0.113.77": "x.attacker.test"}},
		{"attack, CNAME first", []string{"x.attacker.test."},
			[]rr{cname("x.attacker.test.", "www.example.com."), a("x.attacker.test.", "203.0.113.77")},
			map[string]string{"203.0.113.77": "x.attacker.test"}},
		{"attack: the victim name owns an address, unconnected", []string{"x.attacker.test."},
			[]rr{a("x.attacker.test.", "203.0.113.77"), a("www.example.com.", "203.0.113.78"), cname("www.example.com.", "x.attacker.test.")},
			map[string]string{"203.0.113.77": "x.attacker.test"}},
		{"addresses along the chain", []string{"q.test."},
			[]rr{cname("q.test.", "a.test."), cname("a.test.", "b.test."), a("a.test.", "192.0.2.4"), a("b.test.", "192.0.2.3")},
			map[string]string{"192.0.2.4": "q.test,a.test", "192.0.2.3": "q.test,a.test,b.test"}},
		{"two questions, two chains", []string{"q1.test.", "q2.test."},
			[]rr{a("q1.test.", "192.0.2.1"), cname("q2.test.", "t.test."), a("t.test.", "192.0.2.2")},
			map[string]string{"192.0.2.1": "q1.test", "192.0.2.2": "q2.test,t.test"}},
		{"unrelated records", []string{"q.test."},
			[]rr{a("q.test.", "192.0.2.1"), a("other.test.", "192.0.2.9"), cname("other.test.", "q.test."), cname("x.test.", "y.test."), a("y.test.", "192.0.2.8")},
			map[string]string{"192.0.2.1": "q.test"}},
		{"loop", []string{"q.test."}, []rr{cname("q.test.", "a.test."), cname("a.test.", "q.test."), a("a.test.", "192.0.2.5")},
			map[string]string{"192.0.2.5": "q.test,a.test"}},
		{"self loop", []string{"q.test."}, []rr{cname("q.test.", "q.test."), a("q.test.", "192.0.2.1")}, map[string]string{"192.0.2.1": "q.test"}},
		{"two targets of one alias: neither followed", []string{"q.test."},
			[]rr{cname("q.test.", "a.test."), cname("q.test.", "b.test."), a("a.test.", "192.0.2.1"), a("b.test.", "192.0.2.2")}, map[string]string{}},
		{"over-long chain", []string{"c0.test."}, long,
			map[string]string{"192.0.2.7": "c0.test,c1.test,c2.test,c3.test,c4.test,c5.test,c6.test,c7.test,c8.test,c9.test,c10.test"}},
		{"case and trailing dots", []string{"Q.Test."}, []rr{cname("q.TEST.", "T.test."), a("t.test.", "192.0.2.2")},
			map[string]string{"192.0.2.2": "q.test,t.test"}},
		{"no answer", []string{"q.test."}, nil, map[string]string{}},
	} {
		r, err := fqdn.ParseMessage(message(t, tc.qs, tc.rrs...))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got := resolvedBy(r.Answers); !maps.Equal(got, tc.want) {
			t.Errorf("%s: resolved %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestParseChainTTL: an answer's TTL is the smallest of its chain's CNAMEs
// and its owner's records.
func TestParseChainTTL(t *testing.T) {
	r, err := fqdn.ParseMessage(message(t, []string{"q.test."},
		rr{name: "q.test.", cname: "t.test.", ttl: 30}, rr{name: "t.test.", addr: "192.0.2.2", ttl: 300}, rr{name: "q.test.", addr: "192.0.2.1", ttl: 600}))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Duration{}
	for _, a := range r.Answers {
		got[a.Addrs[0].String()] = a.TTL
	}
	if want := map[string]time.Duration{"192.0.2.1": 600 * time.Second, "192.0.2.2": 30 * time.Second}; !maps.Equal(got, want) {
		t.Errorf("TTLs %v, want %v", got, want)
	}
}

// TestParseAddressKinds: AAAA answers are learned as IPv6 addresses only;
// IPv4-mapped and non-unicast answers are skipped and counted.
func TestParseAddressKinds(t *testing.T) {
	r, err := fqdn.ParseMessage(message(t, []string{"aaaa:q.test.", "q.test."},
		a("q.test.", "::ffff:203.0.113.78"), a("q.test.", "2001:db8::1"), a("q.test.", "::1"), a("q.test.", "::"), a("q.test.", "ff02::1"),
		a("q.test.", "127.0.0.1"), a("q.test.", "0.0.0.0"), a("q.test.", "224.0.0.1"), a("q.test.", "255.255.255.255"), a("q.test.", "192.0.2.1")))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range r.Answers {
		for _, x := range a.Addrs {
			got = append(got, x.String())
		}
	}
	// Two questions of one name: its answer once per question.
	if want := []string{"2001:db8::1", "192.0.2.1", "2001:db8::1", "192.0.2.1"}; !slices.Equal(got, want) {
		t.Errorf("learned %v, want %v", got, want)
	}
	if want := map[string]int{fqdn.AnswerMapped: 1, fqdn.AnswerNotUnicast: 7}; !maps.Equal(r.Skipped, want) {
		t.Errorf("skipped %v, want %v", r.Skipped, want)
	}
}
