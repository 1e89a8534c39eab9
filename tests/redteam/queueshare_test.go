package redteam

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// TestRedTeamQueueShareFlood: in queue mode, with the default per-source
// share of the queue, new/flooder (denied) sends TCP SYNs to x/srv from its
// own address as fast as two threads can (raw sockets, a process of its
// own) for 2.5 s; after 0.5 s new/client, on the same node and allowed,
// connects to x/srv one connection after another until the flood ends.
//
// Asserted:
//   - every one of the client's connections connects, within 950 ms: less
//     than the first SYN retransmission (1 s), so each had its first SYN
//     queued and decided. With the flooder held to its share the queue
//     never fills, so no SYN of another pod may be lost to it;
//   - node-1's kernel queued every packet that reached the queue
//     (queue_dropped and user_dropped did not grow): the flooder never
//     filled it. The share promises that only while the queue decides at
//     least the default share a second: when other processes starve the
//     reader below it (seen with another benchmark on the same 2 vCPUs:
//     21,000 to 28,000 a second, and hundreds to thousands of packets not
//     queued in 5 of 34 runs), the test logs the overflow instead;
//   - what the flooder had queued stays within its share (burst + rate x
//     its run time, 5% slack for the clock), the rest was dropped and
//     counted in the userspace-share chain.
func TestRedTeamQueueShareFlood(t *testing.T) {
	ctx := requireLab(t)
	l, err := lab.New(ctx, nil, lab.Config{Mode: compile.ModeQueue})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	res, err := l.RunShareFlood(ctx, lab.ShareFloodConfig{Exec: os.Args[0], Workers: 2, Duration: 2500 * time.Millisecond,
		Warmup: 500 * time.Millisecond, ProbeTimeout: 950 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rc := l.RenderConfig()
	var d []time.Duration
	for i, p := range res.Client {
		d = append(d, p.Duration)
		if !p.Connected {
			t.Errorf("client connection %d (of %d) during the flood: %s after %v, want connected", i, len(res.Client), p.Reason, p.Duration)
		}
	}
	slices.Sort(d)
	secs := res.Elapsed.Seconds()
	t.Logf("share %d/s, burst %d: the flooder sent %d SYNs in %v (%.0f/s), %d dropped over its share; the queue decided %d (%.0f/s), could not queue %+v; client %d/%d connected, p50 %v, max %v",
		rc.QueueSourceRate, rc.QueueSourceBurst, res.Sent, res.Elapsed.Round(time.Millisecond), float64(res.Sent)/secs, res.ShareDropped,
		res.Received, float64(res.Received)/secs, res.Overflowed, res.ClientOK(), len(res.Client), d[len(d)/2], d[len(d)-1])
	if len(res.Client) < 20 {
		t.Errorf("the client made %d connections during the flood, want at least 20", len(res.Client))
	}
	if n, decided := res.Overflowed.Total(), float64(res.Received)/secs; n != 0 {
		// The default, not the lab's: with the share taken away (raised
		// out of reach), a queue that decided more than the default share
		// a second and still overflowed was filled by the flooder.
		if decided < float64(compile.DefaultQueueSourceRate) {
			t.Logf("the kernel could not queue %d packets (%+v) while the queue decided %.0f a second, less than one source's share: the reader was starved by other work, which the share cannot help", n, res.Overflowed, decided)
		} else {
			t.Errorf("the kernel could not queue %d packets during the flood (%+v) while the queue decided %.0f a second, want 0: the flooder filled the queue", n, res.Overflowed, decided)
		}
	}
	share := float64(rc.QueueSourceBurst) + float64(rc.QueueSourceRate)*secs*1.05
	if queued := float64(res.Sent) - float64(res.ShareDropped); res.ShareDropped == 0 || queued > share {
		t.Errorf("the flooder had %.0f SYNs queued (%d sent, %d dropped in %s), want some dropped there and at most its share %.0f (burst + rate x %v) queued",
			queued, res.Sent, res.ShareDropped, compile.ChainQueueShare, share, res.Elapsed.Round(time.Millisecond))
	}
}
