package queuerule

// How the NFQUEUE statement is expressed in nftpolicy's table.
//
// Kernels with CONFIG_NFT_QUEUE have the native nft "queue" expression, which
// the nft binary (and so knftables) can write as text. Kernels without it
// (CONFIG_NFT_QUEUE off) still have the xtables NFQUEUE target, usable from
// nftables through nft_compat (CONFIG_NFT_COMPAT, CONFIG_NETFILTER_XT_TARGET_NFQUEUE),
// the way iptables-nft uses it. The nft binary cannot write an xt target as
// text, so on such kernels the queue rule is written over netlink with
// github.com/google/nftables, alone in a dedicated regular chain that the
// knftables-managed chains jump to.
//
// Findings on Linux 6.18 / nft 1.0.6 (see pkg/queue/runtime_linux_test.go):
//
//   - An xt NFQUEUE target (revision 3) works in an "inet" family table:
//     the rule is accepted, and IPv4 and IPv6 packets are queued to the
//     configured queue numbers with the bypass and CPU fanout flags honoured.
//     No ip/ip6 family table is needed.
//   - "nft list ruleset" shows the rule translated by libxtables as
//     "queue num 3-4 bypass,fanout" (old native syntax!) and prints, on
//     stderr, "# Warning: table inet nftpolicy is managed by iptables-nft, do
//     not touch!" and "libxtables: unhandled NFPROTO in xtables_set_nfproto".
//     The text is therefore not a faithful dump: feeding it back to "nft -f"
//     asks for the native expression, which fails without CONFIG_NFT_QUEUE.
//     "nft --json list ruleset" shows {"xt": {"type": "target", "name":
//     "NFQUEUE"}} without the queue numbers.
//   - nft transactions ("nft -f", as knftables runs them) that add, flush or
//     delete OTHER chains, sets and maps of the same table work while the xt
//     rule exists, and leave it alone. A transaction that flushes or deletes
//     the dedicated chain or the table removes the rule: reinstall it after
//     such a transaction (CheckCompatQueueRule tells whether it is in place).
//     knftables ignores nft's stderr on success, so the warnings are harmless.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// xt_NFQUEUE flags (include/uapi/linux/netfilter/xt_NFQUEUE.h).
const (
	nfqFlagBypass    = 0x01
	nfqFlagCPUFanout = 0x02
)

// QueueRuleConfig describes the queue rule.
type QueueRuleConfig struct {
	// QueueNum is the first queue number.
	QueueNum uint16
	// Queues is the number of queues, QueueNum..QueueNum+Queues-1; 0 means 1.
	Queues uint16
	// Bypass accepts packets (continues with the next hook) while no process
	// is bound to the queue, instead of dropping them: fail-open when the
	// userspace evaluator is down.
	Bypass bool
	// Fanout chooses the queue by CPU instead of by flow hash. It only applies
	// when Queues > 1.
	Fanout bool
	// Counter adds a counter before the target (queued packets) to the compat
	// rule.
	Counter bool
	// Comment is the compat rule's comment (shown by nft), if not empty.
	Comment string
	// Family is the table family of the compat rule; 0 means inet.
	Family nftables.TableFamily
}

func (c QueueRuleConfig) queues() uint16 {
	if c.Queues == 0 {
		return 1
	}
	return c.Queues
}

func (c QueueRuleConfig) family() nftables.TableFamily {
	if c.Family == 0 {
		return nftables.TableFamilyINet
	}
	return c.Family
}

// Validate checks the queue range and comment.
func (c QueueRuleConfig) Validate() error {
	if err := compile.ValidateQueueRange(c.QueueNum, c.queues()); err != nil {
		return err
	}
	if len(c.Comment) > 128 {
		return errors.New("comment longer than 128 bytes")
	}
	return nil
}

// NativeQueueStatement returns the nft statement for kernels with the native
// queue expression, e.g. "queue flags bypass,fanout to 0-1" or "queue to 3".
func NativeQueueStatement(cfg QueueRuleConfig) string {
	return compile.QueueStatement(cfg.QueueNum, cfg.queues(), cfg.Bypass, cfg.Fanout)
}

// compatInfo is struct xt_NFQ_info_v3 {__u16 queuenum, queues_total, flags}
// in host byte order, padded to XT_ALIGN (8 bytes) as the kernel checks.
func compatInfo(cfg QueueRuleConfig) []byte {
	info := make([]byte, 8)
	var flags uint16
	if cfg.Bypass {
		flags |= nfqFlagBypass
	}
	if cfg.Fanout && cfg.queues() > 1 {
		flags |= nfqFlagCPUFanout
	}
	binary.NativeEndian.PutUint16(info[0:2], cfg.QueueNum)
	binary.NativeEndian.PutUint16(info[2:4], cfg.queues())
	binary.NativeEndian.PutUint16(info[4:6], flags)
	return info
}

