package config

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// AddFlags adds the agent's flags for c's settings to fs, bound to c's
// fields with c's values as their defaults: parsing fs over a configuration
// read from a file leaves what the command line does not name as the file
// said. The field each flag sets is named by its flag tag.
func (c *AgentConfiguration) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig file; in-cluster configuration when empty")
	fs.BoolVar(&c.PodWatchCompression, "pod-watch-compression", c.PodWatchCompression, "let the API server gzip the pod watch, whose initial events are every pod of the cluster: less network at the cost of the API server's and the agent's CPU (at 100k pods, compressing and decompressing cost more than decoding)")
	fs.StringVar(&c.PodSource, "pod-source", c.PodSource, "where other nodes' pods are learned: pods (watch every Pod of the cluster) or slices (the PodAddressSlices `nftpolicy publish` writes, and this node's own Pods; every Pod again while the publisher's Lease is stale)")
	c.PodSlices.addFlags(fs)
	fs.StringVar(&c.Mode, "mode", c.Mode, "hybrid (the kernel decides, userspace only for what it cannot), queue (userspace decides every new connection of selected pods) or kernel (never queue)")
	fs.BoolVar(&c.FailOpen, "fail-open", c.FailOpen, "let queued packets through while no agent listens on the queue (the queue rule's bypass), and allow a connection of an unknown pod address when the pod is not programmed within --unknown-pod-wait (default: drop them); a full queue always drops")
	fs.BoolVar(&c.SourceValidation, "source-validation", c.SourceValidation, "drop packets that come in on a pod interface (veth, bridge or netkit) with a source address the node does not route back through it (spoofed), and encapsulated packets (IPIP, 6in4, GRE, --tunnel-udp-ports) that pods send to nodes or that come to this node from anything but a node; false for CNIs that already stop both")
	fs.Uint32Var(&c.AllowMark, "allow-mark", c.AllowMark, "packet and conntrack mark bit owned by nftpolicy (must not collide with kube-proxy's 0x4000/0x8000 or your CNI's)")
	c.Tunnel.addFlags(fs)
	c.Queue.addFlags(fs)
	c.Metrics.addFlags(fs)
	fs.StringVar(&c.HealthBindAddress, "health-bind-address", c.HealthBindAddress, "address of /healthz, /readyz and /configz (the kubelet probes the node's address); empty to disable")
	fs.DurationVar(&c.FullSyncPeriod.Duration, "full-sync-period", c.FullSyncPeriod.Duration, "how often the whole table is rewritten, repairing outside changes")
	fs.DurationVar(&c.ProgramRefreshDelay.Duration, "program-refresh-delay", c.ProgramRefreshDelay.Duration,
		"hybrid mode: policy changes reach the kernel at once through the incremental compiler; the program that explain and the queue's evaluator read is rebuilt this long after (at least twice the last build's duration); pod changes derive their program right after their transaction")
	c.CostBudgets.AddFlags(fs)
	fs.DurationVar(&c.ClusterPolicyCheckPeriod.Duration, "cluster-policy-check-period", c.ClusterPolicyCheckPeriod.Duration,
		"how often to check whether the ClusterNetworkPolicy API (its CRD) is served; ClusterNetworkPolicies are enforced from when it appears until it is removed")
	fs.DurationVar(&c.LivenessTimeout.Duration, "liveness-timeout", c.LivenessTimeout.Duration, "/healthz fails when the agent made no progress (sync loop, or waiting for the API's first lists) for this long")
	c.DenyLog.addFlags(fs, nflogFlags{name: "deny-log", label: "deny log",
		enabledHelp: "log one line per connection the kernel path denies (NFLOG), naming the policy and rule",
		rateHelp:    "kernel limit on deny log messages per source address, per second (burst twice that): one pod's denials cannot crowd out another's",
		flowKey:     "source, destination and policy"})
	c.StagedLog.addFlags(fs, nflogFlags{name: "staged-log", label: "staged log",
		enabledHelp: "log one line per new connection whose verdict staged policies (nftpolicy.io/staged) would change; the kernel copies only their subjects' first packets (NFLOG)",
		rateHelp:    "kernel limit on staged log copies per source address, per second (burst twice that); over it a connection is not copied, and still decided",
		flowKey:     "source, destination, protocol and port"})
	c.Verify.addFlags(fs)
	c.UnknownPods.addFlags(fs)
	fs.BoolVar(&c.RevokeConnections, "revoke-connections", c.RevokeConnections, "after a policy change, delete the conntrack entries of connections it denies (ctnetlink)")
	c.DNS.addFlags(fs)
	fs.StringVar(&c.StateDir, "state-dir", c.StateDir, "directory on the node (a tmpfs such as /run/nftpolicy) for the snapshot of the policy program in force: "+
		"a restarted agent decides queued connections from it until its first sync, instead of dropping them; empty to disable")
	fs.BoolVar(&c.ReportStatus, "report-status", c.ReportStatus, "keep this node's NodeEnforcement (nftpolicy.io/v1alpha1, install.yaml's CustomResourceDefinition) current: "+
		"which policy changes its kernel enforces, for kubectl nftpolicy status and wait; false: no NodeEnforcement writes (say, without the CustomResourceDefinition)")
	fs.StringVar(&c.PreviewSocket, "preview-socket", c.PreviewSocket,
		"unix socket (mode 0600) on which `nftpolicy preview --local`, run in the agent's container (kubectl nftpolicy preview execs it through the API server), asks which live connections a policy change would cut or allow; "+
			"put it in a directory only the agent's pod sees (install.yaml: /run/nftpolicy-preview/preview.sock on an emptyDir); empty: no preview")
	fs.BoolVar(&c.RemoveOnUninstall, "remove-on-uninstall", c.RemoveOnUninstall, "when the agent's DaemonSet is deleted (not updated), remove the nftables table and its queue rules before exiting, "+
		"so that no node goes on sending new connections to a queue nobody reads; needs --pod-name and --pod-namespace")
	fs.BoolVar(&c.WatchTable, "watch-table", c.WatchTable, "repair changes other processes make to table inet nftpolicy (nft flush ruleset, a firewall service's reload) as soon as the kernel reports them (its nftables notifications), rather than at the next --full-sync-period")
	logsapi.AddFlags(&c.Logging, fs)
}

