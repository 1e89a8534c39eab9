package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Media types of the OCI image specification (image-spec v1.1).
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
)

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type imageConfig struct {
	Created      string      `json:"created"`
	Architecture string      `json:"architecture"`
	OS           string      `json:"os"`
	Variant      string      `json:"variant,omitempty"`
	Config       execConfig  `json:"config"`
	RootFS       rootFS      `json:"rootfs"`
	History      []histEntry `json:"history"`
}

type execConfig struct {
	Env        []string          `json:"Env"`
	Entrypoint []string          `json:"Entrypoint"`
	WorkingDir string            `json:"WorkingDir"`
	Labels     map[string]string `json:"Labels,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type histEntry struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

type manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Config        *descriptor       `json:"config,omitempty"`
	Layers        []descriptor      `json:"layers,omitempty"`
	Manifests     []descriptor      `json:"manifests,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// imageSpec is what `release image` builds: one image per platform from a
// root filesystem each, under one index named ref (repository:tag).
type imageSpec struct {
	ref         string
	created     time.Time
	entrypoint  []string
	annotations map[string]string
	platforms   []platformRoot
}

type platformRoot struct {
	platform platform
	rootfs   string
}

// layout collects the blobs of an OCI image layout in memory before it is
// written: a release image is a few megabytes.
type layout struct {
	blobs map[string][]byte
}

func (l *layout) add(media string, b []byte) descriptor {
	sum := sha256.Sum256(b)
	d := "sha256:" + hex.EncodeToString(sum[:])
	l.blobs[d] = b
	return descriptor{MediaType: media, Digest: d, Size: int64(len(b))}
}

func (l *layout) addJSON(media string, v any) (descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return descriptor{}, err
	}
	return l.add(media, b), nil
}

// buildImage writes spec as an OCI image layout in dir: the image index of
// every platform is a blob of its own, and the layout's index.json names
// that index with spec.ref (org.opencontainers.image.ref.name holds the
// tag, io.containerd.image.name the full reference, which `ctr images
// import` takes as the image's name). It returns the image index's
// descriptor: its digest is what a manifest pins.
func buildImage(spec imageSpec, dir string) (descriptor, error) {
	l := &layout{blobs: map[string][]byte{}}
	created := spec.created.UTC().Format(time.RFC3339)
	var manifests []descriptor
	for _, pr := range spec.platforms {
		md, err := buildPlatform(l, spec, pr, created)
		if err != nil {
			return descriptor{}, fmt.Errorf("%s/%s: %w", pr.platform.OS, pr.platform.Architecture, err)
		}
		manifests = append(manifests, md)
	}
	index, err := l.addJSON(mediaIndex, manifest{
		SchemaVersion: 2, MediaType: mediaIndex, Manifests: manifests, Annotations: spec.annotations,
	})
	if err != nil {
		return descriptor{}, err
	}
	named := index
	tag := spec.ref[strings.LastIndex(spec.ref, ":")+1:]
	named.Annotations = map[string]string{
		"org.opencontainers.image.ref.name": tag,
		"io.containerd.image.name":          spec.ref,
	}
	top, err := json.Marshal(manifest{SchemaVersion: 2, MediaType: mediaIndex, Manifests: []descriptor{named}})
	if err != nil {
		return descriptor{}, err
	}
	return index, l.write(dir, top)
}

func buildPlatform(l *layout, spec imageSpec, pr platformRoot, created string) (descriptor, error) {
	entries, err := treeEntries(pr.rootfs, "")
	if err != nil {
		return descriptor{}, err
	}
	gz, raw, err := tarGz(entries, spec.created)
	if err != nil {
		return descriptor{}, err
	}
	diff := sha256.Sum256(raw)
	layer := l.add(mediaLayerGz, gz)
	cfg, err := l.addJSON(mediaConfig, imageConfig{
		Created:      created,
		Architecture: pr.platform.Architecture,
		OS:           pr.platform.OS,
		Variant:      pr.platform.Variant,
		Config: execConfig{
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Entrypoint: spec.entrypoint,
			WorkingDir: "/",
		},
		RootFS:  rootFS{Type: "layers", DiffIDs: []string{"sha256:" + hex.EncodeToString(diff[:])}},
		History: []histEntry{{Created: created, CreatedBy: "hack/release image"}},
	})
	if err != nil {
		return descriptor{}, err
	}
	md, err := l.addJSON(mediaManifest, manifest{
		SchemaVersion: 2, MediaType: mediaManifest, Config: &cfg, Layers: []descriptor{layer},
		Annotations: spec.annotations,
	})
	if err != nil {
		return descriptor{}, err
	}
	p := pr.platform
	md.Platform = &p
	return md, nil
}

// write lays the blobs out under dir (replacing what an earlier build left
// there) with top as index.json.
func (l *layout) write(dir string, top []byte) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for d, b := range l.blobs {
		p := filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
		if err := writeFileAtomic(p, b, 0o644); err != nil {
			return err
		}
	}
	if err := writeFileAtomic(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "index.json"), top, 0o644)
}

// archiveLayout writes the layout directory dir as an oci-archive tarball
// (the layout's files at the archive's top), reproducibly.
func archiveLayout(dir, out string, mtime time.Time) error {
	entries, err := treeEntries(dir, "")
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := writeTar(&buf, entries, mtime); err != nil {
		return err
	}
	return writeFileAtomic(out, buf.Bytes(), 0o644)
}

// parsePlatform reads "os/arch[/variant]"; arm64 gets the variant v8 that
// registries and containerd expect when none is given.
func parsePlatform(s string) (platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return platform{}, fmt.Errorf("platform %q: want os/arch[/variant]", s)
	}
	p := platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	} else if p.Architecture == "arm64" {
		p.Variant = "v8"
	}
	return p, nil
}
