package compile_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// defaultFormatNames matches the generated names of the default format:
// none may be left once another format is in use.
var defaultFormatNames = regexp.MustCompile(`\bpeers-|\bnodes-[a-z2-7]|-isolated-|\bdeny-d[a-z2-7]{8}\b|(ingress|egress)-(admin|baseline)-[a-z2-7]{8}\b`)

// TestGoldensInAnotherNameFormat renders the golden scenarios with another
// name format (export_test.go) into a directory of their own and checks
// them there with the golden tests' own comparison: the rulesets are
// rendered the same way again, none names an object in the default
// format, and they differ from the committed goldens only by names.
func TestGoldensInAnotherNameFormat(t *testing.T) {
	compile.UseTestNameFormat(t)
	dir := t.TempDir()
	t.Run("write", func(t *testing.T) { checkGoldens(t, dir, true) })
	t.Run("compare", func(t *testing.T) { checkGoldens(t, dir, false) })
	files, _ := filepath.Glob(filepath.Join(dir, "*.nft"))
	if len(files) == 0 {
		t.Fatal("no goldens written")
	}
	changed := 0
	for _, f := range files {
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if m := defaultFormatNames.Find(got); m != nil {
			t.Errorf("%s: %q is a name of the default format", filepath.Base(f), m)
		}
		want, err := os.ReadFile(filepath.Join("testdata/golden", filepath.Base(f)))
		if err != nil {
			t.Fatal(err)
		}
		if string(want) != string(got) {
			changed++
		}
		if lines(want) != lines(got) {
			t.Errorf("%s: %d lines, the committed golden %d: the format changed more than names", filepath.Base(f), lines(got), lines(want))
		}
	}
	if changed == 0 {
		t.Error("no golden changed with the name format: the test proves nothing")
	}
}

func lines(b []byte) int {
	n := 0
	for _, c := range b {
		if c == '\n' {
			n++
		}
	}
	return n
}
