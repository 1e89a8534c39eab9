package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// The tracer follows the first packet of a new connection through the
// nftpolicy table as the kernel holds it (`nft -j list table`), to compare
// the kernel's answer with the policy model's. It understands only the rule
// shapes the renderer emits: address vmaps, set membership of addresses and
// of address, protocol and port concatenations, and the verdicts jump, goto,
// accept, drop, return and queue. A packet of a new connection carries no
// mark, and its conntrack state is new; any other match fails.

// Trace is the path of a connection through the kernel ruleset.
type Trace struct {
	// Verdict is "accept", "drop" or "queue".
	Verdict string `json:"verdict"`
	// Chain and Rule locate the rule that gave the verdict ("" for a base
	// chain's policy); Comment is that rule's comment, DenyID the log
	// prefix of a logged drop.
	Chain   string `json:"chain"`
	Rule    string `json:"rule,omitempty"`
	Comment string `json:"comment,omitempty"`
	DenyID  string `json:"denyId,omitempty"`
	// Steps lists the rules that matched, in order, e.g.
	// "forward: ip saddr vmap @egress-pods-v4 -> goto egress-isolated-abc".
	Steps []string `json:"steps"`
}

type nftRule struct {
	Chain   string            `json:"chain"`
	Handle  int               `json:"handle"`
	Comment string            `json:"comment"`
	Expr    []json.RawMessage `json:"expr"`
}

type nftSet struct {
	Name string            `json:"name"`
	Elem []json.RawMessage `json:"elem"`
}

type nftChain struct {
	Name   string `json:"name"`
	Hook   string `json:"hook"`
	Prio   int    `json:"prio"`
	Policy string `json:"policy"`
}

type tracer struct {
	chains map[string]*nftChain
	rules  map[string][]nftRule
	sets   map[string]*nftSet
	maps   map[string]*nftSet

	src, dst netip.Addr
	proto    compile.Protocol
	port     uint16
	tr       Trace
}

// readRuleset reads the JSON listing of the nftpolicy table from a file, or
// from nft.
func readRuleset(file string) ([]byte, error) {
	if file != "" {
		return os.ReadFile(file)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "nft", "-j", "list", "table", "inet", compile.TableName)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nft -j list table inet %s: %v: %s", compile.TableName, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// TraceRuleset follows a new connection's first packet through the listed
// nftpolicy table.
func TraceRuleset(data []byte, src, dst netip.Addr, proto compile.Protocol, port uint16) (Trace, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return Trace{}, fmt.Errorf("parsing nft JSON: %w", err)
	}
	t := &tracer{chains: map[string]*nftChain{}, rules: map[string][]nftRule{}, sets: map[string]*nftSet{}, maps: map[string]*nftSet{},
		src: src.Unmap(), dst: dst.Unmap(), proto: proto, port: port}
	for _, obj := range doc.Nftables {
		for kind, raw := range obj {
			var err error
			switch kind {
			case "chain":
				var c nftChain
				if err = json.Unmarshal(raw, &c); err == nil {
					t.chains[c.Name] = &c
				}
			case "rule":
				var r nftRule
				if err = json.Unmarshal(raw, &r); err == nil {
					t.rules[r.Chain] = append(t.rules[r.Chain], r)
				}
			case "set":
				var s nftSet
				if err = json.Unmarshal(raw, &s); err == nil {
					t.sets[s.Name] = &s
				}
			case "map":
				var s nftSet
				if err = json.Unmarshal(raw, &s); err == nil {
					t.maps[s.Name] = &s
				}
			}
			if err != nil {
				return Trace{}, fmt.Errorf("parsing nft JSON %s: %w", kind, err)
			}
		}
	}
	// Traffic to one of this node's addresses takes the input hook; from
	// one, the output hook, where nftpolicy has no chain.
	isNode := func(a netip.Addr) bool { return t.inSet("node-ips-v4", []any{a}) || t.inSet("node-ips-v6", []any{a}) }
	hook := "forward"
	switch {
	case isNode(t.src):
		hook = "output"
	case isNode(t.dst):
		hook = "input"
	}
	// The hook's first base chain decides (the DNS query capture chains
	// come after it and accept everything).
	var base *nftChain
	for _, c := range t.chains {
		if c.Hook == hook && (base == nil || c.Prio < base.Prio || c.Prio == base.Prio && c.Name < base.Name) {
			base = c
		}
	}
	if base == nil && hook == "output" {
		t.tr.Verdict = "accept"
		t.tr.Steps = []string{"output: the node's own traffic; nftpolicy has no chain on this hook"}
		return t.tr, nil
	}
	if base == nil {
		return Trace{}, fmt.Errorf("the table has no %s chain: is nftpolicy's table loaded?", hook)
	}
	v, err := t.run(base.Name, 0)
	if err != nil {
		return Trace{}, err
	}
	if v == "" || v == "return" {
		v = base.Policy
		t.tr.Chain, t.tr.Rule, t.tr.Comment = base.Name, "", ""
		t.tr.Steps = append(t.tr.Steps, base.Name+": end of chain, policy "+v)
	}
	t.tr.Verdict = v
	return t.tr, nil
}

