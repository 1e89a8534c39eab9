package main

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/version"
)

// TestVersionCommand: `nftpolicy version`, `--version` and `version -o
// json` print the version, commit, Go version and platform; the JSON field
// names are the stable ones.
func TestVersionCommand(t *testing.T) {
	want := version.Get()
	platform := runtime.GOOS + "/" + runtime.GOARCH
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errOut.String())
		}
		for _, s := range []string{want.Version, want.Commit, runtime.Version(), platform} {
			if !strings.Contains(out.String(), s) {
				t.Errorf("%v: %q lacks %q", args, out.String(), s)
			}
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"version", "-o", "json"}, &out, &errOut); code != exitOK {
		t.Fatalf("version -o json: exit %d: %s", code, errOut.String())
	}
	var got map[string]string
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("version -o json: %v\n%s", err, out.String())
	}
	wantJSON := map[string]string{"version": want.Version, "commit": want.Commit, "goVersion": runtime.Version(), "platform": platform}
	if len(got) != len(wantJSON) {
		t.Errorf("version -o json: %v, want %v", got, wantJSON)
	}
	for k, v := range wantJSON {
		if got[k] != v {
			t.Errorf("version -o json: %s = %q, want %q", k, got[k], v)
		}
	}
	if code := run([]string{"version", "-o", "yaml"}, &out, &errOut); code != exitBadInput {
		t.Errorf("version -o yaml: exit %d, want %d", code, exitBadInput)
	}
}

// TestBuildInfoMetric: the agent's registry exports nftpolicy_build_info
// = 1 with the version, commit and Go version.
func TestBuildInfoMetric(t *testing.T) {
	_, reg, err := newRegistry()
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := version.Get()
	for _, mf := range mfs {
		if mf.GetName() != "nftpolicy_build_info" {
			continue
		}
		if len(mf.Metric) != 1 || mf.Metric[0].GetGauge().GetValue() != 1 {
			t.Fatalf("nftpolicy_build_info: %v", mf.Metric)
		}
		labels := map[string]string{}
		for _, l := range mf.Metric[0].Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["version"] != want.Version || labels["commit"] != want.Commit || labels["goversion"] != want.GoVersion || len(labels) != 3 {
			t.Errorf("nftpolicy_build_info labels %v, want version %s, commit %s, goversion %s", labels, want.Version, want.Commit, want.GoVersion)
		}
		return
	}
	t.Fatal("no nftpolicy_build_info in the agent's registry")
}
