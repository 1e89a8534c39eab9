package sets

import (
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// OldDefinitions gives the external tests baseWorld's ruleset, rendered
// without queue rules, and oldDefinitions of it.
func OldDefinitions(t *testing.T) (rs *compile.Ruleset, set, vmap string, old func(*knftables.Transaction)) {
	t.Helper()
	// Without the unknown-pod rules: they queue, and this kernel may lack
	// the native queue statement.
	rs = baseWorld().rulesetWith(t, compile.RenderConfig{Mode: compile.ModeHybrid, SkipUnknownPods: true})
	set, vmap, old = oldDefinitions(t, rs)
	return rs, set, vmap, old
}

// SetFillChunk sets the elements of one batch of an unhooked fill for the
// test.
func SetFillChunk(t *testing.T, n int) {
	old := fillChunk
	fillChunk = n
	t.Cleanup(func() { fillChunk = old })
}

// WaitPrefetch waits for the read Prefetch started, if any.
func WaitPrefetch(s *Syncer) {
	if s.pre != nil {
		<-s.pre.done
	}
}
