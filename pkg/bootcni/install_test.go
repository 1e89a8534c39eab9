package bootcni

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const primary = `{
  "cniVersion": "1.0.0",
  "name": "kindnet",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "ipam": {"type": "host-local"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

func plugins(t *testing.T, path string) []string {
	t.Helper()
	_, ps, err := readList(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range ps {
		var x struct{ Type string }
		_ = json.Unmarshal(p, &x)
		out = append(out, x.Type)
	}
	return out
}

func TestInstallChainsLastOnceAndRemoveUndoes(t *testing.T) {
	dir := t.TempDir()
	bin, confDir := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	for _, d := range []string{bin, confDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self := filepath.Join(dir, "self")
	if err := os.WriteFile(self, []byte("#!binary"), 0o700); err != nil {
		t.Fatal(err)
	}
	// The runtime uses the first file by name; the other is left alone.
	first, second := filepath.Join(confDir, "10-kindnet.conflist"), filepath.Join(confDir, "99-other.conflist")
	for _, f := range []string{first, second} {
		if err := os.WriteFile(f, []byte(primary), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2; i++ {
		got, err := Install(self, bin, confDir)
		if err != nil || got != first {
			t.Fatalf("Install #%d: %q, %v; want %s", i+1, got, err, first)
		}
	}
	if got := strings.Join(plugins(t, first), ","); got != "ptp,portmap,"+PluginName {
		t.Errorf("plugins after Install: %s", got)
	}
	if got := strings.Join(plugins(t, second), ","); got != "ptp,portmap" {
		t.Errorf("the file the runtime does not use was changed: %s", got)
	}
	b, _ := os.ReadFile(first)
	if !strings.Contains(string(b), `"ipMasq": false`) || !strings.Contains(string(b), `"portMappings": true`) {
		t.Errorf("the other plugins' fields were not kept:\n%s", b)
	}
	if st, err := os.Stat(first); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("mode of the list: %v, %v; want 0600 kept", st.Mode(), err)
	}
	if st, err := os.Stat(filepath.Join(bin, PluginName)); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("plugin executable: %v", err)
	}

	changed, err := Remove(bin, confDir)
	if err != nil || len(changed) != 2 {
		t.Fatalf("Remove: %v, %v", changed, err)
	}
	if got := strings.Join(plugins(t, first), ","); got != "ptp,portmap" {
		t.Errorf("plugins after Remove: %s", got)
	}
	if _, err := os.Stat(filepath.Join(bin, PluginName)); !os.IsNotExist(err) {
		t.Errorf("executable still there: %v", err)
	}
	if changed, err := Remove(bin, confDir); err != nil || len(changed) != 0 {
		t.Errorf("second Remove: %v, %v; want nothing to do", changed, err)
	}
}

func TestInstallWithoutOrWithSingleConfiguration(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "self")
	if err := os.WriteFile(self, []byte("x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if got, err := Install(self, dir, filepath.Join(dir, "missing")); err != nil || got != "" {
		t.Errorf("no configuration: %q, %v; want nothing chained, no error", got, err)
	}
	confDir := filepath.Join(dir, "net.d")
	_ = os.Mkdir(confDir, 0o755)
	single := filepath.Join(confDir, "10-bridge.conf")
	if err := os.WriteFile(single, []byte(`{"cniVersion":"1.0.0","name":"b","type":"bridge"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(self, dir, confDir); !errors.Is(err, ErrSingleConf) {
		t.Errorf("a single plugin's .conf: %v, want refused", err)
	}
}
