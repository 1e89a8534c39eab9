package sets

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
)

// ApplyDelta writes element changes that turned the applied ruleset into
// desired (a compile.Tracker's pod changes, which update desired in place)
// without comparing the two rulesets: the cost is the change's, not the
// table's. It is one netlink batch when Config.Netlink is set, else one nft
// transaction. When desired is another ruleset than the applied one (a
// pod change that created or deleted chains: the tracker's new ruleset
// shares the applied one's sets, which delta changed in place), it writes
// their difference and delta in one transaction. Without an applied
// ruleset (first sync, after a failure or ForceFull) it is a full Sync.
func (s *Syncer) ApplyDelta(ctx context.Context, desired *compile.Ruleset, delta compile.Delta) (Result, error) {
	if s.applied != desired {
		return s.sync(ctx, desired, delta)
	}
	start := time.Now()
	res, err := s.applyDelta(ctx, desired, delta)
	res.Duration = time.Since(start)
	if err != nil {
		s.applied = nil
	}
	return res, err
}

func (s *Syncer) applyDelta(ctx context.Context, desired *compile.Ruleset, delta compile.Delta) (Result, error) {
	added, deleted := delta.Elements()
	res := Result{Operations: added + deleted, ElementsAdded: added, ElementsDeleted: deleted}
	if res.Operations == 0 {
		return res, nil
	}
	if s.cfg.Netlink != nil {
		batch, err := encodeDelta(s.cfg.Netlink, desired, delta, added+deleted)
		if err == nil {
			err = s.cfg.Netlink.Write(ctx, batch)
			if err == nil {
				res.Netlink = true
				return res, nil
			}
			if !errors.Is(err, nftnl.ErrBatchTooBig) {
				n := s.netlinkFallbacks.Add(1)
				s.cfg.Logger.Error(err, "Netlink element batch failed, the kernel is unchanged; falling back to a full sync",
					"elementsAdded", added, "elementsDeleted", deleted, "fallbacks", n)
				full, err := s.full(ctx, desired)
				full.NetlinkFallback = true
				return full, err
			}
		}
		s.cfg.Logger.V(2).Info("Element changes go through nft", "reason", err)
	}
	tx := s.cfg.NFT.NewTransaction()
	// Deletions first: an element whose value changed is replaced.
	for _, d := range delta {
		set := desired.Sets[d.Set]
		if set == nil {
			return res, fmt.Errorf("element changes for %s, which the ruleset does not have", d.Set)
		}
		for i := range d.Delete {
			tx.Delete(set.Knft(&d.Delete[i]))
		}
	}
	for _, d := range delta {
		set := desired.Sets[d.Set]
		for i := range d.Add {
			tx.Add(set.Knft(&d.Add[i]))
		}
	}
	if err := s.cfg.NFT.Run(ctx, tx); err != nil {
		return res, fmt.Errorf("element transaction (%d operations): %w", res.Operations, err)
	}
	return res, nil
}

// encodeDelta encodes element changes (elements of them) into one batch
// of w: deletions first, as encodeDiffs.
func encodeDelta(w *nftnl.Conn, desired *compile.Ruleset, delta compile.Delta, elements int) (*nftnl.Batch, error) {
	layouts := make([]nftnl.Layout, len(delta))
	for i, d := range delta {
		set := desired.Sets[d.Set]
		if set == nil {
			return nil, fmt.Errorf("element changes for %s, which the ruleset does not have", d.Set)
		}
		var err error
		if layouts[i], err = nftnl.LayoutOf(set); err != nil {
			return nil, fmt.Errorf("set %s: %w", d.Set, err)
		}
	}
	b := w.NewBatch(elements)
	for i, d := range delta {
		for j := range d.Delete {
			if err := b.DeleteElement(d.Set, &layouts[i], &d.Delete[j]); err != nil {
				return nil, fmt.Errorf("set %s: %w", d.Set, err)
			}
		}
	}
	for i, d := range delta {
		for j := range d.Add {
			if err := b.AddElement(d.Set, &layouts[i], &d.Add[j]); err != nil {
				return nil, fmt.Errorf("set %s: %w", d.Set, err)
			}
		}
	}
	return b, nil
}
