package nflogread

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// udp is the start of an IPv4 UDP packet from 10.0.0.1 to 10.0.0.2:port.
func udp(port uint16) []byte {
	b := make([]byte, 28)
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], 28)
	b[8], b[9] = 64, 17
	copy(b[12:], []byte{10, 0, 0, 1})
	copy(b[16:], []byte{10, 0, 0, 2})
	binary.BigEndian.PutUint16(b[20:], 40000)
	binary.BigEndian.PutUint16(b[22:], port)
	return b
}

// recorder is a consumer that keeps what it was handed.
type recorder struct {
	got     []string // prefix/destination:port
	dropped *prometheus.CounterVec
}

func newRecorder() *recorder {
	return &recorder{dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dropped"}, []string{"reason"})}
}

func (r *recorder) consumer(group uint16, claims func(string) bool) Consumer {
	return Consumer{Group: group, Name: "recording", Claims: claims, Dropped: r.dropped, Handle: func(prefix string, p queue.Packet, _ time.Time) {
		r.got = append(r.got, fmt.Sprintf("%s/%s:%d", prefix, p.Dst, p.DstPort))
	}}
}

func prefixed(p string) func(string) bool {
	return func(s string) bool { return strings.HasPrefix(s, p) }
}

// TestDeliverByPrefix: consumers sharing a group get the messages whose
// prefix they claim, the group's first consumer what no one claims; a
// group's only consumer gets everything; an unparsable packet is counted
// for the consumer it was for and handed to no one.
func TestDeliverByPrefix(t *testing.T) {
	deny, verify, staged := newRecorder(), newRecorder(), newRecorder()
	r := New(klog.Background(), 0)
	r.Add(deny.consumer(100, prefixed("d")))
	r.Add(verify.consumer(100, prefixed("v")))
	r.Add(staged.consumer(101, prefixed("staged")))
	now := time.Now()
	r.Deliver(100, "d1", udp(1), now)
	r.Deliver(100, "v2", udp(2), now)
	r.Deliver(100, "x3", udp(3), now)
	r.Deliver(101, "x4", udp(4), now)
	r.Deliver(100, "v5", []byte{0x45, 0}, now)
	r.Deliver(102, "d6", udp(6), now)
	if want := []string{"d1/10.0.0.2:1", "x3/10.0.0.2:3"}; !slices.Equal(deny.got, want) {
		t.Errorf("the deny consumer got %v, want %v", deny.got, want)
	}
	if want := []string{"v2/10.0.0.2:2"}; !slices.Equal(verify.got, want) {
		t.Errorf("the verify consumer got %v, want %v", verify.got, want)
	}
	if want := []string{"x4/10.0.0.2:4"}; !slices.Equal(staged.got, want) {
		t.Errorf("the staged consumer (alone in its group) got %v, want %v", staged.got, want)
	}
	if n := testutil.ToFloat64(verify.dropped.WithLabelValues("unparsable")); n != 1 {
		t.Errorf("the verify consumer counted %v unparsable messages, want 1", n)
	}
	if n := testutil.ToFloat64(deny.dropped.WithLabelValues("unparsable")); n != 0 {
		t.Errorf("the deny consumer counted %v unparsable messages, want 0", n)
	}
	if got := r.Groups(); !slices.Equal(got, []uint16{100, 101}) {
		t.Errorf("Groups() = %v", got)
	}
}
