package bench

import (
	"context"

	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// QueueFloodConfig configures RunQueueFlood.
type QueueFloodConfig struct {
	// Rounds is how many floods run in each fail mode.
	Rounds int
	Logf   func(format string, args ...any)
}

// RunQueueFlood plays lab.QueueFloodAttack (one pod floods the queue
// with connections held for pods that never come, while new pods start and
// the flooder connects to a new pod its policy denies) Rounds times with a
// fail-closed agent and Rounds times with a --fail-open one:
// queue_flood_other_allowed_ok is the share of the other pods' allowed
// connections that succeeded (all rounds, both modes), and
// queue_flood_admitted_denied the denied connections admitted (both
// modes; per mode in queue_flood_admitted_denied_fail_closed/_fail_open).
func RunQueueFlood(ctx context.Context, cfg QueueFloodConfig) (*Result, error) {
	res := &Result{}
	ok, allowed, admitted := 0, 0, 0
	for _, failOpen := range []bool{false, true} {
		mode := map[bool]string{false: "fail_closed", true: "fail_open"}[failOpen]
		modeAdmitted := 0
		for i := 0; i < cfg.Rounds; i++ {
			r, err := queueFloodRound(ctx, failOpen)
			if err != nil {
				return nil, err
			}
			roundAllowed, roundOK := r.Allowed()
			admittedDenied := r.Admitted()
			cfg.Logf("%s round %d: flooder opened %d connections; other pods' allowed %d/%d; denied admitted %d/%d %v",
				mode, i+1, r.Sent, roundOK, roundAllowed, len(admittedDenied), len(r.Outcomes)-roundAllowed, admittedDenied)
			ok += roundOK
			allowed += roundAllowed
			modeAdmitted += len(admittedDenied)
		}
		res.Set("queue_flood_admitted_denied_"+mode, modeAdmitted)
		admitted += modeAdmitted
	}
	res.Set("queue_flood_other_allowed_ok", float64(ok)/float64(max(allowed, 1)))
	res.Set("queue_flood_admitted_denied", admitted)
	return res, nil
}

func queueFloodRound(ctx context.Context, failOpen bool) (lab.QueueFloodResult, error) {
	l, err := lab.New(ctx, nil, lab.Config{FailOpen: failOpen})
	if err != nil {
		return lab.QueueFloodResult{}, err
	}
	defer l.Close()
	return l.RunQueueFlood(ctx, lab.QueueFloodAttack(failOpen))
}
