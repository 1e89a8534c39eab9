package compile

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

// DefaultTunnelUDPPorts are the UDP ports of overlay encapsulation that only
// nodes may send to nodes: 4789 (VXLAN, IANA), 6081 (Geneve), 8472
// (VXLAN as Flannel and the Linux kernel's default use it).
var DefaultTunnelUDPPorts = []uint16{4789, 6081, 8472}

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

// String returns the variant's flag spelling ("native", "xt-compat"), or
// "unknown" for the zero value.
func (v QueueVariant) String() string {
	if v == "" {
		return "unknown"
	}
	return string(v)
}

// The queue rule variants.
const (
	// QueueNative is nftables' own queue statement (CONFIG_NFT_QUEUE).
	QueueNative QueueVariant = "native"
	// QueueXTCompat is the xtables NFQUEUE target through nft_compat, for
	// kernels without the native statement. nft cannot write it, so the
	// rule is installed over netlink into the otherwise empty queue chain.
	QueueXTCompat QueueVariant = "xt-compat"
)

const (
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
	// FailOpen lets queued packets through while no agent listens (the
	// queue rule's bypass flag). It never admits what does not fit in a
	// queue: overflow is dropped (render_share.go bounds each source).
	FailOpen bool
	// AllowMark is the packet and conntrack mark bit nftpolicy owns: the
	// evaluator sets it in the verdict, the ruleset moves it to the
	// connection so later packets are not queued again.
	AllowMark uint32
	// DenyLogGroup is the NFLOG group the kernel path's drops log the
	// denied connection's packet to (0: no deny log). DenyLogRate and
	// DenyLogBurst limit those messages per source address, in packets
	// per second; DenyLogTotalRate and DenyLogTotalBurst overall.
	DenyLogGroup                        uint16
	DenyLogRate, DenyLogBurst           uint32
	DenyLogTotalRate, DenyLogTotalBurst uint32
	// StagedLogGroup is the NFLOG group the first packets of new
	// connections of staged policies' local subjects are copied to (0:
	// none; render_staged.go). StagedLogRate and StagedLogBurst limit the
	// copies per source address, in packets per second;
	// StagedLogTotalRate and StagedLogTotalBurst overall.
	StagedLogGroup                          uint16
	StagedLogRate, StagedLogBurst           uint32
	StagedLogTotalRate, StagedLogTotalBurst uint32
	// HeldSourceRate and HeldSourceBurst bound, per source address, the
	// new connections of unknown pod addresses queued (and held) per
	// second; QueueSourceRate and QueueSourceBurst queue mode's queued
	// new connections (render_share.go).
	HeldSourceRate, HeldSourceBurst   uint32
	QueueSourceRate, QueueSourceBurst uint32
	// DNSPodRate and DNSPodBurst bound, per local pod address, the DNS
	// queries and, separately, the DNS replies queued to the DNS queue
	// per second (render_share.go).
	DNSPodRate, DNSPodBurst uint32
	// SkipUnknownPods turns off queueing new connections of addresses in
	// the pod ranges that no known pod holds (render_unknown.go); hybrid
	// mode then never queues.
	SkipUnknownPods bool
	// DNSQueueNum is the NFQUEUE that DNS replies to pods with domainNames
	// egress rules are held in while their answers are learned (hybrid and
	// queue modes); 0 means QueueNum+2*Queues, after the connection queues and their
	// alternate range (the agent's hand-over on updates). See render_fqdn.go.
	DNSQueueNum uint16
	// NoDNSLearning renders no DNS capture (a hybrid-mode kernel that
	// cannot queue): domainNames peers then match nothing.
	NoDNSLearning bool
	// NoSourceValidation renders no source-address validation: packets
	// from pod interfaces whose source the node does not route back
	// through that interface are then not dropped (render_source.go). For
	// CNIs that already stop pods from spoofing.
	NoSourceValidation bool
	// TunnelUDPPorts are the UDP ports of encapsulation (VXLAN, Geneve)
	// that only nodes may send to nodes (render_source.go's tunnel check,
	// part of source validation): nil means DefaultTunnelUDPPorts, an
	// empty non-nil slice none (the IP protocols ipip, ipv6 and gre are
	// always checked).
	TunnelUDPPorts []uint16
	// TunnelPeers are sources besides the Nodes' addresses that may send
	// encapsulation to this node: tunnel endpoints on addresses no Node
	// lists, load balancers that deliver IPIP.
	TunnelPeers []netip.Prefix
	// UplinkIfaces names the node's uplinks (nft iifname patterns: a name,
	// or a prefix and "*"): without pod ranges, an unknown source on a pod
	// interface is dropped (render_unknown.go), and these interfaces,
	// which may be veths or bridges, are not pod interfaces.
	UplinkIfaces []string
	// Verify samples the kernel's verdicts for runtime verification
	// (verify.go); its zero value renders nothing.
	Verify VerifyConfig
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
	c.dnsDefaults()
	if c.DenyLogGroup != 0 && c.DenyLogRate == 0 {
		c.DenyLogRate = DefaultDenyLogRate
	}
	if c.DenyLogGroup != 0 && c.DenyLogBurst == 0 {
		c.DenyLogBurst = DefaultDenyLogBurst
	}
	c.shareDefaults()
	c.stagedLogDefaults()
	if c.TunnelUDPPorts == nil {
		c.TunnelUDPPorts = slices.Clone(DefaultTunnelUDPPorts)
	}
	c.Verify.defaults()
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
	if err := ValidateQueueRange(c.QueueNum, c.Queues); err != nil {
		return err
	}
	if err := c.validateDNSQueue(); err != nil {
		return err
	}
	if err := c.validateShares(); err != nil {
		return err
	}
	if err := c.validateStagedLog(); err != nil {
		return err
	}
	if err := c.validateVerify(); err != nil {
		return err
	}
	if err := c.validateTunnel(); err != nil {
		return err
	}
	return c.validateDenyLog()
}