// run evaluates a chain; it returns a final verdict, or "" / "return" when
// the chain ends without one (jump continues in the caller).
func (t *tracer) run(chain string, depth int) (string, error) {
	if depth > 16 {
		return "", fmt.Errorf("chain %s: jumps nest deeper than 16", chain)
	}
	if _, ok := t.chains[chain]; !ok {
		return "", fmt.Errorf("no chain %s", chain)
	}
	for _, r := range t.rules[chain] {
		matched, verdict, target, step, err := t.rule(&r)
		if err != nil {
			return "", fmt.Errorf("chain %s rule %d: %w", chain, r.Handle, err)
		}
		if !matched {
			continue
		}
		if verdict == "" {
			if step != "" {
				t.tr.Steps = append(t.tr.Steps, chain+": "+step)
			}
			continue
		}
		t.tr.Steps = append(t.tr.Steps, chain+": "+step)
		switch verdict {
		case "accept", "drop", "queue":
			t.tr.Chain, t.tr.Rule, t.tr.Comment = chain, strconv.Itoa(r.Handle), r.Comment
			return verdict, nil
		case "return":
			return "return", nil
		case "jump", "goto":
			v, err := t.run(target, depth+1)
			if err != nil {
				return "", err
			}
			if verdict == "goto" || (v != "" && v != "return") {
				if v == "drop" && r.Comment != "" && strings.HasPrefix(target, "deny-") {
					// The drop happened in the denial's log chain: the
					// policy rule that sent it there says which denial.
					t.tr.Chain, t.tr.Rule, t.tr.Comment = chain, strconv.Itoa(r.Handle), r.Comment
				}
				return v, nil
			}
		}
	}
	return "", nil
}

