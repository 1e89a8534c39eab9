package slim

import (
	"net"
	"slices"
	"testing"
	"time"
)

// scriptedConn returns reads of the given sizes, in order.
type scriptedConn struct {
	net.Conn
	sizes []int
}

func (c *scriptedConn) Read(p []byte) (int, error) {
	n := min(c.sizes[0], len(p))
	c.sizes = c.sizes[1:]
	return n, nil
}

// TestGatheringConnWaitsAfterTrickles: a read that found little (less
// than it could take, and less than gatherBelow) is followed by a wait;
// a read that filled its buffer, or a large one, is not.
func TestGatheringConnWaitsAfterTrickles(t *testing.T) {
	var waits []int
	read := 0
	c := &gatheringConn{
		Conn:  &scriptedConn{sizes: []int{100, 4096, 200, 40 << 10, 300, 300}},
		sleep: func(d time.Duration) { waits = append(waits, read); _ = d },
	}
	for _, bufSize := range []int{4096, 4096, 64 << 10, 64 << 10, 64 << 10, 64 << 10} {
		read++
		if _, err := c.Read(make([]byte, bufSize)); err != nil {
			t.Fatal(err)
		}
	}
	// Read 1 (100 of 4096) is short: read 2 waits. Read 2 fills its
	// buffer: read 3 does not wait. Read 3 (200) is short: read 4 waits.
	// Read 4 (40 KiB) is large: read 5 does not wait; read 5 is short:
	// read 6 waits.
	if want := []int{2, 4, 6}; !slices.Equal(waits, want) {
		t.Errorf("waited before reads %v, want %v", waits, want)
	}
}
