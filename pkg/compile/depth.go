package compile

import "fmt"

// KernelJumpStack is the kernel's bound on nested chains (NFT_JUMP_STACK_SIZE):
// it refuses a table in which a chain is reached from a base chain through
// this many jumps, gotos or verdict-map entries ("Too many links", EMLINK),
// whether or not a packet could take that path. A refused table fails every
// sync, and the kernel keeps the ruleset it had.
const KernelJumpStack = 16

// JumpPath returns the longest path of jumps, gotos and verdict-map entries
// from a base chain of the ruleset, as chain names from the base chain on:
// len(path)-1 edges, which must stay under KernelJumpStack. An error names
// a chain that reaches itself or a missing target.
func (rs *Ruleset) JumpPath() ([]string, error) {
	edges := map[string][]string{}
	for name, ch := range rs.Chains {
		for i := range ch.Rules {
			edges[name] = append(edges[name], ch.Rules[i].Targets(rs.set)...)
		}
	}
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	next := map[string]string{}
	depth := map[string]int{}
	var visit func(string) error
	visit = func(c string) error {
		switch state[c] {
		case visiting:
			return fmt.Errorf("chain %s reaches itself", c)
		case done:
			return nil
		}
		if rs.Chains[c] == nil {
			return fmt.Errorf("a rule names chain %s, which the ruleset does not have", c)
		}
		state[c] = visiting
		for _, t := range edges[c] {
			if err := visit(t); err != nil {
				return err
			}
			if d := depth[t] + 1; d > depth[c] {
				depth[c], next[c] = d, t
			}
		}
		state[c] = done
		return nil
	}
	var best []string
	for _, name := range rs.ChainOrder {
		ch := rs.Chains[name]
		if ch == nil || ch.Chain.Hook == nil {
			continue
		}
		if err := visit(name); err != nil {
			return nil, err
		}
		if best == nil || depth[name] > len(best)-1 {
			best = []string{name}
			for c := name; next[c] != ""; c = next[c] {
				best = append(best, next[c])
			}
		}
	}
	return best, nil
}

// set returns the set or map named, nil when the ruleset has none.
func (rs *Ruleset) set(name string) *Set { return rs.Sets[name] }
