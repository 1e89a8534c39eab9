package bench

import (
	"context"
	"os"
	"slices"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/nflogread"
	"github.com/nftpolicy/nftpolicy/pkg/verify"
)

// ModeHybridVerify is hybrid mode with runtime verification sampling 1%
// of the kernel's verdicts (--verify-rate 0.01, the agent's other
// defaults), a verifier reading the samples on each node:
// verify_conn_ratio_1pct is its rate over hybrid's, round by round.
const ModeHybridVerify = "hybrid_verify1pct"

// verifyRender turns 1% sampling on.
func verifyRender(rcfg *compile.RenderConfig) {
	rcfg.Mode = compile.ModeHybrid
	rcfg.Verify = compile.VerifyConfig{Group: verify.DefaultGroup, PerMillion: compile.VerifyPerMillion / 100}
}

// startVerifiers runs a verifier on each node of the lab, with its agent's
// evaluator, until the lab is closed.
func (l *connLab) startVerifiers(ctx context.Context) error {
	l.verify = verify.NewMetrics()
	for i, n := range benchNodes {
		path, err := l.lab.NodeNetnsPath(n)
		if err != nil {
			return err
		}
		ns, err := os.Open(path)
		if err != nil {
			return err
		}
		v, err := verify.New(verify.Config{Group: verify.DefaultGroup, Node: n, Evaluator: l.agents[i].Evaluator(), Logger: klog.Background()}, l.verify)
		if err != nil {
			ns.Close()
			return err
		}
		readers := nflogread.New(klog.Background(), int(ns.Fd()))
		readers.Add(v.Consumer())
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = readers.Run(rctx, verify.DefaultGroup)
		}()
		l.stops = append(l.stops, func() {
			cancel()
			<-done
			ns.Close()
		})
	}
	return nil
}

// summarizeVerify sets verify_conn_ratio_1pct and what the verifiers
// checked (a disagreement would be a bug).
func summarizeVerify(res *Result, by map[[3]any]*sample, rounds int, modes []string, l *connLab) {
	if !slices.Contains(modes, ModeHybridVerify) || !slices.Contains(modes, ModeHybrid) {
		return
	}
	res.Set("verify_conn_ratio_1pct", round(Median(roundRatios(by, ModeHybridVerify, ModeHybrid, rounds)), 3))
	if l == nil || l.verify == nil {
		return
	}
	var checked, disagreed float64
	for _, k := range []string{"allow", "deny"} {
		checked += testutil.ToFloat64(l.verify.Verified.WithLabelValues(k))
		disagreed += testutil.ToFloat64(l.verify.Disagreements.WithLabelValues(k))
	}
	res.Set("verify_checked_1pct", checked)
	res.Set("verify_disagreements_1pct", disagreed)
}
