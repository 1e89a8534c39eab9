package queue

import (
	"context"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// Evaluating returns the Decider that decides queued packets with e's
// program in force. It is a Holder: a connection of a pod address e's
// program does not know yet is deferred until the pod is programmed or
// e's wait runs out (evaluate.Evaluator.DecideHeld).
func Evaluating(e *evaluate.Evaluator) Holder { return evaluating{e} }

type evaluating struct{ e *evaluate.Evaluator }

func conn(p Packet) evaluate.Conn {
	return evaluate.Conn{Src: p.Src, Dst: p.Dst, Proto: compile.Protocol(p.Proto), Port: p.DstPort}
}

func (d evaluating) Decide(p Packet) (bool, string) { return d.e.Decide(conn(p)) }

func (d evaluating) Holds(p Packet) bool { return d.e.Unknown(conn(p)) }

func (d evaluating) DecideHeld(ctx context.Context, p Packet) (bool, string) {
	return d.e.DecideHeld(ctx, conn(p))
}
