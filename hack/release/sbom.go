package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"time"
)

// SPDX 2.3 JSON (https://spdx.github.io/spdx-spec/v2.3/), the subset an
// SBOM of a Go binary needs: the binary, the main module, every module
// linked in (from the build information Go embeds, as `go version -m`
// prints it) and the Go standard library.
type spdxDoc struct {
	SPDXVersion       string         `json:"spdxVersion"`
	DataLicense       string         `json:"dataLicense"`
	SPDXID            string         `json:"SPDXID"`
	Name              string         `json:"name"`
	DocumentNamespace string         `json:"documentNamespace"`
	CreationInfo      spdxCreation   `json:"creationInfo"`
	Packages          []spdxPackage  `json:"packages"`
	Relationships     []spdxRelation `json:"relationships"`
}

type spdxCreation struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	Name             string         `json:"name"`
	SPDXID           string         `json:"SPDXID"`
	VersionInfo      string         `json:"versionInfo,omitempty"`
	DownloadLocation string         `json:"downloadLocation"`
	FilesAnalyzed    bool           `json:"filesAnalyzed"`
	Checksums        []spdxChecksum `json:"checksums,omitempty"`
	ExternalRefs     []spdxRef      `json:"externalRefs,omitempty"`
	Purpose          string         `json:"primaryPackagePurpose,omitempty"`
	Comment          string         `json:"comment,omitempty"`
}

type spdxChecksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type spdxRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxRelation struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

var spdxIDUnsafe = regexp.MustCompile(`[^A-Za-z0-9.-]`)

func spdxID(kind, name string) string {
	return "SPDXRef-" + kind + "-" + spdxIDUnsafe.ReplaceAllString(name, "-")
}

// sbomFor returns the SPDX document of the Go binary at path, named name in
// the release. Its namespace and time depend only on the binary and
// created, so rebuilding the release gives the same document.
func sbomFor(path, name string, created time.Time) (spdxDoc, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return spdxDoc{}, fmt.Errorf("%s: %w", path, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return spdxDoc{}, err
	}
	sum := sha256.Sum256(b)
	digest := hex.EncodeToString(sum[:])
	binID := spdxID("File", name)
	doc := spdxDoc{
		SPDXVersion:       "SPDX-2.3",
		DataLicense:       "CC0-1.0",
		SPDXID:            "SPDXRef-DOCUMENT",
		Name:              name,
		DocumentNamespace: "https://github.com/nftpolicy/nftpolicy/spdx/" + name + "-" + digest,
		CreationInfo: spdxCreation{
			Created:  created.UTC().Format(time.RFC3339),
			Creators: []string{"Tool: nftpolicy-hack-release"},
		},
	}
	doc.Packages = append(doc.Packages, spdxPackage{
		Name: name, SPDXID: binID, DownloadLocation: "NOASSERTION", Purpose: "APPLICATION",
		Checksums: []spdxChecksum{{Algorithm: "SHA256", Value: digest}},
		Comment:   buildSettings(bi),
	})
	doc.Relationships = append(doc.Relationships, spdxRelation{"SPDXRef-DOCUMENT", "DESCRIBES", binID})
	mods := []module{linked(&bi.Main)}
	for _, d := range bi.Deps {
		mods = append(mods, linked(d))
	}
	mods = append(mods, module{path: "stdlib", version: bi.GoVersion})
	for _, m := range mods {
		p := spdxPackage{
			Name: m.path, SPDXID: spdxID("Package", m.path), VersionInfo: m.version,
			DownloadLocation: "NOASSERTION", Purpose: "LIBRARY",
			ExternalRefs: []spdxRef{{"PACKAGE-MANAGER", "purl", m.purl()}},
		}
		if m.sum != "" {
			p.Comment = "go.sum hash " + m.sum
		}
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, spdxRelation{binID, "CONTAINS", p.SPDXID})
	}
	return doc, nil
}

// module is a module as linked: a replaced module is listed with its
// replacement's path and version, which is the code the binary holds.
type module struct {
	path, version, sum string
}

func linked(m *debug.Module) module {
	for m.Replace != nil {
		m = m.Replace
	}
	return module{path: m.Path, version: m.Version, sum: m.Sum}
}

// purl is the module's package URL (pkg:golang/PATH@VERSION; the standard
// library is pkg:golang/stdlib@goX.Y.Z).
func (m module) purl() string {
	if m.version == "" || m.version == "(devel)" {
		return "pkg:golang/" + m.path
	}
	return "pkg:golang/" + m.path + "@" + m.version
}

// buildSettings records how the binary was built (GOOS, GOARCH, -ldflags
// with the version, the commit): what `go version -m` prints as build lines.
func buildSettings(bi *buildinfo.BuildInfo) string {
	s := "built with " + bi.GoVersion
	for _, kv := range bi.Settings {
		s += "; " + kv.Key + "=" + kv.Value
	}
	return s
}

// writeSBOM writes the document of the binary at path as out.
func writeSBOM(path, name, out string, created time.Time) error {
	doc, err := sbomFor(path, name, created)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Clean(out), append(b, '\n'), 0o644)
}
