package main

import (
	"bytes"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

var update = flag.Bool("update", false, "rewrite docs/flags.md and docs/metrics.md")

// docs/flags.md and docs/metrics.md are what `nftpolicy reference` prints
// from the code; -update rewrites them.
func TestReferenceDocs(t *testing.T) {
	for what, file := range map[string]string{"flags": "flags.md", "metrics": "metrics.md"} {
		path := filepath.Join("..", "..", "docs", file)
		var out, errb bytes.Buffer
		if code := runReference([]string{what}, &out, &errb); code != exitOK {
			t.Fatalf("reference %s: exit %d: %s", what, code, errb.String())
		}
		if *update {
			if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		have, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(have), out.String()); diff != "" {
			t.Errorf("docs/%s is out of date; run 'go test ./cmd/nftpolicy -run TestReferenceDocs -update' (-file +code):\n%s", file, diff)
		}
	}
}

// metricNameRE finds metric names where the code defines them: the Name
// of an Opts literal, the first argument of prometheus.NewDesc.
var metricNameRE = regexp.MustCompile(`(?:\bName:\s*|NewDesc\(\s*)"(nftpolicy_[a-z0-9_]+)"`)

// Every metric defined in cmd/ and pkg/ is in the reference: one defined
// outside the functions agentCollectors calls would be missing from it.
func TestReferenceHasEveryMetric(t *testing.T) {
	metrics, err := agentMetrics()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := publisherMetrics()
	if err != nil {
		t.Fatal(err)
	}
	metrics = append(metrics, pub...)
	documented := map[string]bool{}
	for _, m := range metrics {
		documented[m.Name] = true
		if m.Help == "" {
			t.Errorf("%s has no help", m.Name)
		}
	}
	defined := 0
	for _, dir := range []string{filepath.Join("..", "..", "cmd"), filepath.Join("..", "..", "pkg")} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range metricNameRE.FindAllSubmatch(src, -1) {
				defined++
				if name := string(m[1]); !documented[name] {
					t.Errorf("%s defines metric %s, which neither agentCollectors nor publisherMetrics (cmd/nftpolicy/reference.go) registers", path, name)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if defined < len(metrics)-5 {
		t.Errorf("found %d metric definitions in the source, the reference has %d: is metricNameRE still right?", defined, len(metrics))
	}
}

// parseDesc reads client_golang's descriptions, labels and quoting
// included, and refuses a format it does not know.
func TestParseDesc(t *testing.T) {
	d := prometheus.NewDesc("nftpolicy_x_total", `Help with "quotes", commas, {braces}} and variableLabels: {y}.`, []string{"a", "b"}, prometheus.Labels{"c": "d"})
	got, err := parseDesc(d.String())
	if err != nil {
		t.Fatal(err)
	}
	want := metricDoc{Name: "nftpolicy_x_total", Help: `Help with "quotes", commas, {braces}} and variableLabels: {y}.`, Labels: []string{"a", "b"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got, err := parseDesc(prometheus.NewDesc("nftpolicy_y", "h", nil, nil).String()); err != nil || got.Labels != nil {
		t.Errorf("no labels: %+v, %v", got, err)
	}
	for _, s := range []string{"", "Desc{}", `Desc{fqName: "x", help: "h"}`, `Desc{fqName: x, help: "h", variableLabels: {}}`} {
		if _, err := parseDesc(s); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
}
