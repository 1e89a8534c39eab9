package wire

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// Writer writes learned elements with a pkg/sets netlink element writer.
type Writer struct{ W *nftnl.Conn }

// WriteElements implements fqdn.Writer: one batch, committed or not.
func (w Writer) WriteElements(ctx context.Context, els []fqdn.Element) error {
	return w.W.AddTimed(ctx, timed(els))
}

// DeleteElements implements fqdn.Writer: one batch, committed or not.
func (w Writer) DeleteElements(ctx context.Context, els []fqdn.Element) error {
	return w.W.DeleteTimed(ctx, timed(els))
}

// ListElements implements fqdn.Lister.
func (w Writer) ListElements(ctx context.Context, set string) ([]fqdn.Element, error) {
	ts, err := w.W.ListTimed(ctx, set)
	out := make([]fqdn.Element, len(ts))
	for i, e := range ts {
		out[i] = fqdn.Element{Set: e.Set, Pod: e.Pod, Addr: e.Addr}
	}
	return out, err
}

func timed(els []fqdn.Element) []nftnl.TimedElement {
	out := make([]nftnl.TimedElement, len(els))
	for i, e := range els {
		out[i] = nftnl.TimedElement{Set: e.Set, Pod: e.Pod, Addr: e.Addr, Timeout: e.Timeout}
	}
	return out
}

// Decider hands the packets of the DNS queue (the pods' queries and the
// replies to them) to a Learner: a queue.PayloadDecider whose allow means
// "release the packet".
type Decider struct{ L *fqdn.Learner }

// Decide is never called by the Runtime (DecidePayload is); without the
// payload there is nothing to learn, so the packet is released.
func (d Decider) Decide(queue.Packet) (bool, string) { return true, "" }

// DecidePayload records a query, or learns a reply and releases it once
// learned (fqdn.Learner.HandlePacket).
func (d Decider) DecidePayload(p queue.Packet, packet []byte, l4 int) (bool, string) {
	r := d.L.HandlePacket(context.Background(), p.Proto, p.Src, p.Dst, packet, l4)
	if r.Release {
		return true, ""
	}
	if r.Cause == fqdn.CauseOutOfOrder {
		return false, "DNS-over-TCP segment dropped: it starts beyond the next byte of its stream (TCP resends it in order)"
	}
	return false, "DNS reply dropped: its answers could not be learned (" + r.Cause + ")"
}

// RuntimeConfig is the DNS queue's runtime: one queue, so that one reader
// reads each query before its reply; whole packets (the answers are in the
// payload); NF_ACCEPT once learned (the packet is held, not decided: a
// query reaches the queue only after the policy accepted it); the
// connection queues' fail mode.
func RuntimeConfig(rcfg compile.RenderConfig, netNS int, log klog.Logger) queue.RuntimeConfig {
	return queue.RuntimeConfig{
		QueueNum: rcfg.DNSQueueNum, Queues: 1, FailOpen: rcfg.FailOpen, CopyRange: 0xffff,
		AllowMark: rcfg.AllowMark, AcceptOnAllow: true, NetNS: netNS, Logger: log,
	}
}
