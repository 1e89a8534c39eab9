package compile

// peerSetNames remembers, per selector, the names of the peer sets the
// ruleset has (empty: the selector has none in that family). podElements
// runs for every pod and every selector it belongs to: naming the set there
// hashed the selector's key each time (sha256, 12% of a 50k-pod full
// render's CPU) and looked the name up among the ruleset's sets.
type peerSetNames [][2]string

// note records the set of a selector rendered in a family.
func (p *peerSetNames) note(id SelectorID, v4 bool, name string) {
	for int(id) >= len(*p) {
		*p = append(*p, [2]string{})
	}
	(*p)[id][famIndex(v4)] = name
}

// lookup returns the name of a selector's peer set in a family, "" when the
// ruleset has none.
func (p peerSetNames) lookup(id SelectorID, v4 bool) string {
	if int(id) >= len(p) {
		return ""
	}
	return p[id][famIndex(v4)]
}

func famIndex(v4 bool) int {
	if v4 {
		return 0
	}
	return 1
}