func (c *TunnelConfiguration) addFlags(fs *pflag.FlagSet) {
	fs.Var(&portsValue{ports: &c.UDPPorts}, "tunnel-udp-ports",
		"UDP ports of overlay encapsulation (VXLAN 4789 and Flannel's 8472, Geneve 6081): pods may not send them to nodes, and this node takes them from nodes' addresses and --tunnel-peers only; empty for none (IPIP, 6in4 and GRE are always checked); with --source-validation")
	fs.StringSliceVar(&c.Peers, "tunnel-peers", c.Peers,
		"address ranges besides every Node's status addresses that may send encapsulation to this node (tunnel endpoints on other addresses, load balancers delivering IPIP)")
}

func (c *QueueConfiguration) addFlags(fs *pflag.FlagSet) {
	fs.Uint16Var(&c.Num, "queue-num", c.Num, "first NFQUEUE number")
	fs.Uint16Var(&c.Count, "queues", c.Count, "number of NFQUEUE queues, with CPU fanout when more than one; 0: one per CPU")
	fs.StringVar(&c.Variant, "queue-variant", c.Variant, "queue rule: auto (probe the kernel), native (nft queue statement) or xt-compat (xtables NFQUEUE target)")
	fs.Uint32Var(&c.MaxLength, "max-queue-len", c.MaxLength, "kernel queue length per queue")
	fs.Uint32Var(&c.SourceRate, "queue-source-rate", c.SourceRate,
		"queue mode: per source address, at most this many new connections a second are queued; what exceeds it and the burst is dropped in the kernel (the SYN is retransmitted after a second). Keep it below what the node's queues decide a second, or one source can crowd out the others")
	fs.Uint32Var(&c.SourceBurst, "queue-source-burst", c.SourceBurst, "burst of --queue-source-rate")
}

func (c *MetricsConfiguration) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.BindAddress, "metrics-bind-address", c.BindAddress, "address of the Prometheus /metrics endpoint (loopback by default: pods reach the host network's other addresses; see --metrics-auth); empty to disable")
	fs.BoolVar(&c.Profiling, "profiling", c.Profiling, "serve Go's profiles (/debug/pprof/) on the metrics server, behind its address and --metrics-auth: heap, CPU, goroutines")
	fs.StringVar(&c.Auth, "metrics-auth", c.Auth,
		"none: /metrics (and /debug/pprof/) over plain HTTP to whoever reaches --metrics-bind-address (keep it on loopback); "+
			"delegated: HTTPS, and each request needs a bearer token the API server authenticates (TokenReview) and authorizes for the request's path and verb (SubjectAccessReview on nonResourceURLs, e.g. get /metrics)")
	fs.StringVar(&c.TLSCertFile, "metrics-tls-cert-file", c.TLSCertFile, "with --metrics-auth=delegated: the metrics server's certificate (PEM, re-read when it changes); empty: a self-signed one made at start")
	fs.StringVar(&c.TLSPrivateKeyFile, "metrics-tls-private-key-file", c.TLSPrivateKeyFile, "the private key of --metrics-tls-cert-file (PEM)")
}