// CompatQueueExprs returns the expressions of the compat queue rule: an
// optional counter and the xt NFQUEUE target, revision 3.
func CompatQueueExprs(cfg QueueRuleConfig) []expr.Any {
	info := xt.Unknown(compatInfo(cfg))
	var exprs []expr.Any
	if cfg.Counter {
		exprs = append(exprs, &expr.Counter{})
	}
	return append(exprs, &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &info})
}

// InstallCompatQueueRule makes the regular chain table/chain hold exactly the
// compat queue rule, in one netlink batch: add the chain (a no-op when it
// exists), flush it, add the rule. The table must exist. conn decides the
// network namespace (nftables.New(nftables.WithNetNSFd(fd))).
//
// The chain must be a regular chain jumped to from the base chain whose first
// rule handles the allow mark (see pkg/queue): NF_REPEAT re-runs the base
// chain. Never put it in a base chain of its own, where a repeated packet
// would be queued again.
func InstallCompatQueueRule(conn *nftables.Conn, table, chain string, cfg QueueRuleConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	t := &nftables.Table{Family: cfg.family(), Name: table}
	c := &nftables.Chain{Table: t, Name: chain}
	conn.AddChain(c)
	conn.FlushChain(c)
	r := &nftables.Rule{Table: t, Chain: c, Exprs: CompatQueueExprs(cfg)}
	if cfg.Comment != "" {
		r.UserData = userdata.AppendString(nil, userdata.TypeComment, cfg.Comment)
	}
	conn.AddRule(r)
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("installing xt NFQUEUE rule in table %s chain %s (family %d): %w", table, chain, cfg.family(), err)
	}
	return nil
}

// CheckCompatQueueRule reports whether table/chain holds exactly one rule,
// the compat queue rule of cfg (e.g. after a knftables transaction that may
// have flushed the chain). A missing table or chain is reported as false
// with the error.
func CheckCompatQueueRule(conn *nftables.Conn, table, chain string, cfg QueueRuleConfig) (bool, error) {
	t := &nftables.Table{Family: cfg.family(), Name: table}
	rules, err := conn.GetRules(t, &nftables.Chain{Table: t, Name: chain})
	if err != nil {
		return false, err
	}
	if len(rules) != 1 {
		return false, nil
	}
	want := compatInfo(cfg)
	for _, e := range rules[0].Exprs {
		tg, ok := e.(*expr.Target)
		if !ok || tg.Name != "NFQUEUE" || tg.Rev != 3 {
			continue
		}
		if info, ok := tg.Info.(*xt.Unknown); ok && len(*info) >= 6 && bytes.Equal((*info)[:6], want[:6]) {
			return true, nil
		}
	}
	return false, nil
}

// ErrNoQueueSupport is returned by ProbeQueueVariant and ChooseQueueVariant
// when neither variant works.
var ErrNoQueueSupport = errors.New("kernel supports neither the nft queue expression (CONFIG_NFT_QUEUE) nor the xt NFQUEUE target through nft_compat (CONFIG_NFT_COMPAT, CONFIG_NETFILTER_XT_TARGET_NFQUEUE)")

// NFTBinary is the nft command used by ProbeQueueVariant.
var NFTBinary = "nft"

// QueueProber checks a kernel for each way of queueing packets. Each
// method reports false, nil when the kernel lacks the feature, and an error
// when it could not tell.
type QueueProber interface {
	NativeQueue(ctx context.Context) (bool, error)
	CompatQueue(ctx context.Context) (bool, error)
}

// KernelQueueProber probes the kernel without changing its ruleset: the
// native statement with "nft -c" in the calling thread's network
// namespace, the xt target in NetNS. Besides CAP_NET_ADMIN it needs
// nothing, so the agent can probe its own namespace.
type KernelQueueProber struct {
	// NetNS is the network namespace of the xt probe's netlink socket;
	// nil means the calling thread's.
	NetNS *os.File
}

// NativeQueue implements QueueProber with ProbeNativeQueue.
func (KernelQueueProber) NativeQueue(ctx context.Context) (bool, error) { return ProbeNativeQueue(ctx) }

// CompatQueue implements QueueProber with ProbeCompatQueue.
func (p KernelQueueProber) CompatQueue(context.Context) (bool, error) {
	var opts []nftables.ConnOption
	if p.NetNS != nil {
		opts = append(opts, nftables.WithNetNSFd(int(p.NetNS.Fd())))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		return false, fmt.Errorf("netlink: %w", err)
	}
	return ProbeCompatQueue(conn)
}