// rule evaluates one rule: whether every match holds, and its verdict.
func (t *tracer) rule(r *nftRule) (matched bool, verdict, target, step string, err error) {
	var words []string
	for _, raw := range r.Expr {
		var e map[string]json.RawMessage
		if err := json.Unmarshal(raw, &e); err != nil {
			return false, "", "", "", err
		}
		for k, v := range e {
			switch k {
			case "match":
				ok, text, err := t.match(v)
				if err != nil {
					return false, "", "", "", err
				}
				if !ok {
					return false, "", "", "", nil
				}
				words = append(words, text)
			case "vmap":
				var vm struct {
					Key  json.RawMessage `json:"key"`
					Data string          `json:"data"`
				}
				if err := json.Unmarshal(v, &vm); err != nil {
					return false, "", "", "", err
				}
				key, text, ok := t.value(vm.Key)
				if !ok {
					return false, "", "", "", nil
				}
				m := t.maps[strings.TrimPrefix(vm.Data, "@")]
				if m == nil {
					return false, "", "", "", fmt.Errorf("no map %s", vm.Data)
				}
				verdict, target, ok := t.lookupVerdict(m, key)
				if !ok {
					return false, "", "", "", nil
				}
				return true, verdict, target, fmt.Sprintf("%s vmap %s -> %s %s", text, vm.Data, verdict, target), nil
			case "accept", "drop", "return", "queue", "xt":
				if k == "xt" {
					k = "queue" // the xt-compat NFQUEUE target
				}
				words = append(words, k)
				return true, k, "", strings.Join(words, " "), nil
			case "jump", "goto":
				var j struct {
					Target string `json:"target"`
				}
				if err := json.Unmarshal(v, &j); err != nil {
					return false, "", "", "", err
				}
				words = append(words, k+" "+j.Target)
				return true, k, j.Target, strings.Join(words, " "), nil
			case "log":
				var l struct {
					Prefix string `json:"prefix"`
				}
				_ = json.Unmarshal(v, &l)
				if l.Prefix != "" && !compile.IsVerifyID(l.Prefix) {
					// A sampled copy of the deciding rule (runtime
					// verification) has its verdict but no denial.
					t.tr.DenyID = l.Prefix
					words = append(words, fmt.Sprintf("log prefix %q", l.Prefix))
				}
			case "limit", "set":
				// A rate limit (alone, or a per-source meter: "set" is
				// `update @set { key limit ... }`): one packet is within
				// any budget, so "over" never matches and the others
				// have no effect on its verdict.
				if overLimit(k, v) {
					return false, "", "", "", nil
				}
			case "counter", "mangle":
				// No effect on the verdict of the first packet.
			default:
				return false, "", "", "", fmt.Errorf("expression %q: not a shape nftpolicy renders", k)
			}
		}
	}
	return true, "", "", strings.Join(words, " "), nil
}

