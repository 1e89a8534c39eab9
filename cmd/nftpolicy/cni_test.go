package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/bootcni"
)

// TestCNIInstallSingleConfWarns: a node whose network plugin writes one
// plugin's .conf cannot chain the boot plugin; cni-install (the agent's
// init container) must warn and succeed, or the agent would never start
// on that node.
func TestCNIInstallSingleConfWarns(t *testing.T) {
	bin, conf := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(conf, "10-bridge.conf"), []byte(`{"cniVersion":"1.0.0","name":"b","type":"bridge"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"cni-install", "--cni-bin-dir", bin, "--cni-conf-dir", conf}, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d, want %d\n%s%s", code, exitOK, out.String(), errOut.String())
	}
	if !strings.Contains(errOut.String(), "WARNING") || !strings.Contains(errOut.String(), "not held") {
		t.Errorf("stderr %q: want a warning that pods are not held", errOut.String())
	}
	if _, err := os.Stat(filepath.Join(bin, bootcni.PluginName)); err != nil {
		t.Errorf("plugin executable: %v", err)
	}
	if code := run([]string{"cni-install", "--cni-bin-dir", filepath.Join(bin, "missing"), "--cni-conf-dir", conf}, &out, &errOut); code != exitFailure {
		t.Errorf("an unwritable plugin directory: exit %d, want %d", code, exitFailure)
	}
}
