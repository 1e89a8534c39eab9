package lab

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// Outcome is one probe on the real kernel next to the verdict it should
// get.
type Outcome struct {
	// ProbeResult is the request (From endpoint, To address, Port, Proto)
	// and what the kernel did: Connected (TCP connected, UDP echoed),
	// Reason of a failure ("timeout" for a drop), Duration. Its Err is a
	// harness problem: the probe failed in a way no policy causes
	// (refused, unreachable, wrong responder...).
	netlab.ProbeResult
	// Index is the probe's index in the scenario's probes; Probe the probe
	// as a scenario states it.
	Index int
	Probe scenario.Probe
	// Src is the source address; SrcNode and DstNode the nodes the
	// endpoints sit on (external hosts: ExternalNode).
	Src              netip.Addr
	SrcNode, DstNode string
	// Want is the verdict the probe should get, WantReason why: the
	// evaluator's on the cluster-wide program for a scenario's probes (as
	// `nftpolicy eval` decides), the policies' as written for the attacks
	// (RunNewPods, RunQueueFlood).
	Want       bool
	WantReason string
}

// Disagrees reports whether the kernel and the expected verdict differ.
func (o *Outcome) Disagrees() bool { return o.Err == nil && o.Connected != o.Want }

// Report is the result of probing a lab.
type Report struct {
	Mode     compile.Mode
	Variant  compile.QueueVariant
	Outcomes []Outcome
	// Rulesets holds `nft list table inet nftpolicy` of the nodes involved
	// in a disagreement or error, by node.
	Rulesets map[string]string
	Sync     SyncResult
	Duration time.Duration
	// PodEvents and PodRebuilds count, over the nodes, the pod,
	// NetworkPolicy and ClusterNetworkPolicy changes CheckPodEvents applied
	// through the tracker and those that needed a rebuild.
	PodEvents, PodRebuilds int
}

// report returns a report of outs in the lab's mode.
func (l *Lab) report(outs []Outcome) *Report {
	rep := &Report{Mode: l.rcfg.Mode, Outcomes: outs}
	if l.rcfg.Mode == compile.ModeQueue {
		rep.Variant = l.rcfg.QueueVariant
	}
	return rep
}

// Disagreements returns the outcomes where the kernel and the expected
// verdict differ.
func (r *Report) Disagreements() []Outcome {
	var out []Outcome
	for _, o := range r.Outcomes {
		if o.Disagrees() {
			out = append(out, o)
		}
	}
	return out
}

// Errors returns the outcomes with harness problems.
func (r *Report) Errors() []Outcome {
	var out []Outcome
	for _, o := range r.Outcomes {
		if o.Err != nil {
			out = append(out, o)
		}
	}
	return out
}

// Admitted returns the outcomes that connected although they should be
// denied.
func (r *Report) Admitted() []Outcome {
	var out []Outcome
	for _, o := range r.Outcomes {
		if o.Disagrees() && o.Connected {
			out = append(out, o)
		}
	}
	return out
}

// Allowed counts the outcomes that should connect, and of those the ones
// that did.
func (r *Report) Allowed() (allowed, connected int) {
	for _, o := range r.Outcomes {
		if o.Want {
			allowed++
			if o.Connected && o.Err == nil {
				connected++
			}
		}
	}
	return allowed, connected
}

func verdictWord(b bool) string {
	if b {
		return "allowed"
	}
	return "denied"
}

// Table formats the disagreements and harness errors: one row per probe,
// then the nftpolicy table of every node involved. Empty when the kernel
// and the evaluator agree on every probe.
func (r *Report) Table() string {
	var rows [][]string
	for _, o := range r.Outcomes {
		if !o.Disagrees() && o.Err == nil {
			continue
		}
		kernel := "allowed (connected)"
		if !o.Connected {
			kernel = "denied (" + o.Reason + ")"
		}
		if o.Err != nil {
			kernel = "ERROR: " + o.Err.Error()
		}
		rows = append(rows, []string{
			fmt.Sprint(o.Index),
			fmt.Sprintf("%s %s@%s", o.Probe.From, o.Src, o.SrcNode),
			fmt.Sprintf("%s %s@%s", o.Probe.To, o.To, o.DstNode),
			fmt.Sprintf("%d/%s", o.Probe.Port, o.Probe.ProbeProtocol()),
			kernel, verdictWord(o.Want), o.WantReason,
		})
	}
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	mode := string(r.Mode)
	if r.Variant != "" {
		mode += "/" + string(r.Variant)
	}
	fmt.Fprintf(&b, "kernel (mode %s) and evaluator disagree:\n", mode)
	writeTable(&b, append([][]string{{"probe", "from", "to", "port/proto", "kernel", "evaluator", "evaluator reason"}}, rows...))
	nodes := make([]string, 0, len(r.Rulesets))
	for n := range r.Rulesets {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		fmt.Fprintf(&b, "\n--- %s: nft list table inet %s ---\n%s", n, compile.TableName, r.Rulesets[n])
	}
	return b.String()
}

func writeTable(b *strings.Builder, rows [][]string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len(c))
		}
	}
	for _, r := range rows {
		for i, c := range r {
			if i == len(r)-1 {
				b.WriteString(c)
			} else {
				fmt.Fprintf(b, "%-*s  ", width[i], c)
			}
		}
		b.WriteString("\n")
	}
}
