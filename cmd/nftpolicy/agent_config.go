package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/config"
)

// addFlags adds the agent's flags to fs: the settings of o.cfg (its values
// are the flags' defaults) and the flags only the command line gives.
func (o *agentOptions) addFlags(fs *pflag.FlagSet) {
	if o.cfg == nil {
		o.cfg = config.Default()
	}
	fs.StringVar(&o.configFile, "config", o.configFile, "AgentConfiguration file (nftpolicy.io/v1alpha1, docs/config.md); a flag given on the command line overrides its setting")
	fs.StringVar(&o.hostname, "hostname-override", o.hostname, "this node's name (default: $NODE_NAME, else the host name)")
	fs.StringSliceVar(&o.nodeIPs, "node-ip", o.nodeIPs, "this node's addresses (default: from the Node object)")
	fs.StringVar(&o.uninstall.podName, "pod-name", os.Getenv("POD_NAME"), "the agent's pod (default: $POD_NAME, from the downward API), whose DaemonSet the agent watches")
	fs.StringVar(&o.uninstall.podNamespace, "pod-namespace", os.Getenv("POD_NAMESPACE"), "the agent's pod's namespace (default: $POD_NAMESPACE)")
	o.uninstall.cni.addFlags(fs, "", "")
	o.cfg.AddFlags(fs)
}

// parseAgentArgs parses the agent's command line into o: the defaults,
// then the --config file's settings over them, then the flags given on the
// command line over both; then validates the result (config.Validate) and
// fills in o's parts from it. ok is false with the exit status when the
// agent must not start (help, or bad input, said on stderr).
func parseAgentArgs(o *agentOptions, args []string, stderr io.Writer, usage string) (int, bool) {
	newFS := func() *pflag.FlagSet {
		fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
		fs.SetOutput(stderr)
		o.addFlags(fs)
		return fs
	}
	if code, ok := parseFlags(newFS(), args, stderr, usage); !ok {
		return code, false
	}
	if o.configFile != "" {
		c, err := config.Load(o.configFile)
		if err != nil {
			fmt.Fprintf(stderr, "nftpolicy: --config: %v\n", err)
			return exitBadInput, false
		}
		// The command line again, over the file: what it names wins.
		o.cfg = c
		if code, ok := parseFlags(newFS(), args, stderr, usage); !ok {
			return code, false
		}
	}
	if err := o.cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "nftpolicy: invalid configuration:\n%v\n", err)
		return exitBadInput, false
	}
	o.applyConfig()
	return exitOK, true
}

// applyConfig fills in the agent's parts from o.cfg, the effective
// configuration.
func (o *agentOptions) applyConfig() {
	c := o.cfg
	o.kubeconfig, o.podCompress, o.mode, o.failOpen, o.sourceValid = c.Kubeconfig, c.PodWatchCompression, c.Mode, c.FailOpen, c.SourceValidation
	o.tunnel = tunnelOptions{udpPorts: c.Tunnel.UDPPorts, peers: c.Tunnel.Peers}
	o.queueNum, o.queues, o.queueVariant, o.maxQueueLen = c.Queue.Num, c.Queue.Count, c.Queue.Variant, c.Queue.MaxLength
	o.queueSourceRate, o.queueSourceBurst, o.allowMark = c.Queue.SourceRate, c.Queue.SourceBurst, c.AllowMark
	o.metricsAddr, o.profiling, o.healthAddr = c.Metrics.BindAddress, c.Metrics.Profiling, c.HealthBindAddress
	o.serving = servingOptions{metricsAuth: c.Metrics.Auth, certFile: c.Metrics.TLSCertFile, keyFile: c.Metrics.TLSPrivateKeyFile}
	o.fullSyncPeriod, o.refreshDelay = c.FullSyncPeriod.Duration, c.ProgramRefreshDelay.Duration
	o.budgets = compile.Budgets{Policy: c.CostBudgets.Policy, Namespace: c.CostBudgets.Namespace, ClusterPolicy: c.CostBudgets.ClusterPolicy}
	o.cnpCheck, o.livenessBudget = c.ClusterPolicyCheckPeriod.Duration, c.LivenessTimeout.Duration
	o.logs = &c.Logging
	o.denyLog.nflogLogOptions = nflogOptions(c.DenyLog)
	o.stagedLog.nflogLogOptions = nflogOptions(c.StagedLog)
	o.verify = verifyOptions{rate: c.Verify.Rate, group: c.Verify.LogGroup, kernelRate: c.Verify.KernelRate}
	n := &o.newPod
	n.unknownPods, n.podCIDRs, n.wait, n.uplinks = c.UnknownPods.Enabled, c.UnknownPods.PodCIDRs, c.UnknownPods.Wait.Duration, c.UnknownPods.UplinkInterfaces
	n.sourceRate, n.sourceBurst, n.revoke = c.UnknownPods.SourceRate, c.UnknownPods.SourceBurst, c.RevokeConnections
	f := &o.fqdn
	f.queueNum, f.servers, f.service, f.minTTL, f.maxTTL = c.DNS.QueueNum, c.DNS.Servers, c.DNS.Service, c.DNS.MinTTL.Duration, c.DNS.MaxTTL.Duration
	f.maxNames, f.maxAddrs, f.queryTimeout = c.DNS.MaxNamesPerPod, c.DNS.MaxAddressesPerPod, c.DNS.QueryTimeout.Duration
	o.state.dir, o.status.report, o.preview.socket = c.StateDir, c.ReportStatus, c.PreviewSocket
	o.uninstall.enabled, o.watch.enabled = c.RemoveOnUninstall, c.WatchTable
}

func nflogOptions(c config.NFLogConfiguration) nflogLogOptions {
	return nflogLogOptions{enabled: c.Enabled, group: c.Group, kernelRate: c.KernelRate, totalRate: c.KernelTotalRate,
		flowInterval: c.FlowInterval.Duration, linesPerSec: c.LinesPerSecond}
}

// configzHandler serves c, the effective configuration, as JSON on GET
// /configz (as kube-proxy and the kubelet do): an operator or a test reads
// what the agent runs with after defaults, file and flags. It is on the
// health port, which every pod of the node reaches: the configuration
// holds settings and file paths, never a key or a token (docs/security.md).
func configzHandler(c *config.AgentConfiguration) (http.Handler, error) {
	body, err := effectiveConfigJSON(c)
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}), nil
}

// effectiveConfigJSON is the effective configuration as /configz serves it
// and the agent logs it at start: the settings only (no identity flags, no
// secrets: the configuration names files, it holds no key or token).
func effectiveConfigJSON(c *config.AgentConfiguration) ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encoding the configuration: %w", err)
	}
	return b, nil
}