// AddFlags adds the cost budgets' flags: the agent's, and explain's, whose
// program must reject what the agent's does. A budget is at least 1: a zero,
// negative or malformed one is refused when the flags are parsed, not
// replaced by the default.
func (c *CostBudgets) AddFlags(fs *pflag.FlagSet) {
	fs.Var((*budgetValue)(&c.Policy), "policy-cost-budget",
		"what one NetworkPolicy may make: its entries, the pods its selectors are matched against and its peer sets' elements (docs/security.md); over it, the build stops and the policy is enforced fail-closed (it isolates its pods and allows nothing) and reported")
	fs.Var((*budgetValue)(&c.Namespace), "namespace-cost-budget",
		"what the NetworkPolicies of one namespace may make together, counted as --policy-cost-budget; built in name order, a policy over what its namespace has left is enforced fail-closed and reported")
	fs.Var((*budgetValue)(&c.ClusterPolicy), "cluster-policy-cost-budget",
		"what one ClusterNetworkPolicy may make, counted as --policy-cost-budget (and the nodes its nodes peers are matched against); over it, its Accept rules match nothing and its Deny and Pass rules deny, and it is reported")
}

// nflogFlags names one NFLOG log's flags (name, name-group, ...) and their
// help.
type nflogFlags struct {
	name        string // the flag prefix: "deny-log"
	label       string // "deny log"
	enabledHelp string
	rateHelp    string // the per-source kernel limit's help
	flowKey     string // what one line per interval is counted by
}

func (c *NFLogConfiguration) addFlags(fs *pflag.FlagSet, f nflogFlags) {
	fs.BoolVar(&c.Enabled, f.name, c.Enabled, f.enabledHelp)
	fs.Uint16Var(&c.Group, f.name+"-group", c.Group, "NFLOG group of the "+f.label+" (must not be used by anything else on the node)")
	fs.Uint32Var(&c.KernelRate, f.name+"-kernel-rate", c.KernelRate, f.rateHelp)
	fs.Uint32Var(&c.KernelTotalRate, f.name+"-kernel-total-rate", c.KernelTotalRate, "kernel limit on "+f.label+" messages of all sources, per second (burst twice that)")
	fs.DurationVar(&c.FlowInterval.Duration, f.name+"-flow-interval", c.FlowInterval.Duration, "at most one "+f.label+" line per "+f.flowKey+" in this interval")
	fs.IntVar(&c.LinesPerSecond, f.name+"-lines-per-second", c.LinesPerSecond, "at most this many "+f.label+" lines per second overall")
}

func (c *VerifyConfiguration) addFlags(fs *pflag.FlagSet) {
	fs.Float64Var(&c.Rate, "verify-rate", c.Rate, "runtime verification: the fraction (0 to 1) of the kernel's verdicts on new connections, allowed and denied, that the agent decides again with the policy model, counting and logging any disagreement; 0 (the default) renders nothing")
	fs.Uint16Var(&c.LogGroup, "verify-log-group", c.LogGroup, "NFLOG group of runtime verification's samples (must not be used by anything else on the node)")
	fs.Uint32Var(&c.KernelRate, "verify-kernel-rate", c.KernelRate, "kernel limit on verification samples per source address, per second (burst twice that): a source cannot make the agent decide its every connection")
}

func (c *PodSlicesConfiguration) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.LeaseNamespace, "pod-slices-lease-namespace", c.LeaseNamespace, "namespace of the publisher's Lease (--pod-source slices)")
	fs.StringVar(&c.LeaseName, "pod-slices-lease-name", c.LeaseName, "name of the Lease the publisher renews while its slices are current (its --synced-lease-name; --pod-source slices)")
	fs.DurationVar(&c.StaleAfter.Duration, "pod-slices-stale-after", c.StaleAfter.Duration,
		"when the publisher's Lease was not renewed for this long, or does not exist, the slices are not trusted (a deleted pod's address may have been taken by a new pod) and every Pod is watched until it is renewed again")
	fs.IntVar(&c.MaxSlices, "pod-slices-max-slices", c.MaxSlices, "most PodAddressSlices held; a slice over it is left out (its pods unknown, so held)")
	fs.IntVar(&c.MaxPods, "pod-slices-max-pods", c.MaxPods, "most pod entries held over every PodAddressSlice; a slice over it is left out (its pods unknown, so held)")
}

