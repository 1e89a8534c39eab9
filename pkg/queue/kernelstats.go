package queue

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// QueueStats is one line of /proc/net/netfilter/nfnetlink_queue: a queue
// bound in the reading thread's network namespace.
type QueueStats struct {
	QueueNum uint16
	// PeerPortID is the netlink port id of the bound socket.
	PeerPortID uint32
	// QueueTotal is the number of packets waiting for a verdict now.
	QueueTotal uint32
	CopyMode   uint8
	CopyRange  uint32
	// QueueDropped counts packets dropped because the queue was full.
	QueueDropped uint32
	// UserDropped counts packets dropped because the netlink socket buffer was
	// full (the packet could not be sent to userspace).
	UserDropped uint32
	// IDSequence is the last packet id.
	IDSequence uint32
}

// KernelQueueStatsPath is read by ReadKernelQueueStats. thread-self is used
// because /proc/net follows the namespace of the main thread only.
var KernelQueueStatsPath = "/proc/thread-self/net/netfilter/nfnetlink_queue"

// ReadKernelQueueStats reads the kernel's statistics of the queues bound in
// the network namespace of the calling thread. It returns an empty slice when
// no queue is bound.
func ReadKernelQueueStats() ([]QueueStats, error) {
	f, err := os.Open(KernelQueueStatsPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseKernelQueueStats(f)
}

// ParseKernelQueueStats parses the format of /proc/net/netfilter/nfnetlink_queue:
// "queue_number peer_portid queue_total copy_mode copy_range queue_dropped
// user_dropped id_sequence 1".
func ParseKernelQueueStats(rd io.Reader) ([]QueueStats, error) {
	out := []QueueStats{}
	sc := bufio.NewScanner(rd)
	line := 0
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 8 {
			return nil, fmt.Errorf("nfnetlink_queue line %d: %d fields, want at least 8", line, len(f))
		}
		var v [8]uint64
		for i := range v {
			bits := 32
			if i == 0 {
				bits = 16
			} else if i == 3 {
				bits = 8
			}
			n, err := strconv.ParseUint(f[i], 10, bits)
			if err != nil {
				return nil, fmt.Errorf("nfnetlink_queue line %d field %d: %w", line, i+1, err)
			}
			v[i] = n
		}
		out = append(out, QueueStats{
			QueueNum: uint16(v[0]), PeerPortID: uint32(v[1]), QueueTotal: uint32(v[2]),
			CopyMode: uint8(v[3]), CopyRange: uint32(v[4]), QueueDropped: uint32(v[5]),
			UserDropped: uint32(v[6]), IDSequence: uint32(v[7]),
		})
	}
	return out, sc.Err()
}
