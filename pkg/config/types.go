package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// GroupName and Version name the configuration's API; Kind is its kind.
const (
	GroupName = "nftpolicy.io"
	Version   = "v1alpha1"
	Kind      = "AgentConfiguration"
)

// APIVersion is the apiVersion a configuration file carries.
const APIVersion = GroupName + "/" + Version

// AgentConfiguration is the configuration of `nftpolicy agent`, read from
// the file --config names (install.yaml's ConfigMap). Every field is
// optional: an absent field keeps its default. A flag given on the command
// line overrides the file's value. A field's `flag` tag names the flag that
// sets it.
type AgentConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	// Kubeconfig is the kubeconfig file of the agent's API client; empty:
	// the in-cluster configuration (the pod's ServiceAccount).
	Kubeconfig string `json:"kubeconfig" flag:"kubeconfig"`
	// PodWatchCompression lets the API server gzip the pod watch, whose
	// initial events are every pod of the cluster: less network at the cost
	// of the API server's and the agent's CPU (at 100k pods, compressing and
	// decompressing cost more than decoding).
	PodWatchCompression bool `json:"podWatchCompression" flag:"pod-watch-compression"`
	// PodSource is where the agent learns other nodes' pods: pods (it
	// watches every Pod of the cluster) or slices (the PodAddressSlices
	// that `nftpolicy publish` writes, and the node's own Pods; every Pod
	// again while the publisher's Lease is stale: docs/scale-out.md).
	PodSource string `json:"podSource" flag:"pod-source"`
	// PodSlices configures podSource slices.
	PodSlices PodSlicesConfiguration `json:"podSlices"`
	// Mode is how connections are decided: hybrid (the kernel decides,
	// userspace only what it cannot), queue (userspace decides every new
	// connection of policy-selected pods) or kernel (never queue).
	Mode string `json:"mode" flag:"mode"`
	// FailOpen lets queued packets through while no agent listens on the
	// queue (the queue rule's bypass), and allows a connection of an unknown
	// pod address when the pod is not programmed within
	// unknownPods.wait; false drops them. A full queue always drops.
	FailOpen bool `json:"failOpen" flag:"fail-open"`
	// SourceValidation drops packets that come in on a pod interface (veth,
	// bridge or netkit) with a source address the node does not route back
	// through it (spoofed), and encapsulated packets (IPIP, 6in4, GRE,
	// tunnel.udpPorts) that pods send to nodes or that come to this node
	// from anything but a node. False for CNIs that already stop both.
	SourceValidation bool `json:"sourceValidation" flag:"source-validation"`
	// AllowMark is the packet and conntrack mark bit owned by nftpolicy; it
	// must not collide with kube-proxy's 0x4000/0x8000 or the CNI's.
	AllowMark uint32 `json:"allowMark" flag:"allow-mark"`
	// Tunnel is the check of overlay encapsulation sent to this node.
	Tunnel TunnelConfiguration `json:"tunnel"`
	// Queue is the NFQUEUE queues that hold the connections userspace
	// decides.
	Queue QueueConfiguration `json:"queue"`
	// Metrics is the Prometheus endpoint and its protection.
	Metrics MetricsConfiguration `json:"metrics"`
	// HealthBindAddress is the address of /healthz, /readyz and /configz
	// (the kubelet probes the node's address); empty disables them.
	HealthBindAddress string `json:"healthBindAddress" flag:"health-bind-address"`
	// LivenessTimeout: /healthz fails when the agent made no progress (sync
	// loop, or waiting for the API's first lists) for this long; at least
	// 3s (the agent's heartbeat is every second).
	LivenessTimeout metav1.Duration `json:"livenessTimeout" flag:"liveness-timeout"`
	// FullSyncPeriod is how often the whole table is rewritten, repairing
	// outside changes.
	FullSyncPeriod metav1.Duration `json:"fullSyncPeriod" flag:"full-sync-period"`
	// ProgramRefreshDelay: in hybrid mode policy changes reach the kernel
	// at once through the incremental compiler; the program that explain
	// and the queue's evaluator read is rebuilt this long after (at least
	// twice the last build's duration). Pod changes derive their program
	// right after their transaction.
	ProgramRefreshDelay metav1.Duration `json:"programRefreshDelay" flag:"program-refresh-delay"`
	// ClusterPolicyCheckPeriod is how often the agent checks whether the
	// ClusterNetworkPolicy API (its CRD) is served; ClusterNetworkPolicies
	// are enforced from when it appears until it is removed.
	ClusterPolicyCheckPeriod metav1.Duration `json:"clusterPolicyCheckPeriod" flag:"cluster-policy-check-period"`
	// CostBudgets bound what one policy, or one namespace's policies, may
	// make (docs/security.md).
	CostBudgets CostBudgets `json:"costBudgets"`
	// DenyLog is the log of the connections the kernel path denies.
	DenyLog NFLogConfiguration `json:"denyLog" flag:"deny-log"`
	// StagedLog is the log of the new connections whose verdict staged
	// policies (nftpolicy.io/staged) would change.
	StagedLog NFLogConfiguration `json:"stagedLog" flag:"staged-log"`
	// Verify is runtime verification: the agent decides a sample of the
	// kernel's verdicts again with the policy model.
	Verify VerifyConfiguration `json:"verify"`
	// UnknownPods is the handling of connections of pod addresses the agent
	// does not know yet.
	UnknownPods UnknownPodsConfiguration `json:"unknownPods"`
	// RevokeConnections: after a policy change, delete the conntrack entries
	// of the connections it denies (ctnetlink).
	RevokeConnections bool `json:"revokeConnections" flag:"revoke-connections"`
	// DNS is the learning of domainNames peers' addresses from DNS replies.
	DNS DNSConfiguration `json:"dns"`
	// StateDir is a directory on the node (a tmpfs such as /run/nftpolicy)
	// for the snapshot of the policy program in force: a restarted agent
	// decides queued connections from it until its first sync, instead of
	// dropping them; empty disables the snapshot.
	StateDir string `json:"stateDir" flag:"state-dir"`
	// ReportStatus keeps this node's NodeEnforcement (nftpolicy.io/v1alpha1)
	// current: which policy changes its kernel enforces, for `kubectl
	// nftpolicy status` and `wait`; false: no NodeEnforcement writes (say,
	// without the CustomResourceDefinition).
	ReportStatus bool `json:"reportStatus" flag:"report-status"`
	// PreviewSocket is the unix socket (mode 0600) on which `nftpolicy
	// preview --local`, run in the agent's container, asks which live
	// connections a policy change would cut or allow; put it in a directory
	// only the agent's pod sees. Empty: no preview.
	PreviewSocket string `json:"previewSocket" flag:"preview-socket"`
	// RemoveOnUninstall: when the agent's DaemonSet is deleted (not
	// updated), remove the nftables table and its queue rules before
	// exiting, so that no node goes on sending new connections to a queue
	// nobody reads; needs the pod's name and namespace (--pod-name,
	// --pod-namespace).
	RemoveOnUninstall bool `json:"removeOnUninstall" flag:"remove-on-uninstall"`
	// WatchTable repairs changes other processes make to table inet
	// nftpolicy (nft flush ruleset, a firewall service's reload) as soon as
	// the kernel reports them, rather than at the next full sync.
	WatchTable bool `json:"watchTable" flag:"watch-table"`
	// Logging is the log's format and verbosity: Kubernetes' component-base
	// LoggingConfiguration (format, verbosity, vmodule, flushFrequency,
	// options), whose flags are --logging-format, -v, --vmodule and
	// --log-flush-frequency.
	Logging logsapi.LoggingConfiguration `json:"logging"`
}

