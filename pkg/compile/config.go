package compile

import (
	"fmt"
	"strings"
)

// Mode says who decides new connections of policy-selected pods.
type Mode string

// The enforcement modes.
const (
	// ModeHybrid: the kernel decides everything the compiler can express
	// (all of NetworkPolicy v1); only residual cases would be queued. In
	// NetworkPolicy v1 nothing is residual, so the ruleset equals kernel
	// mode's.
	ModeHybrid Mode = "hybrid"
	// ModeQueue: every new connection of a policy-selected local pod is
	// queued to the userspace evaluator, as kube-network-policies does.
	ModeQueue Mode = "queue"
	// ModeKernel: nothing is ever queued.
	ModeKernel Mode = "kernel"
)

// ParseMode validates a --mode value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeHybrid, ModeQueue, ModeKernel:
		return m, nil
	}
	return "", fmt.Errorf("unknown mode %q: must be hybrid, queue or kernel", s)
}

// QueueVariant is how a rule hands a packet to NFQUEUE.
type QueueVariant string

// The queue rule variants.
const (
	// QueueNative is nftables' own queue statement (CONFIG_NFT_QUEUE).
	QueueNative QueueVariant = "native"
	// QueueXTCompat is the xtables NFQUEUE target through nft_compat, for
	// kernels without the native statement. nft cannot write it, so the
	// rule is installed over netlink into the otherwise empty queue chain.
	QueueXTCompat QueueVariant = "xt-compat"
)

// Names of the static objects in the table.
const (
	TableName        = "nftpolicy"
	ChainForward     = "forward"
	ChainInput       = "input"
	ChainEgress      = "egress"
	ChainIngress     = "ingress"
	ChainEgressAllow = "egress-allowed"
	ChainQueue       = "userspace"
	MapIngressPodsV4 = "ingress-pods-v4"
	MapIngressPodsV6 = "ingress-pods-v6"
	MapEgressPodsV4  = "egress-pods-v4"
	MapEgressPodsV6  = "egress-pods-v6"
	SetSelfV4        = "self-v4"
	SetSelfV6        = "self-v6"
	// The hooks' priority: after conntrack and Service DNAT, before SNAT.
	filterPriority    = "filter - 5"
	defaultAllowMark  = 0x00100000
	defaultQueueNum   = 100
	maxPolicyRefChars = 80
)

// RenderConfig says how a program becomes a ruleset.
type RenderConfig struct {
	Mode Mode
	// QueueVariant selects the queue rule (queue mode only).
	QueueVariant QueueVariant
	// QueueNum is the first NFQUEUE number; Queues how many, with CPU fanout.
	QueueNum uint16
	Queues   uint16
	// FailOpen lets queued packets through while no agent listens.
	FailOpen bool
	// AllowMark is the packet and conntrack mark bit nftpolicy owns: the
	// evaluator sets it in the verdict, the ruleset moves it to the
	// connection so later packets are not queued again.
	AllowMark uint32
	// DenyLogGroup is the NFLOG group the kernel path's drops log the
	// denied connection's packet to (0: no deny log). DenyLogRate and
	// DenyLogBurst limit those messages per denial, in packets per second.
	DenyLogGroup              uint16
	DenyLogRate, DenyLogBurst uint32
}

// Defaults fills unset fields.
func (c *RenderConfig) Defaults() {
	if c.Mode == "" {
		c.Mode = ModeHybrid
	}
	if c.QueueVariant == "" {
		c.QueueVariant = QueueNative
	}
	if c.QueueNum == 0 {
		c.QueueNum = defaultQueueNum
	}
	if c.Queues == 0 {
		c.Queues = 1
	}
	if c.AllowMark == 0 {
		c.AllowMark = defaultAllowMark
	}
	if c.DenyLogGroup != 0 && c.DenyLogRate == 0 {
		c.DenyLogRate = DefaultDenyLogRate
	}
	if c.DenyLogGroup != 0 && c.DenyLogBurst == 0 {
		c.DenyLogBurst = DefaultDenyLogBurst
	}
}

// Validate reports an unusable configuration.
func (c *RenderConfig) Validate() error {
	if _, err := ParseMode(string(c.Mode)); err != nil {
		return err
	}
	if c.QueueVariant != QueueNative && c.QueueVariant != QueueXTCompat {
		return fmt.Errorf("unknown queue variant %q", c.QueueVariant)
	}
	if c.AllowMark == 0 || c.AllowMark&(c.AllowMark-1) != 0 {
		return fmt.Errorf("allow mark %#x must be a single bit", c.AllowMark)
	}
	if c.AllowMark == 0x4000 || c.AllowMark == 0x8000 {
		return fmt.Errorf("allow mark %#x collides with kube-proxy's masquerade/drop bits", c.AllowMark)
	}
	if uint32(c.QueueNum)+uint32(c.Queues) > 65536 {
		return fmt.Errorf("queues %d-%d out of range", c.QueueNum, uint32(c.QueueNum)+uint32(c.Queues)-1)
	}
	return c.validateDenyLog()
}

// UsesQueue reports whether the ruleset sends packets to NFQUEUE.
func (c *RenderConfig) UsesQueue() bool { return c.Mode == ModeQueue }

// NativeQueueStatement is the nft queue statement for the configuration.
func NativeQueueStatement(cfg RenderConfig) string {
	var flags []string
	if cfg.FailOpen {
		flags = append(flags, "bypass")
	}
	if cfg.Queues > 1 {
		flags = append(flags, "fanout")
	}
	s := "counter queue"
	if len(flags) > 0 {
		s += " flags " + strings.Join(flags, ",")
	}
	if cfg.Queues > 1 {
		return s + fmt.Sprintf(" to %d-%d", cfg.QueueNum, uint32(cfg.QueueNum)+uint32(cfg.Queues)-1)
	}
	return s + fmt.Sprintf(" to %d", cfg.QueueNum)
}