// match evaluates `left op right`.
func (t *tracer) match(raw json.RawMessage) (bool, string, error) {
	var m struct {
		Op    string          `json:"op"`
		Left  json.RawMessage `json:"left"`
		Right json.RawMessage `json:"right"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return false, "", err
	}
	key, text, ok := t.value(m.Left)
	if !ok {
		// Conntrack state and marks of a new connection, ICMPv6 types, or
		// the other family's addresses: the match fails.
		return false, "", nil
	}
	var setRef string
	if json.Unmarshal(m.Right, &setRef) == nil && strings.HasPrefix(setRef, "@") {
		in := t.inSet(strings.TrimPrefix(setRef, "@"), key)
		if m.Op == "!=" {
			in = !in
		}
		return in, text + " " + setRef, nil
	}
	// A literal: one address, protocol or port.
	var lit any
	if err := json.Unmarshal(m.Right, &lit); err != nil {
		return false, "", err
	}
	eq := len(key) == 1 && elemMatches(lit, key[0])
	if m.Op == "!=" {
		eq = !eq
	}
	return eq, fmt.Sprintf("%s %s %v", text, m.Op, lit), nil
}

// value computes a key expression for the packet: addresses, l4proto and
// destination port, alone or concatenated.
func (t *tracer) value(raw json.RawMessage) ([]any, string, bool) {
	var e map[string]json.RawMessage
	if err := json.Unmarshal(raw, &e); err != nil {
		return nil, "", false
	}
	if c, ok := e["concat"]; ok {
		var parts []json.RawMessage
		if err := json.Unmarshal(c, &parts); err != nil {
			return nil, "", false
		}
		var out []any
		var texts []string
		for _, p := range parts {
			v, text, ok := t.value(p)
			if !ok {
				return nil, "", false
			}
			out = append(out, v...)
			texts = append(texts, text)
		}
		return out, strings.Join(texts, " . "), true
	}
	if p, ok := e["payload"]; ok {
		var pl struct{ Protocol, Field string }
		if err := json.Unmarshal(p, &pl); err != nil {
			return nil, "", false
		}
		text := pl.Protocol + " " + pl.Field
		switch {
		case (pl.Protocol == "ip" && t.src.Is4()) || (pl.Protocol == "ip6" && t.src.Is6()):
			if pl.Field == "saddr" {
				return []any{t.src}, text, true
			}
			if pl.Field == "daddr" {
				return []any{t.dst}, text, true
			}
		case pl.Protocol == "th" && pl.Field == "dport":
			return []any{t.port}, text, true
		}
		return nil, "", false
	}
	if m, ok := e["meta"]; ok {
		var mk struct{ Key string }
		if err := json.Unmarshal(m, &mk); err == nil && mk.Key == "l4proto" {
			return []any{t.proto}, "meta l4proto", true
		}
	}
	return nil, "", false
}

// inSet reports whether a key is an element of a set.
func (t *tracer) inSet(name string, key []any) bool {
	s := t.sets[name]
	if s == nil {
		return false
	}
	for _, raw := range s.Elem {
		if elemKeyMatches(raw, key) {
			return true
		}
	}
	return false
}

// lookupVerdict finds a map element's verdict for a key.
func (t *tracer) lookupVerdict(m *nftSet, key []any) (string, string, bool) {
	for _, raw := range m.Elem {
		var pair []json.RawMessage
		if json.Unmarshal(raw, &pair) != nil || len(pair) != 2 || !elemKeyMatches(pair[0], key) {
			continue
		}
		var v map[string]struct {
			Target string `json:"target"`
		}
		if json.Unmarshal(pair[1], &v) != nil {
			continue
		}
		for k, x := range v {
			return k, x.Target, true
		}
	}
	return "", "", false
}

// elemKeyMatches compares a set element (scalar, prefix, range, concat,
// possibly wrapped with a comment) with a key.
func elemKeyMatches(raw json.RawMessage, key []any) bool {
	var e any
	if json.Unmarshal(raw, &e) != nil {
		return false
	}
	if obj, ok := e.(map[string]any); ok {
		if inner, ok := obj["elem"].(map[string]any); ok {
			e = inner["val"]
		}
	}
	if obj, ok := e.(map[string]any); ok {
		if parts, ok := obj["concat"].([]any); ok {
			if len(parts) != len(key) {
				return false
			}
			for i := range parts {
				if !elemMatches(parts[i], key[i]) {
					return false
				}
			}
			return true
		}
	}
	return len(key) == 1 && elemMatches(e, key[0])
}

// elemMatches compares one element component with one key value.
func elemMatches(e any, k any) bool {
	switch v := k.(type) {
	case netip.Addr:
		switch x := e.(type) {
		case string:
			a, err := netip.ParseAddr(x)
			return err == nil && a.Unmap() == v
		case map[string]any:
			if p, ok := x["prefix"].(map[string]any); ok {
				addr, _ := p["addr"].(string)
				l, _ := p["len"].(float64)
				pr, err := netip.ParsePrefix(fmt.Sprintf("%s/%d", addr, int(l)))
				return err == nil && pr.Contains(v)
			}
			if r, ok := x["range"].([]any); ok && len(r) == 2 {
				lo, err1 := netip.ParseAddr(fmt.Sprint(r[0]))
				hi, err2 := netip.ParseAddr(fmt.Sprint(r[1]))
				return err1 == nil && err2 == nil && lo.Compare(v) <= 0 && v.Compare(hi) <= 0
			}
		}
	case compile.Protocol:
		switch x := e.(type) {
		case string:
			return x == compile.Protocol(uint8(v)).Name() // nft names them as the runtime does
		case float64:
			return int(x) == int(v)
		}
	case uint16:
		switch x := e.(type) {
		case float64:
			return int(x) == int(v)
		case map[string]any:
			if r, ok := x["range"].([]any); ok && len(r) == 2 {
				lo, _ := r[0].(float64)
				hi, _ := r[1].(float64)
				return int(lo) <= int(v) && int(v) <= int(hi)
			}
		}
	}
	return false
}

// overLimit reports whether a limit statement, or the limit of a set
// update (a meter), is "limit rate over": it matches only packets past
// their budget.
func overLimit(kind string, raw json.RawMessage) bool {
	type limit struct {
		Inv bool `json:"inv"`
	}
	if kind == "limit" {
		var l limit
		return json.Unmarshal(raw, &l) == nil && l.Inv
	}
	var u struct {
		Stmt []struct {
			Limit *limit `json:"limit"`
		} `json:"stmt"`
	}
	if json.Unmarshal(raw, &u) != nil {
		return false
	}
	for _, st := range u.Stmt {
		if st.Limit != nil && st.Limit.Inv {
			return true
		}
	}
	return false
}