// TunnelConfiguration is the tunnel check (pkg/compile render_source.go):
// which UDP ports are overlay encapsulation, and which sources besides the
// Nodes' addresses may send it to this node.
type TunnelConfiguration struct {
	// UDPPorts are the UDP ports of overlay encapsulation (VXLAN 4789 and
	// Flannel's 8472, Geneve 6081): pods may not send them to nodes, and
	// this node takes them from nodes' addresses and tunnel.peers only.
	// Empty for none (IPIP, 6in4 and GRE are always checked); with
	// sourceValidation.
	UDPPorts []uint16 `json:"udpPorts" flag:"tunnel-udp-ports"`
	// Peers are address ranges (or single addresses) besides every Node's
	// status addresses that may send encapsulation to this node (tunnel
	// endpoints on other addresses, load balancers delivering IPIP).
	Peers []string `json:"peers" flag:"tunnel-peers"`
}

// QueueConfiguration is the NFQUEUE queues of the connections userspace
// decides.
type QueueConfiguration struct {
	// Num is the first NFQUEUE number.
	Num uint16 `json:"num" flag:"queue-num"`
	// Count is the number of NFQUEUE queues, with CPU fanout when more than
	// one; 0: one per CPU.
	Count uint16 `json:"count" flag:"queues"`
	// Variant is the queue rule: auto (probe the kernel), native (nft queue
	// statement) or xt-compat (xtables NFQUEUE target).
	Variant string `json:"variant" flag:"queue-variant"`
	// MaxLength is the kernel queue length per queue.
	MaxLength uint32 `json:"maxLength" flag:"max-queue-len"`
	// SourceRate: in queue mode, per source address, at most this many new
	// connections a second are queued; what exceeds it and the burst is
	// dropped in the kernel (the SYN is retransmitted after a second). Keep
	// it below what the node's queues decide a second, or one source can
	// crowd out the others.
	SourceRate uint32 `json:"sourceRate" flag:"queue-source-rate"`
	// SourceBurst is the burst of queue.sourceRate.
	SourceBurst uint32 `json:"sourceBurst" flag:"queue-source-burst"`
}

