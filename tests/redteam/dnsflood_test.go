package redteam

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/dnsserver"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// dnsfloodDuration bounds the attack: long enough for the victim's lookups
// to meet a full DNS queue, short enough for the suite.
const dnsfloodDuration = 4 * time.Second

// dnsfloodSockets is how many sockets (source ports) the flooding pod sends
// from: several writers outrun the learner's single reader.
const dnsfloodSockets = 4

// dnsfloodQuery is a DNS query for name with the given ID.
func dnsfloodQuery(t *testing.T, name string) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		t.Fatal(err)
	}
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	msg, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// dnsfloodRun floods server:53 with UDP queries from the pod key until stop
// is closed, and returns how many it sent. The policy allows them (rule
// "dns"), so without a share every one is queued on the DNS queue, and so
// is every reply.
func dnsfloodRun(t *testing.T, l *dnsstoreLab, key string, server netip.Addr, stop <-chan struct{}) func() uint64 {
	t.Helper()
	var conns []*net.UDPConn
	if err := l.Net().InNetns(l.endpoint(key), func() error {
		for range dnsfloodSockets {
			c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(server, 53)))
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	query := dnsfloodQuery(t, "flood.attacker.test.")
	var (
		sent atomic.Uint64
		wg   sync.WaitGroup
	)
	for i, c := range conns {
		wg.Add(2)
		go func() { // drain the replies so the socket never backs up
			defer wg.Done()
			buf := make([]byte, 1500)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			msg := append([]byte(nil), query...)
			for id := uint16(i << 12); ; id++ {
				select {
				case <-stop:
					return
				default:
				}
				binary.BigEndian.PutUint16(msg, id)
				if _, err := c.Write(msg); err == nil {
					sent.Add(1)
				}
			}
		}()
	}
	return func() uint64 {
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
		return sent.Load()
	}
}

// TestRedTeamDNSQueryFlood: x/c, a second pod with domainNames rules on
// node-1, floods the DNS server its policy allows with UDP queries for a
// few seconds. Every query and reply of a domainNames pod goes through the
// node's one DNS queue; without a per-pod share the flood fills it and
// x/a's queries and replies overflow (dropped), so x/a's lookups time out
// and nothing is learned. x/a resolves names and connects to them during
// the flood: every lookup must answer and be learned, every connection
// succeed.
func TestRedTeamDNSQueryFlood(t *testing.T) {
	l := newDNSStoreLab(t)
	// The rogue server (allowed by rule "dns" as the cluster DNS is)
	// answers the flood, so replies to x/c are queued too; the cluster DNS
	// stays free for x/a.
	stop := make(chan struct{})
	wait := dnsfloodRun(t, l, "x/c", lab.FQDNRogueServer, stop)
	deadline := time.Now().Add(dnsfloodDuration)
	time.Sleep(500 * time.Millisecond) // let the queue fill
	type try struct {
		name, addr string
	}
	tries := []try{{"www.example.com", "192.0.2.10"}, {"a.b.example.org", "192.0.2.11"}, {"api.example.com", "192.0.2.13"}}
	var failed, lookups int
	for i := 0; time.Now().Before(deadline); i++ {
		tr := tries[i%len(tries)]
		lookups++
		var got []netip.Addr
		err := l.Net().InNetns(l.endpoint("x/a"), func() error {
			var err error
			got, err = dnsserver.Lookup(netip.AddrPortFrom(lab.FQDNServer, 53), tr.name, false, false, time.Second)
			return err
		})
		switch {
		case err != nil:
			failed++
			t.Logf("x/a: lookup %s during the flood: %v", tr.name, err)
		case len(got) == 0:
			failed++
			t.Logf("x/a: lookup %s during the flood: no address", tr.name)
		case !l.connects("x/a", tr.addr):
			failed++
			t.Logf("x/a: %s resolved during the flood but %s:80 denied (not learned)", tr.name, tr.addr)
		}
	}
	close(stop)
	sent := wait()
	t.Logf("x/c sent %d queries in %v (%.0f/s); x/a: %d lookups, %d failed", sent, dnsfloodDuration, float64(sent)/dnsfloodDuration.Seconds(), lookups, failed)
	// The kernel's queues of node-1 (number, ..., overflow drops in the
	// 6th column) and the share chains' counters.
	queues, _ := l.Net().NodeExec("node-1", "cat", "/proc/net/netfilter/nfnetlink_queue")
	t.Logf("node-1 queues (queue_dropped is the 6th field):\n%s", queues)
	// (Named, not pkg/compile's constants: the test also runs on the code
	// before the share chains.)
	for _, c := range []string{"dns-query-share", "dns-reply-share"} {
		out, _ := l.Net().NodeExec("node-1", "nft", "list", "chain", "inet", compile.TableName, c)
		t.Logf("%s", out)
	}
	if failed > 0 {
		t.Errorf("x/a: %d of %d lookups and connections failed while x/c flooded the DNS queue", failed, lookups)
	}
	if l.connects("x/c", "192.0.2.10") {
		t.Errorf("x/c reached www.example.com, which it never resolved")
	}
}