// UsesQueue reports whether the ruleset sends packets to NFQUEUE.
// In hybrid mode only unknown pods' connections are queued.
func (c *RenderConfig) UsesQueue() bool { return c.Mode == ModeQueue || c.QueuesUnknownPods() }

// ValidateQueueRange checks that NFQUEUE numbers first..first+n-1 exist
// (queue numbers are 16 bits).
func ValidateQueueRange(first, n uint16) error {
	if n == 0 {
		return fmt.Errorf("queue count must be at least 1")
	}
	if last := uint32(first) + uint32(n) - 1; last > 0xffff {
		return fmt.Errorf("queues %d-%d exceed 65535", first, last)
	}
	return nil
}

// QueueRange formats NFQUEUE numbers first..first+n-1 as nft does: "100" or
// "100-101".
func QueueRange(first, n uint16) string {
	if n <= 1 {
		return fmt.Sprint(first)
	}
	return fmt.Sprintf("%d-%d", first, uint32(first)+uint32(n)-1)
}

// QueueStatement is the native nft queue statement for queues first..
// first+n-1: "queue to 100", "queue flags bypass,fanout to 100-101". Fanout
// (by CPU instead of by flow hash) applies only to several queues. nft
// 1.0.6 parses this syntax (and the older "queue num 0-1 bypass,fanout").
func QueueStatement(first, n uint16, bypass, fanout bool) string {
	var flags []string
	if bypass {
		flags = append(flags, "bypass")
	}
	if fanout && n > 1 {
		flags = append(flags, "fanout")
	}
	s := "queue"
	if len(flags) > 0 {
		s += " flags " + strings.Join(flags, ",")
	}
	return s + " to " + QueueRange(first, n)
}

// NativeQueueStatement is the counted queue statement of the ruleset's
// userspace chain for the configuration (fanout whenever several queues).
func NativeQueueStatement(cfg RenderConfig) string {
	return "counter " + QueueStatement(cfg.QueueNum, cfg.Queues, cfg.FailOpen, true)
}

// ifacePattern is an interface name (at most 15 characters), or a prefix
// of one and "*".
var ifacePattern = regexp.MustCompile(`^[A-Za-z0-9._@:-]{1,15}\*?$`)

// validateTunnel checks the tunnel check's ports and peers, and the
// uplinks.
func (c *RenderConfig) validateTunnel() error {
	for _, p := range c.TunnelUDPPorts {
		if p == 0 {
			return fmt.Errorf("tunnel UDP port 0: ports are 1-65535")
		}
	}
	for _, p := range c.TunnelPeers {
		if !p.IsValid() {
			return fmt.Errorf("tunnel peer %v: not a prefix", p)
		}
	}
	return ValidateUplinks(c.UplinkIfaces)
}

// ValidateUplinks checks RenderConfig.UplinkIfaces: interface names, or a
// prefix of one and "*".
func ValidateUplinks(names []string) error {
	for _, u := range names {
		if !ifacePattern.MatchString(u) {
			return fmt.Errorf("uplink interface %q: not an interface name (or prefix and *)", u)
		}
	}
	return nil
}
