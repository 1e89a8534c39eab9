package compile

import (
	"fmt"
	"strings"
)

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
		for _, r := range ch.Rules {
			edges[name] = append(edges[name], rs.ruleTargets(r.Rule)...)
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

// ruleTargets returns the chains a rule's text jumps or goes to, directly
// or through a named verdict map's elements.
func (rs *Ruleset) ruleTargets(rule string) []string {
	var out []string
	f := strings.Fields(unquoted(rule))
	for i := 0; i+1 < len(f); i++ {
		switch f[i] {
		case "jump", "goto":
			out = append(out, f[i+1])
		case "vmap":
			s := rs.Sets[strings.TrimPrefix(f[i+1], "@")]
			if s == nil || !strings.HasPrefix(f[i+1], "@") {
				continue
			}
			for _, e := range s.Elements {
				if v := strings.Fields(e.Value); len(v) == 2 && (v[0] == "jump" || v[0] == "goto") {
					out = append(out, v[1])
				}
			}
		}
	}
	return out
}

// unquoted returns s without its double-quoted parts (comments, log
// prefixes), which may hold any word.
func unquoted(s string) string {
	var b strings.Builder
	in := false
	for _, r := range s {
		if r == '"' {
			in = !in
			continue
		}
		if !in {
			b.WriteRune(r)
		}
	}
	return b.String()
}
