package uninstall

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestRemoveState: the agent's files (snapshots and their temporary files)
// go, anything else in the directory stays; a second run and a missing
// directory are no error.
func TestRemoveState(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"program-input-node-1.json", ".snapshot-123", "unrelated.txt"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemoveState(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{filepath.Join(dir, ".snapshot-123"), filepath.Join(dir, "program-input-node-1.json")}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "unrelated.txt")); err != nil {
		t.Errorf("a file the agent did not write was touched: %v", err)
	}
	if removed, err := RemoveState(dir); err != nil || len(removed) != 0 {
		t.Errorf("second run: %v, %v; want nothing", removed, err)
	}
	if removed, err := RemoveState(filepath.Join(dir, "missing")); err != nil || len(removed) != 0 {
		t.Errorf("missing directory: %v, %v; want nothing", removed, err)
	}
}
