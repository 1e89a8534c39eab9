// Command funclen lists the functions longer than a bound, so that a long
// function is split before it grows further. Table functions, whose body is
// mostly composite literals (test cases, flag tables, rule lists), are left
// out: their length is data, not logic.
//
//	go run ./hack/funclen [-max 100] [-tests] [dir ...]
//
// It prints "file:line: name: N lines" for each function over -max and exits
// 1 if there is any, 0 if none, 2 on bad input.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// tableShare is the share of a function's body lines inside composite
// literals at which the function counts as a table.
const tableShare = 0.5

type finding struct {
	pos   token.Position
	name  string
	lines int
}

func main() {
	max := flag.Int("max", 100, "longest function allowed, in lines (signature to closing brace)")
	tests := flag.Bool("tests", false, "also check _test.go files")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: funclen [-max N] [-tests] [dir ...] (default: pkg cmd)\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *max < 1 {
		fmt.Fprintf(os.Stderr, "funclen: -max must be at least 1, got %d\n", *max)
		os.Exit(2)
	}
	dirs := flag.Args()
	if len(dirs) == 0 {
		dirs = []string{"pkg", "cmd"}
	}
	var found []finding
	fset := token.NewFileSet()
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if name := d.Name(); path != dir && (name == "testdata" || strings.HasPrefix(name, ".")) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || (!*tests && strings.HasSuffix(path, "_test.go")) {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			found = append(found, longFuncs(fset, f, *max)...)
			return nil
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "funclen: %v\n", err)
			os.Exit(2)
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].lines > found[j].lines })
	for _, f := range found {
		fmt.Printf("%s:%d: %s: %d lines\n", f.pos.Filename, f.pos.Line, f.name, f.lines)
	}
	if len(found) > 0 {
		os.Exit(1)
	}
}

// longFuncs returns the functions and methods of f, and the function
// literals assigned at package level, longer than max lines and not tables.
func longFuncs(fset *token.FileSet, f *ast.File, max int) []finding {
	var out []finding
	check := func(name string, start token.Pos, body *ast.BlockStmt) {
		if body == nil {
			return
		}
		first, last := fset.Position(start).Line, fset.Position(body.Rbrace).Line
		n := last - first + 1
		if n <= max || isTable(fset, body) {
			return
		}
		out = append(out, finding{pos: fset.Position(start), name: name, lines: n})
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			check(funcName(d), d.Pos(), d.Body)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				vs, ok := spec.(*ast.ValueSpec)
				if !ok {
					continue
				}
				for i, v := range vs.Values {
					if lit, ok := v.(*ast.FuncLit); ok && i < len(vs.Names) {
						check(vs.Names[i].Name, lit.Pos(), lit.Body)
					}
				}
			}
		}
	}
	return out
}

func funcName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name
	}
	t := d.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch r := t.(type) {
	case *ast.IndexExpr:
		t = r.X
	case *ast.IndexListExpr:
		t = r.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + d.Name.Name
	}
	return d.Name.Name
}

// isTable reports whether at least tableShare of body's lines lie inside
// outermost composite literals.
func isTable(fset *token.FileSet, body *ast.BlockStmt) bool {
	first, last := fset.Position(body.Lbrace).Line, fset.Position(body.Rbrace).Line
	total := last - first - 1
	if total <= 0 {
		return false
	}
	inLit := make(map[int]bool)
	ast.Inspect(body, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		for l := fset.Position(lit.Lbrace).Line; l <= fset.Position(lit.Rbrace).Line; l++ {
			inLit[l] = true
		}
		return false
	})
	return float64(len(inLit)) >= tableShare*float64(total)
}