func (c *UnknownPodsConfiguration) addFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.Enabled, "unknown-pods", c.Enabled, "queue new connections from or to an address in the pod ranges that no known pod holds, until the agent learns the pod (hybrid and queue mode)")
	fs.StringSliceVar(&c.PodCIDRs, "pod-cidrs", c.PodCIDRs, "the cluster's pod address ranges (default: every Node's spec.podCIDRs)")
	fs.DurationVar(&c.Wait.Duration, "unknown-pod-wait", c.Wait.Duration, "how long a connection of an unknown pod waits for the pod to be programmed before --fail-open decides it")
	fs.Uint32Var(&c.SourceRate, "unknown-pod-source-rate", c.SourceRate,
		"per source address, at most this many new connections of unknown pod addresses a second are queued (held until the pod is programmed); what exceeds it, and the burst, is dropped in the kernel")
	fs.Uint32Var(&c.SourceBurst, "unknown-pod-source-burst", c.SourceBurst,
		"burst of --unknown-pod-source-rate; a source holds at most burst + rate * --unknown-pod-wait packets in the queue")
	fs.StringSliceVar(&c.UplinkInterfaces, "uplink-interfaces", c.UplinkInterfaces,
		"the node's uplinks (names, or a prefix and *): without pod ranges (--pod-cidrs, Nodes' spec.podCIDRs) a new connection from an unknown source on a veth, bridge or netkit interface is dropped, except on these (default: the interfaces of the default routes)")
}

func (c *DNSConfiguration) addFlags(fs *pflag.FlagSet) {
	fs.Uint16Var(&c.QueueNum, "dns-queue-num", c.QueueNum, "NFQUEUE holding the DNS queries of pods with domainNames rules (recorded) and the replies to them while their answers are learned; the number after it is its alternate during agent updates. "+
		"Default: right after the connection queues' two ranges, --queue-num plus twice --queues (102 and 103 with one queue)")
	fs.StringSliceVar(&c.Servers, "dns-servers", c.Servers, "addresses or CIDRs of DNS servers whose replies may be learned, besides the endpoints of --dns-service")
	fs.StringVar(&c.Service, "dns-service", c.Service, "namespace/name of the cluster DNS Service: replies from its endpoints (EndpointSlices) may be learned; empty to trust only --dns-servers")
	fs.DurationVar(&c.MinTTL.Duration, "fqdn-min-ttl", c.MinTTL.Duration, "a learned address is admitted for at least this long, whatever the answer's TTL")
	fs.DurationVar(&c.MaxTTL.Duration, "fqdn-max-ttl", c.MaxTTL.Duration, "a learned address is admitted for at most this long, whatever the answer's TTL")
	fs.IntVar(&c.MaxNamesPerPod, "fqdn-max-names-per-pod", c.MaxNamesPerPod, "learned names kept per pod; past it the names learned least recently are evicted (their addresses denied until looked up again) and counted in nftpolicy_dns_learned_evictions_total")
	fs.IntVar(&c.MaxAddressesPerPod, "fqdn-max-addresses-per-pod", c.MaxAddressesPerPod, "learned name-address pairs kept per pod; past it the names learned least recently are evicted, as with --fqdn-max-names-per-pod")
	fs.DurationVar(&c.QueryTimeout.Duration, "dns-query-timeout", c.QueryTimeout.Duration, "a pod's DNS query waits this long for its reply: only a reply that answers an outstanding query of the pod is learned. "+
		"Above the pods' resolver timeout (glibc and Go: 5 s a try) a reply the resolver no longer reads could be learned; below it a slow server's answers are not")
}

// budgetValue is a cost budget flag: a whole number of at least 1.
type budgetValue int

func (v *budgetValue) String() string { return strconv.Itoa(int(*v)) }

func (v *budgetValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("not a whole number")
	}
	if n < 1 {
		return fmt.Errorf("a budget is at least 1")
	}
	*v = budgetValue(n)
	return nil
}

func (v *budgetValue) Type() string { return "int" }

// portsValue is a list of UDP ports: comma-separated, given once or more;
// an empty value is no ports (not the default).
type portsValue struct {
	ports   *[]uint16
	changed bool
}

func (v *portsValue) String() string {
	if v.ports == nil {
		return ""
	}
	s := make([]string, len(*v.ports))
	for i, p := range *v.ports {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

func (v *portsValue) Set(s string) error {
	ports := []uint16{}
	if strings.TrimSpace(s) != "" {
		for _, f := range strings.Split(s, ",") {
			p, err := strconv.ParseUint(strings.TrimSpace(f), 10, 16)
			if err != nil || p == 0 {
				return fmt.Errorf("%q is no port (1-65535)", f)
			}
			ports = append(ports, uint16(p))
		}
	}
	if v.changed {
		ports = append(*v.ports, ports...)
	}
	*v.ports, v.changed = ports, true
	return nil
}

func (v *portsValue) Type() string { return "ports" }
