package inproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// bypasses are the steps only controller.Applier may take (the tracker's
// reads, Stale, Program and Ruleset, are not steps): a harness or an agent
// that took one itself would run a copy of the sequence (apply, commit,
// publish, run the hooks) instead of the agent's.
var bypasses = []string{
	"(*github.com/nftpolicy/nftpolicy/pkg/sets.Syncer).Sync",
	"(*github.com/nftpolicy/nftpolicy/pkg/sets.Syncer).ApplyDelta",
	"(*github.com/nftpolicy/nftpolicy/pkg/sets.Syncer).ForceFull",
	"(*github.com/nftpolicy/nftpolicy/pkg/evaluate.Evaluator).Swap",
	"github.com/nftpolicy/nftpolicy/pkg/compile.NewTracker",
	"github.com/nftpolicy/nftpolicy/pkg/compile.BuildCached",
	"(*github.com/nftpolicy/nftpolicy/pkg/compile.Tracker).Rebuild",
	"(*github.com/nftpolicy/nftpolicy/pkg/compile.Tracker).Reset",
	"(*github.com/nftpolicy/nftpolicy/pkg/compile.Tracker).ApplyPod",
	"(*github.com/nftpolicy/nftpolicy/pkg/compile.Tracker).ApplyPodInfo",
	"(*github.com/nftpolicy/nftpolicy/pkg/compile.Tracker).ApplyPolicy",
	"(*github.com/nftpolicy/nftpolicy/pkg/compile.Tracker).ApplyClusterPolicy",
}

// TestNoSequenceOutsideTheApplier: neither this harness, nor the agent's
// command (cmd/nftpolicy, flags and start-up), nor the rest of
// pkg/controller (its informers and sync loop) compiles through the
// tracker, commits, or publishes to the evaluator itself; they go through
// controller.Applier (pkg/controller/apply.go), so that what the harness
// tests is what the agent runs. Type-checked from the packages' sources
// with their dependencies' export data (go list -export).
func TestNoSequenceOutsideTheApplier(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to list the packages' export data")
	}
	const mod = "github.com/nftpolicy/nftpolicy/"
	// The packages, and the one file of each that may take the steps.
	pkgs := map[string]string{mod + "tests/internal/inproc": "", mod + "cmd/nftpolicy": "", mod + "pkg/controller": "apply.go"}
	listed, err := listPackages(slices.Sorted(maps.Keys(pkgs)))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range slices.Sorted(maps.Keys(pkgs)) {
		found, err := bypassesIn(listed, path)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range found {
			if filepath.Base(f.pos.Filename) != pkgs[path] {
				t.Errorf("%s: %s bypasses controller.Applier", f.pos, f.name)
			}
		}
	}
}

// listedPackage is what go list says of a package.
type listedPackage struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
	ImportMap  map[string]string
}

// listPackages lists pkgs and their dependencies with export data.
func listPackages(pkgs []string) (map[string]listedPackage, error) {
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-json=ImportPath,Dir,GoFiles,Export,ImportMap"}, pkgs...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, errors.New("go list: " + err.Error() + ": " + stderr.String())
	}
	listed := map[string]listedPackage{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return listed, nil
		} else if err != nil {
			return nil, err
		}
		listed[p.ImportPath] = p
	}
}

type bypass struct {
	pos  token.Position
	name string
}

// bypassesIn type-checks the package path (its non-test files) and
// returns every use of a function or method bypasses names.
func bypassesIn(listed map[string]listedPackage, path string) ([]bypass, error) {
	p := listed[path]
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	imp := importer.ForCompiler(fset, "gc", func(importPath string) (io.ReadCloser, error) {
		if mapped, ok := p.ImportMap[importPath]; ok {
			importPath = mapped
		}
		dep, ok := listed[importPath]
		if !ok || dep.Export == "" {
			return nil, errors.New("no export data for " + importPath)
		}
		return os.Open(dep.Export)
	})
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	if _, err := (&types.Config{Importer: imp}).Check(path, fset, files, info); err != nil {
		return nil, err
	}
	var found []bypass
	for id, obj := range info.Uses {
		fn, ok := obj.(*types.Func)
		if !ok {
			continue
		}
		name := fn.FullName()
		if slices.Contains(bypasses, name) {
			found = append(found, bypass{fset.Position(id.Pos()), name})
		}
	}
	slices.SortFunc(found, func(a, b bypass) int { return strings.Compare(a.pos.String(), b.pos.String()) })
	return found, nil
}