// MetricsConfiguration is the Prometheus endpoint and its protection.
type MetricsConfiguration struct {
	// BindAddress is the address of /metrics (loopback by default: pods
	// reach the host network's other addresses; see auth); empty disables
	// it.
	BindAddress string `json:"bindAddress" flag:"metrics-bind-address"`
	// Auth is the endpoint's protection: none (plain HTTP to whoever
	// reaches metrics.bindAddress: keep it on loopback) or delegated (HTTPS, and each request needs a bearer token
	// the API server authenticates with a TokenReview and authorizes for the
	// request's path and verb with a SubjectAccessReview on
	// nonResourceURLs, e.g. get /metrics).
	Auth string `json:"auth" flag:"metrics-auth"`
	// TLSCertFile is, with metrics.auth delegated, the metrics server's certificate
	// (PEM, re-read when it changes); empty: a self-signed one made at
	// start.
	TLSCertFile string `json:"tlsCertFile" flag:"metrics-tls-cert-file"`
	// TLSPrivateKeyFile is the private key of metrics.tlsCertFile (PEM). The
	// configuration holds its path, never the key.
	TLSPrivateKeyFile string `json:"tlsPrivateKeyFile" flag:"metrics-tls-private-key-file"`
	// Profiling serves Go's profiles (/debug/pprof/: heap, CPU, goroutines)
	// on the metrics server, behind its address and auth.
	Profiling bool `json:"profiling" flag:"profiling"`
}

