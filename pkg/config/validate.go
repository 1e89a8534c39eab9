package config

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// Values of AgentConfiguration.Metrics.Auth.
const (
	MetricsAuthNone      = "none"
	MetricsAuthDelegated = "delegated"
)

// MinLivenessTimeout is the shortest liveness timeout: three of the
// agent's one-second heartbeats.
const MinLivenessTimeout = 3 * time.Second

// Validate checks c, whether its values came from a file, flags or both:
// the one place a setting's bounds are checked before the agent starts. Its
// error names each bad setting by its path in the file and its flag.
func (c *AgentConfiguration) Validate() error {
	var errs field.ErrorList
	errs = append(errs, validateEnums(c)...)
	errs = append(errs, validateNumbers(c)...)
	errs = append(errs, validateAddresses(c)...)
	errs = append(errs, validateDurations(c)...)
	errs = append(errs, logsapi.Validate(&c.Logging, nil, field.NewPath("logging"))...)
	return withFlags(errs)
}

// withFlags joins errs, each with its setting's flag after its path.
func withFlags(errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		if f := FlagOf(e.Field); f != "" {
			e = &field.Error{Type: e.Type, Field: e.Field + " (--" + f + ")", BadValue: e.BadValue, Detail: e.Detail}
		}
		out[i] = e
	}
	return errors.Join(out...)
}

func validateEnums(c *AgentConfiguration) field.ErrorList {
	var errs field.ErrorList
	if !oneOf(c.Mode, "hybrid", "queue", "kernel") {
		errs = append(errs, field.NotSupported(field.NewPath("mode"), c.Mode, []string{"hybrid", "queue", "kernel"}))
	}
	if !oneOf(c.PodSource, "pods", "slices") {
		errs = append(errs, field.NotSupported(field.NewPath("podSource"), c.PodSource, []string{"pods", "slices"}))
	}
	if !oneOf(c.Queue.Variant, "auto", "native", "xt-compat") {
		errs = append(errs, field.NotSupported(field.NewPath("queue", "variant"), c.Queue.Variant, []string{"auto", "native", "xt-compat"}))
	}
	m := field.NewPath("metrics")
	switch c.Metrics.Auth {
	case MetricsAuthNone:
		if c.Metrics.TLSCertFile != "" || c.Metrics.TLSPrivateKeyFile != "" {
			errs = append(errs, field.Forbidden(m.Child("tlsCertFile"), "a certificate and key need metrics.auth delegated"))
		}
	case MetricsAuthDelegated:
		if (c.Metrics.TLSCertFile == "") != (c.Metrics.TLSPrivateKeyFile == "") {
			errs = append(errs, field.Invalid(m.Child("tlsPrivateKeyFile"), c.Metrics.TLSPrivateKeyFile, "give both tlsCertFile and tlsPrivateKeyFile, or neither"))
		}
	default:
		errs = append(errs, field.NotSupported(m.Child("auth"), c.Metrics.Auth, []string{MetricsAuthNone, MetricsAuthDelegated}))
	}
	return errs
}

func validateNumbers(c *AgentConfiguration) field.ErrorList {
	var errs field.ErrorList
	positive := func(p *field.Path, v int64) {
		if v < 1 {
			errs = append(errs, field.Invalid(p, v, "must be at least 1"))
		}
	}
	notNegative := func(p *field.Path, v int64) {
		if v < 0 {
			errs = append(errs, field.Invalid(p, v, "must not be negative"))
		}
	}
	b := field.NewPath("costBudgets")
	positive(b.Child("policy"), int64(c.CostBudgets.Policy))
	positive(b.Child("namespace"), int64(c.CostBudgets.Namespace))
	positive(b.Child("clusterPolicy"), int64(c.CostBudgets.ClusterPolicy))
	q := field.NewPath("queue")
	positive(q.Child("sourceRate"), int64(c.Queue.SourceRate))
	positive(q.Child("sourceBurst"), int64(c.Queue.SourceBurst))
	ps := field.NewPath("podSlices")
	positive(ps.Child("maxSlices"), int64(c.PodSlices.MaxSlices))
	positive(ps.Child("maxPods"), int64(c.PodSlices.MaxPods))
	positive(ps.Child("staleAfter"), int64(c.PodSlices.StaleAfter.Duration))
	if c.PodSource == "slices" && (c.PodSlices.LeaseName == "" || c.PodSlices.LeaseNamespace == "") {
		errs = append(errs, field.Required(ps.Child("leaseName"), "podSource slices reads the publisher's Lease"))
	}
	u := field.NewPath("unknownPods")
	positive(u.Child("sourceRate"), int64(c.UnknownPods.SourceRate))
	positive(u.Child("sourceBurst"), int64(c.UnknownPods.SourceBurst))
	for i, p := range c.Tunnel.UDPPorts {
		if p == 0 {
			errs = append(errs, field.Invalid(field.NewPath("tunnel", "udpPorts").Index(i), p, "a port is 1-65535"))
		}
	}
	for name, l := range map[string]NFLogConfiguration{"denyLog": c.DenyLog, "stagedLog": c.StagedLog} {
		notNegative(field.NewPath(name, "linesPerSecond"), int64(l.LinesPerSecond))
	}
	d := field.NewPath("dns")
	notNegative(d.Child("maxNamesPerPod"), int64(c.DNS.MaxNamesPerPod))
	notNegative(d.Child("maxAddressesPerPod"), int64(c.DNS.MaxAddressesPerPod))
	v := field.NewPath("verify")
	if r := c.Verify.Rate; math.IsNaN(r) || r < 0 || r > 1 {
		errs = append(errs, field.Invalid(v.Child("rate"), r, "a fraction from 0 to 1"))
	} else if r > 0 && c.Verify.LogGroup == 0 {
		errs = append(errs, field.Invalid(v.Child("logGroup"), 0, "must not be 0 with verify.rate"))
	}
	return errs
}

