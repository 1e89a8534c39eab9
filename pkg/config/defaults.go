package config

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// NFLOG groups of the agent's logs by default (pkg/denylog, pkg/staged,
// pkg/verify use the same numbers).
const (
	DefaultDenyLogGroup   = 100
	DefaultStagedLogGroup = DefaultDenyLogGroup + 1
	DefaultVerifyLogGroup = 102
)

// Default returns the agent's configuration with every default: what an
// agent without --config and flags runs with. Flags take their defaults from
// it, and a file is decoded over it, so an absent field keeps its default.
func Default() *AgentConfiguration {
	c := &AgentConfiguration{
		TypeMeta:  metav1.TypeMeta{APIVersion: APIVersion, Kind: Kind},
		Mode:      "hybrid",
		PodSource: "pods",
		PodSlices: PodSlicesConfiguration{LeaseNamespace: "kube-system", LeaseName: "nftpolicy-publisher-synced",
			StaleAfter: metav1.Duration{Duration: 45 * time.Second}, MaxSlices: 300_000, MaxPods: 300_000},
		SourceValidation: true,
		AllowMark:        0x00100000,
		Tunnel:           TunnelConfiguration{UDPPorts: []uint16{4789, 6081, 8472}},
		Queue: QueueConfiguration{Num: 100, Count: 0, Variant: "auto", MaxLength: 4096,
			SourceRate: 30000, SourceBurst: 512},
		Metrics:                  MetricsConfiguration{BindAddress: "127.0.0.1:9402", Auth: MetricsAuthNone},
		HealthBindAddress:        ":9403",
		LivenessTimeout:          metav1.Duration{Duration: 30 * time.Second},
		FullSyncPeriod:           metav1.Duration{Duration: 10 * time.Minute},
		ProgramRefreshDelay:      metav1.Duration{Duration: 100 * time.Millisecond},
		ClusterPolicyCheckPeriod: metav1.Duration{Duration: 30 * time.Second},
		CostBudgets:              CostBudgets{Policy: 1_000_000, Namespace: 4_000_000, ClusterPolicy: 4_000_000},
		DenyLog:                  defaultNFLog(DefaultDenyLogGroup),
		StagedLog:                defaultNFLog(DefaultStagedLogGroup),
		Verify:                   VerifyConfiguration{LogGroup: DefaultVerifyLogGroup, KernelRate: 20},
		UnknownPods: UnknownPodsConfiguration{Enabled: true, Wait: metav1.Duration{Duration: 2 * time.Second},
			SourceRate: 64, SourceBurst: 128},
		RevokeConnections: true,
		DNS: DNSConfiguration{Service: "kube-system/kube-dns", MinTTL: metav1.Duration{Duration: 5 * time.Second},
			MaxTTL: metav1.Duration{Duration: time.Hour}, MaxNamesPerPod: 512, MaxAddressesPerPod: 2048,
			QueryTimeout: metav1.Duration{Duration: 10 * time.Second}},
		ReportStatus:      true,
		RemoveOnUninstall: true,
		WatchTable:        true,
	}
	c.Logging = *logsapi.NewLoggingConfiguration()
	return c
}

func defaultNFLog(group uint16) NFLogConfiguration {
	return NFLogConfiguration{Enabled: true, Group: group, KernelRate: 5, KernelTotalRate: 200,
		FlowInterval: metav1.Duration{Duration: 30 * time.Second}, LinesPerSecond: 50}
}