// CostBudgets bound the work policies make; each is at least 1.
type CostBudgets struct {
	// Policy is what one NetworkPolicy may make: its entries, the pods its
	// selectors are matched against and its peer sets' elements. Over it,
	// the build stops and the policy is enforced fail-closed (it isolates
	// its pods and allows nothing) and reported.
	Policy int `json:"policy" flag:"policy-cost-budget"`
	// Namespace is what the NetworkPolicies of one namespace may make
	// together, counted as policy; built in name order, a policy over what
	// its namespace has left is enforced fail-closed and reported.
	Namespace int `json:"namespace" flag:"namespace-cost-budget"`
	// ClusterPolicy is what one ClusterNetworkPolicy may make, counted as
	// policy (and the nodes its nodes peers are matched against); over it,
	// its Accept rules match nothing and its Deny and Pass rules deny, and
	// it is reported.
	ClusterPolicy int `json:"clusterPolicy" flag:"cluster-policy-cost-budget"`
}

// NFLogConfiguration is a log the agent reads from an NFLOG group and
// writes as lines: the deny log and the staged log. The flags are the
// log's flag (--deny-log, --staged-log) followed by the suffix in each
// field's flag tag.
type NFLogConfiguration struct {
	// Enabled turns the log on.
	Enabled bool `json:"enabled" flag:""`
	// Group is the log's NFLOG group (must not be used by anything else on
	// the node).
	Group uint16 `json:"group" flag:"-group"`
	// KernelRate is the kernel's limit on the log's messages per source
	// address, per second (burst twice that): one pod's traffic cannot
	// crowd out another's.
	KernelRate uint32 `json:"kernelRate" flag:"-kernel-rate"`
	// KernelTotalRate is the kernel's limit on the log's messages of all
	// sources, per second (burst twice that).
	KernelTotalRate uint32 `json:"kernelTotalRate" flag:"-kernel-total-rate"`
	// FlowInterval: at most one line per flow (source, destination, and the
	// policy or port) in this interval.
	FlowInterval metav1.Duration `json:"flowInterval" flag:"-flow-interval"`
	// LinesPerSecond: at most this many lines per second overall.
	LinesPerSecond int `json:"linesPerSecond" flag:"-lines-per-second"`
}

// VerifyConfiguration is runtime verification.
type VerifyConfiguration struct {
	// Rate is the fraction (0 to 1) of the kernel's verdicts on new
	// connections, allowed and denied, that the agent decides again with
	// the policy model, counting and logging any disagreement; 0 renders
	// nothing.
	Rate float64 `json:"rate" flag:"verify-rate"`
	// LogGroup is the NFLOG group of the samples (must not be used by
	// anything else on the node).
	LogGroup uint16 `json:"logGroup" flag:"verify-log-group"`
	// KernelRate is the kernel's limit on samples per source address, per
	// second (burst twice that): a source cannot make the agent decide its
	// every connection.
	KernelRate uint32 `json:"kernelRate" flag:"verify-kernel-rate"`
}

// UnknownPodsConfiguration is the handling of connections from or to
// addresses in the pod ranges that no known pod holds.
type UnknownPodsConfiguration struct {
	// Enabled queues new connections from or to an address in the pod
	// ranges that no known pod holds, until the agent learns the pod (hybrid
	// and queue mode).
	Enabled bool `json:"enabled" flag:"unknown-pods"`
	// PodCIDRs are the cluster's pod address ranges; empty: every Node's
	// spec.podCIDRs.
	PodCIDRs []string `json:"podCIDRs" flag:"pod-cidrs"`
	// Wait is how long a connection of an unknown pod waits for the pod to
	// be programmed before failOpen decides it.
	Wait metav1.Duration `json:"wait" flag:"unknown-pod-wait"`
	// SourceRate: per source address, at most this many new connections of
	// unknown pod addresses a second are queued (held until the pod is
	// programmed); what exceeds it, and the burst, is dropped in the kernel.
	SourceRate uint32 `json:"sourceRate" flag:"unknown-pod-source-rate"`
	// SourceBurst is the burst of unknownPods.sourceRate; a source holds at
	// most burst + rate * unknownPods.wait packets in the queue.
	SourceBurst uint32 `json:"sourceBurst" flag:"unknown-pod-source-burst"`
	// UplinkInterfaces are the node's uplinks (names, or a prefix and *):
	// without pod ranges a new connection from an unknown source on a veth,
	// bridge or netkit interface is dropped, except on these. Empty: the
	// interfaces of the default routes.
	UplinkInterfaces []string `json:"uplinkInterfaces" flag:"uplink-interfaces"`
}

