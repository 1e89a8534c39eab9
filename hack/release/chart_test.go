package main

import (
	"os"
	"strings"
	"testing"
)

// TestChartTemplateInSync: the chart's template is what hack/chart-sync.sh
// makes of install.yaml (a change of install.yaml reaches the chart).
func TestChartTemplateInSync(t *testing.T) {
	install, err := os.ReadFile("../../install.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := chartTemplate(string(install))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../charts/nftpolicy/templates/install.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatal("charts/nftpolicy/templates/install.yaml is not install.yaml's: run bash hack/chart-sync.sh")
	}
}

// TestChartTemplateRefusesMovedLines: a line the chart makes a value of
// that install.yaml no longer has (or has twice) stops the sync, rather
// than leaving the value out of the chart.
func TestChartTemplateRefusesMovedLines(t *testing.T) {
	install, err := os.ReadFile("../../install.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to, want string }{
		{"      verbosity: 1\n", "      verbosity: 2\n", `0 copies of "    logging:\n      verbosity: 1\n"`},
		{"    mode: hybrid\n", "    mode: hybrid\n    mode: hybrid\n", "2 copies"},
		{"kind: DaemonSet\n", "kind: DaemonSet # {{ .Values.x }}\n", "template action"},
	} {
		_, err := chartTemplate(strings.Replace(string(install), c.from, c.to, 1))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q -> %q: %v, want an error with %q", c.from, c.to, err, c.want)
		}
	}
}

// TestPublisherTemplateInSync: the chart's publisher template is what
// hack/chart-sync.sh makes of deploy/publisher.yaml.
func TestPublisherTemplateInSync(t *testing.T) {
	manifest, err := os.ReadFile("../../deploy/publisher.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := publisherTemplate(string(manifest))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../charts/nftpolicy/templates/publisher.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatal("charts/nftpolicy/templates/publisher.yaml is not deploy/publisher.yaml's: run bash hack/chart-sync.sh")
	}
}