func validateAddresses(c *AgentConfiguration) field.ErrorList {
	var errs field.ErrorList
	for i, s := range c.Tunnel.Peers {
		if !isPrefixOrAddr(s) {
			errs = append(errs, field.Invalid(field.NewPath("tunnel", "peers").Index(i), s, "neither an address nor a CIDR"))
		}
	}
	for i, s := range c.DNS.Servers {
		if !isPrefixOrAddr(s) {
			errs = append(errs, field.Invalid(field.NewPath("dns", "servers").Index(i), s, "neither an address nor a CIDR"))
		}
	}
	for i, s := range c.UnknownPods.PodCIDRs {
		if _, err := netip.ParsePrefix(strings.TrimSpace(s)); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("unknownPods", "podCIDRs").Index(i), s, "not a CIDR"))
		}
	}
	if s := c.DNS.Service; s != "" {
		if ns, name, ok := strings.Cut(s, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			errs = append(errs, field.Invalid(field.NewPath("dns", "service"), s, "want namespace/name"))
		}
	}
	return errs
}

func validateDurations(c *AgentConfiguration) field.ErrorList {
	var errs field.ErrorList
	positive := func(p *field.Path, d time.Duration) {
		if d <= 0 {
			errs = append(errs, field.Invalid(p, d.String(), "must be positive"))
		}
	}
	if c.LivenessTimeout.Duration < MinLivenessTimeout {
		errs = append(errs, field.Invalid(field.NewPath("livenessTimeout"), c.LivenessTimeout.Duration.String(),
			fmt.Sprintf("must be at least %v (the agent's heartbeat is every second)", MinLivenessTimeout)))
	}
	positive(field.NewPath("fullSyncPeriod"), c.FullSyncPeriod.Duration)
	positive(field.NewPath("programRefreshDelay"), c.ProgramRefreshDelay.Duration)
	positive(field.NewPath("clusterPolicyCheckPeriod"), c.ClusterPolicyCheckPeriod.Duration)
	positive(field.NewPath("unknownPods", "wait"), c.UnknownPods.Wait.Duration)
	positive(field.NewPath("denyLog", "flowInterval"), c.DenyLog.FlowInterval.Duration)
	positive(field.NewPath("stagedLog", "flowInterval"), c.StagedLog.FlowInterval.Duration)
	d := field.NewPath("dns")
	positive(d.Child("minTTL"), c.DNS.MinTTL.Duration)
	positive(d.Child("queryTimeout"), c.DNS.QueryTimeout.Duration)
	if c.DNS.MaxTTL.Duration < c.DNS.MinTTL.Duration {
		errs = append(errs, field.Invalid(d.Child("maxTTL"), c.DNS.MaxTTL.Duration.String(), "must not be below dns.minTTL"))
	}
	return errs
}

func oneOf(s string, values ...string) bool {
	for _, v := range values {
		if s == v {
			return true
		}
	}
	return false
}

func isPrefixOrAddr(s string) bool {
	s = strings.TrimSpace(s)
	if _, err := netip.ParsePrefix(s); err == nil {
		return true
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}
