package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// DNSConfig configures RunDNS.
type DNSConfig struct {
	// Lookups is the number of UDP lookups timed.
	Lookups int
	// Conns is the number of connections made afterwards to an address
	// learned, to check that none is queued in hybrid mode.
	Conns int
	Logf  func(string, ...any)
}

// RunDNS measures DNS learning in hybrid mode on the FQDN lab
// (tests/internal/lab: a real DNS server in a pod namespace, the pod's node
// learning its replies): how long the agent holds a reply (parse, netlink
// write, commit), how many packets are queued per reply, and that the
// connections that follow are not queued.
func RunDNS(ctx context.Context, c DNSConfig) (*Result, error) {
	if c.Lookups <= 0 {
		c.Lookups = 1000
	}
	if c.Conns <= 0 {
		c.Conns = 100
	}
	fl, err := lab.NewFQDNLab(ctx, lab.Config{})
	if err != nil {
		return nil, err
	}
	defer fl.Close()
	d := fl.Agent("node-1").DNS()
	var mu sync.Mutex
	var holds []time.Duration
	d.ObserveHolds(func(t time.Duration) {
		mu.Lock()
		holds = append(holds, t)
		mu.Unlock()
	})
	before := d.Runtime.Stats().Received
	// One pod's lookups, paced under its share of the DNS queue (past
	// compile.DefaultDNSPodRate a second the kernel drops queries, which a
	// resolver would retry and Lookup does not).
	pace := time.NewTicker(2 * time.Second / compile.DefaultDNSPodRate)
	defer pace.Stop()
	for i := 0; i < c.Lookups; i++ {
		<-pace.C
		got, err := fl.Lookup(lab.FQDNServer, "www.example.com", false, false)
		if err != nil || len(got) != 1 {
			return nil, fmt.Errorf("lookup %d: %v %v", i, got, err)
		}
	}
	queued := d.Runtime.Stats().Received - before
	mu.Lock()
	hs := append([]time.Duration(nil), holds...)
	mu.Unlock()
	if len(hs) == 0 {
		return nil, errors.New("no DNS reply was held: the capture rule is not in the path")
	}
	c.Logf("dns: %d lookups, %d packets queued, hold p50 %v p99 %v", c.Lookups, queued, Percentile(hs, 50), Percentile(hs, 99))

	afterLookups := d.Runtime.Stats().Received
	denied := 0
	for i := 0; i < c.Conns; i++ {
		ok, err := fl.Net().Probe(ctx, fl.Pod, lab.FQDNRecords[0].Addrs[0], 80, netlab.TCP, time.Second)
		if err != nil {
			return nil, err
		}
		if !ok {
			denied++
		}
	}
	r := &Result{}
	r.Set("dns_lookups", c.Lookups)
	r.Set("dns_hold_us_p50", micros(Percentile(hs, 50)))
	r.Set("dns_hold_us_p99", micros(Percentile(hs, 99)))
	r.Set("queued_packets_per_dns_reply", round(float64(queued)/float64(c.Lookups), 3))
	connQueued := d.Runtime.Stats().Received - afterLookups
	if st, ok := fl.QueueStats("node-1"); ok {
		connQueued += st.Received
	}
	r.Set("dns_hybrid_conn_queued_packets", connQueued)
	r.Set("dns_learned_conn_denied", denied)
	return r, nil
}
