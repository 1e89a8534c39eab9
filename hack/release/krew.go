package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// pluginArchive is one archive of the kubectl plugin, named
// kubectl-nftpolicy_<os>_<arch>.tar.gz by hack/release.sh.
type pluginArchive struct {
	os, arch, file, sha256 string
}

func parsePluginArchive(path string) (pluginArchive, error) {
	base := filepath.Base(path)
	rest, ok := strings.CutPrefix(base, "kubectl-nftpolicy_")
	rest, ok2 := strings.CutSuffix(rest, ".tar.gz")
	parts := strings.Split(rest, "_")
	if !ok || !ok2 || len(parts) != 2 {
		return pluginArchive{}, fmt.Errorf("%s: want kubectl-nftpolicy_<os>_<arch>.tar.gz", base)
	}
	sum, err := fileSHA256(path)
	if err != nil {
		return pluginArchive{}, err
	}
	return pluginArchive{os: parts[0], arch: parts[1], file: base, sha256: sum}, nil
}

// krewManifest renders krew's plugin manifest (index.krew.dev's
// plugins/<name>.yaml) for the archives, downloaded from urlBase.
func krewManifest(version, urlBase string, archives []pluginArchive) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: nftpolicy
spec:
  version: %s
  homepage: https://github.com/nftpolicy/nftpolicy
  shortDescription: Explain, preview and watch nftpolicy enforcement
  description: |
    The nftpolicy agent's kubectl plugin: which NetworkPolicies and
    ClusterNetworkPolicies each node enforces (status, wait), why a
    connection is allowed or denied (explain), and what a staged policy
    would change (preview).
  platforms:
`, version)
	for _, a := range archives {
		bin := "kubectl-nftpolicy"
		if a.os == "windows" {
			bin += ".exe"
		}
		fmt.Fprintf(&b, `    - selector:
        matchLabels:
          os: %s
          arch: %s
      uri: %s/%s
      sha256: %s
      bin: %s
      files:
        - from: %s
          to: .
`, a.os, a.arch, strings.TrimSuffix(urlBase, "/"), a.file, a.sha256, bin, bin)
	}
	return b.String()
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// checksums renders `sha256sum` output for every regular file under dir
// but skip, sorted by path, so `sha256sum -c` checks a release.
func checksums(dir, skip string) (string, error) {
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == skip {
			return err
		}
		sum, err := fileSHA256(p)
		if err != nil {
			return err
		}
		lines = append(lines, sum+"  "+filepath.ToSlash(rel)+"\n")
		return nil
	})
	sort.Slice(lines, func(i, j int) bool { return lines[i][66:] < lines[j][66:] })
	return strings.Join(lines, ""), err
}