// ChooseQueueVariant picks the native variant when the kernel has it, else
// xt-compat when the kernel has that; ErrNoQueueSupport when it has neither.
func ChooseQueueVariant(ctx context.Context, p QueueProber) (compile.QueueVariant, error) {
	native, err := p.NativeQueue(ctx)
	if err != nil {
		return "", fmt.Errorf("probing the nft queue expression: %w", err)
	}
	if native {
		return compile.QueueNative, nil
	}
	compat, err := p.CompatQueue(ctx)
	if err != nil {
		return "", fmt.Errorf("probing the xt NFQUEUE target: %w", err)
	}
	if compat {
		return compile.QueueXTCompat, nil
	}
	return "", ErrNoQueueSupport
}

// ProbeQueueVariant is ChooseQueueVariant with a KernelQueueProber run in a
// private network namespace created for the probe (so it needs
// CAP_SYS_ADMIN besides CAP_NET_ADMIN); it never touches the caller's
// ruleset. A syntax error of nft (too old a binary) is an error, not a
// missing feature.
func ProbeQueueVariant(ctx context.Context) (compile.QueueVariant, error) {
	type result struct {
		v   compile.QueueVariant
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread is never unlocked: it ends with this goroutine, and the
		// private network namespace with it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("creating a network namespace for the queue probe: %w", err)}
			return
		}
		// exec'd children (nft -c) inherit the thread's namespace; the
		// netlink socket is opened through the namespace's fd.
		ns, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer ns.Close()
		v, err := ChooseQueueVariant(ctx, KernelQueueProber{NetNS: ns})
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// probeTable is the name of the table ProbeCompatQueue adds and deletes.
const probeTable = "nftpolicy-probe"

// ProbeCompatQueue reports whether the kernel of conn's network namespace
// accepts an xt NFQUEUE rule. It sends one batch that adds a table with a
// regular chain holding the rule and deletes the table again: the kernel
// checks the rule (loading nft_compat and xt_NFQUEUE as needed) and commits
// nothing that outlives the batch, so no packet ever meets the rule and no
// other ruleset change sees the table. A kernel without the target answers
// ENOENT (or EOPNOTSUPP): false, nil; any other error (no permission) is
// returned.
func ProbeCompatQueue(conn *nftables.Conn) (bool, error) {
	cfg := QueueRuleConfig{QueueNum: 0, Queues: 2, Bypass: true, Fanout: true}
	t := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: probeTable})
	c := conn.AddChain(&nftables.Chain{Table: t, Name: "queue"})
	conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: CompatQueueExprs(cfg)})
	conn.DelTable(t)
	err := conn.Flush()
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EOPNOTSUPP):
		return false, nil
	}
	return false, fmt.Errorf("adding an xt NFQUEUE rule to a throwaway table: %w", err)
}

// ProbeNativeQueue checks with "nft -c" whether the kernel has the native
// queue expression, in the network namespace of the calling thread (nothing
// is committed). It returns false, nil when the kernel lacks the expression
// ("No such file or directory" / "Operation not supported" from the kernel)
// and an error for anything else, e.g. a syntax error of the nft binary.
//
// The probe's chain is a regular one, never a base chain: the kernel
// registers a base chain's hook while it checks the batch and unregisters it
// when it throws the batch away, and unregistering any netfilter hook drops
// every packet waiting in every queue of the namespace. A probe with a hook
// run by a restarting or updating agent dropped the connections the other
// queues held (tests/kernel TestQueueProbeKeepsQueuedPackets).
func ProbeNativeQueue(ctx context.Context) (bool, error) {
	def := "table inet " + probeTable + " {\n" +
		"\tchain probe {\n" +
		"\t\t" + NativeQueueStatement(QueueRuleConfig{QueueNum: 0, Queues: 2, Bypass: true, Fanout: true}) + "\n" +
		"\t}\n}\n"
	cmd := exec.CommandContext(ctx, NFTBinary, "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(def)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err == nil {
		return true, nil
	}
	msg := stderr.String()
	switch {
	case strings.Contains(msg, "syntax error"):
		return false, fmt.Errorf("nft cannot parse the queue statement: %s", strings.TrimSpace(msg))
	case strings.Contains(msg, "Could not process rule") &&
		(strings.Contains(msg, "No such file or directory") || strings.Contains(msg, "Operation not supported")):
		return false, nil
	}
	return false, fmt.Errorf("nft -c: %v: %s", err, strings.TrimSpace(msg))
}
