package queuerule

import "github.com/nftpolicy/nftpolicy/pkg/compile"

// CompatRuleConfig is the xt-compat queue rule of an External chain of a
// ruleset rendered with rcfg: the DNS learning chain queues to the DNS
// queue; the userspace chain to the connection queues.
func CompatRuleConfig(rcfg compile.RenderConfig, chain string) QueueRuleConfig {
	if chain == compile.ChainDNS {
		return QueueRuleConfig{QueueNum: rcfg.DNSQueueNum, Queues: 1, Bypass: rcfg.FailOpen, Counter: true,
			Comment: "nftpolicy: DNS replies held until their answers are learned"}
	}
	return QueueRuleConfig{QueueNum: rcfg.QueueNum, Queues: rcfg.Queues, Bypass: rcfg.FailOpen, Fanout: rcfg.Queues > 1, Counter: true,
		Comment: "nftpolicy: new connections to the userspace evaluator"}
}
