package sets

import (
	"fmt"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// addSetOneCommand adds a set or map and all its elements, the elements as
// one "add element" command. knftables writes one command per Element, and
// nft handles each command on its own, which for a big set costs it about
// twice the CPU and several times the memory of one command holding every
// element (nft 1.0.6), so the list is written into a single Element: every element but the last
// goes, with its comment and value, into the key text, and the last one
// fills the Element's own fields, which knftables writes after the key:
//
//	add element inet nftpolicy S { k1 comment "c1" : v1, k2 : v2, k3 comment "c3" : v3 }
func addSetOneCommand(tx *knftables.Transaction, s *compile.Set) {
	if len(s.Elements) < 2 {
		s.AddTo(tx)
		return
	}
	decl := *s
	decl.Elements = nil
	decl.AddTo(tx)
	var b strings.Builder
	last := len(s.Elements) - 1
	for i := range s.Elements[:last] {
		writeElement(&b, &s.Elements[i])
		b.WriteString(", ")
	}
	e := s.Element(last)
	b.WriteString(strings.Join(e.Key, " . "))
	e.Key = []string{b.String()}
	tx.Add(e)
}

// writeElement writes an element as knftables does inside the braces.
func writeElement(b *strings.Builder, e *compile.Element) {
	var buf [128]byte
	b.Write(e.AppendKey(buf[:0]))
	if e.Comment != nil {
		fmt.Fprintf(b, " comment %q", *e.Comment)
	}
	if e.Verdict != compile.VerdictNone {
		b.WriteString(" : ")
		b.WriteString(e.Value().String())
	}
}
