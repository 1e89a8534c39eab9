package main

import (
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestConfigDocUpToDate fails while docs/config.md differs from what the
// generator writes from pkg/config (a setting, flag, default or doc
// comment changed without `go run ./hack/configdoc`).
func TestConfigDocUpToDate(t *testing.T) {
	want, err := render("../../pkg/config/types.go")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("docs/config.md is out of date: run go run ./hack/configdoc (-want +got):\n%s", d)
	}
}
