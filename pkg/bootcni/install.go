package bootcni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ErrSingleConf is Install's error for a configuration of one plugin (a
// .conf): nothing can be chained after it.
var ErrSingleConf = errors.New("a single plugin's configuration, not a list: " + PluginName + " cannot be chained after it (convert it to a .conflist)")

// ConfFile returns the configuration file a runtime (containerd, CRI-O)
// uses in dir: the first by name of those ending in .conflist, .conf or
// .json. Empty when there is none.
func ConfFile(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if e.Type().IsRegular() && !strings.HasPrefix(n, ".") &&
			(strings.HasSuffix(n, ".conflist") || strings.HasSuffix(n, ".conf") || strings.HasSuffix(n, ".json")) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "", nil
	}
	sort.Strings(names)
	return filepath.Join(dir, names[0]), nil
}

// Install copies the executable self to binDir as PluginName and appends
// the plugin to the configuration list the runtime uses in confDir (once:
// an entry already there is kept). It returns the file it edited; empty,
// with no error, when confDir has no configuration yet (no primary
// network plugin: no pod can start either). A configuration of a single
// plugin (.conf) is refused: it cannot chain.
func Install(self, binDir, confDir string) (string, error) {
	if err := copyExecutable(self, filepath.Join(binDir, PluginName)); err != nil {
		return "", err
	}
	conf, _, err := Chain(confDir)
	return conf, err
}

// Chain appends the plugin to the configuration list the runtime uses in
// confDir unless it is there, and says whether it wrote. A network plugin
// that rewrites its list (at its start, on a change) drops the entry: the
// agent calls Chain again to put it back.
func Chain(confDir string) (string, bool, error) {
	conf, err := ConfFile(confDir)
	if err != nil || conf == "" {
		return "", false, err
	}
	list, plugins, err := readList(conf)
	if err != nil {
		return "", false, err
	}
	if pluginIndex(plugins) >= 0 {
		return conf, false, nil
	}
	entry, _ := json.Marshal(map[string]string{"type": PluginName})
	plugins = append(plugins, entry)
	return conf, true, writeList(conf, list, plugins)
}

// Remove takes the plugin out of every configuration list in confDir, then
// deletes its executable from binDir (in that order: a runtime never finds
// the plugin configured but missing). It returns what it changed.
func Remove(binDir, confDir string) ([]string, error) {
	var changed []string
	entries, err := os.ReadDir(confDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(confDir, e.Name())
		list, plugins, err := readList(p)
		if err != nil {
			continue // not a configuration list: not ours to edit
		}
		i := pluginIndex(plugins)
		if i < 0 {
			continue
		}
		if err := writeList(p, list, append(plugins[:i:i], plugins[i+1:]...)); err != nil {
			return changed, err
		}
		changed = append(changed, p)
	}
	bin := filepath.Join(binDir, PluginName)
	if err := os.Remove(bin); err == nil {
		changed = append(changed, bin)
	} else if !errors.Is(err, os.ErrNotExist) {
		return changed, err
	}
	return changed, nil
}

// readList reads a configuration list, keeping every field it does not
// know as it was.
func readList(path string) (map[string]json.RawMessage, []json.RawMessage, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var list map[string]json.RawMessage
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	raw, ok := list["plugins"]
	if !ok {
		return nil, nil, fmt.Errorf("%s: %w", path, ErrSingleConf)
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(raw, &plugins); err != nil {
		return nil, nil, fmt.Errorf("%s: plugins: %w", path, err)
	}
	return list, plugins, nil
}

func pluginIndex(plugins []json.RawMessage) int {
	for i, p := range plugins {
		var t struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(p, &t) == nil && t.Type == PluginName {
			return i
		}
	}
	return -1
}

// writeList replaces path atomically (a runtime reading it meanwhile sees
// the old or the new list), with its mode.
func writeList(path string, list map[string]json.RawMessage, plugins []json.RawMessage) error {
	p, err := json.Marshal(plugins)
	if err != nil {
		return err
	}
	list["plugins"] = p
	b, err := json.Marshal(list)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	return replaceFile(path, &out, mode)
}

// copyExecutable copies src to dst through a temporary file renamed over
// dst: a runtime executing dst meanwhile runs the old or the new one.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return replaceFile(dst, in, 0o755)
}

func replaceFile(path string, data io.Reader, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