// PodSlicesConfiguration is the reading of PodAddressSlices (podSource
// slices).
type PodSlicesConfiguration struct {
	// LeaseNamespace is the namespace of the publisher's Lease.
	LeaseNamespace string `json:"leaseNamespace" flag:"pod-slices-lease-namespace"`
	// LeaseName is the name of the Lease the publisher's leader renews
	// only while its slices are current (not the leader election's).
	LeaseName string `json:"leaseName" flag:"pod-slices-lease-name"`
	// StaleAfter: when the Lease was not renewed for this long, or does
	// not exist, the slices are not trusted (a deleted pod's address may
	// have been taken by a new pod) and the agent watches every Pod until
	// it is renewed again.
	StaleAfter metav1.Duration `json:"staleAfter" flag:"pod-slices-stale-after"`
	// MaxSlices is the most slices held; a slice over it is left out (its
	// pods unknown, so held).
	MaxSlices int `json:"maxSlices" flag:"pod-slices-max-slices"`
	// MaxPods is the most pod entries held over every slice; a slice over
	// it is left out (its pods unknown, so held).
	MaxPods int `json:"maxPods" flag:"pod-slices-max-pods"`
}

// DNSConfiguration is the learning of domainNames peers' addresses.
type DNSConfiguration struct {
	// QueueNum is the NFQUEUE holding the DNS queries of pods with
	// domainNames rules and the replies to them while their answers are
	// learned; the number after it is its alternate during agent updates.
	// 0: right after the connection queues' two ranges, queue.num plus
	// twice queue.count (102 and 103 with one queue).
	QueueNum uint16 `json:"queueNum" flag:"dns-queue-num"`
	// Servers are addresses or CIDRs of DNS servers whose replies may be
	// learned, besides the endpoints of dns.service.
	Servers []string `json:"servers" flag:"dns-servers"`
	// Service is the namespace/name of the cluster DNS Service: replies from
	// its endpoints (EndpointSlices) may be learned; empty to trust only
	// dns.servers.
	Service string `json:"service" flag:"dns-service"`
	// MinTTL: a learned address is admitted for at least this long, whatever
	// the answer's TTL.
	MinTTL metav1.Duration `json:"minTTL" flag:"fqdn-min-ttl"`
	// MaxTTL: a learned address is admitted for at most this long, whatever
	// the answer's TTL.
	MaxTTL metav1.Duration `json:"maxTTL" flag:"fqdn-max-ttl"`
	// MaxNamesPerPod is the learned names kept per pod; past it the names
	// learned least recently are evicted (their addresses denied until
	// looked up again) and counted in nftpolicy_dns_learned_evictions_total.
	MaxNamesPerPod int `json:"maxNamesPerPod" flag:"fqdn-max-names-per-pod"`
	// MaxAddressesPerPod is the learned name-address pairs kept per pod;
	// past it the names learned least recently are evicted, as with
	// dns.maxNamesPerPod.
	MaxAddressesPerPod int `json:"maxAddressesPerPod" flag:"fqdn-max-addresses-per-pod"`
	// QueryTimeout is how long a pod's DNS query waits for its reply: only a
	// reply that answers an outstanding query of the pod is learned. Above
	// the pods' resolver timeout (glibc and Go: 5s a try) a reply the
	// resolver no longer reads could be learned; below it a slow server's
	// answers are not.
	QueryTimeout metav1.Duration `json:"queryTimeout" flag:"dns-query-timeout"`
}
