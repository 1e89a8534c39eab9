package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// readBlob reads a blob of the layout dir and checks it against its digest.
func readBlob(dir string, d descriptor) ([]byte, error) {
	hexd, ok := strings.CutPrefix(d.Digest, "sha256:")
	if !ok || len(hexd) != 64 || strings.ContainsAny(hexd, "/.") {
		return nil, fmt.Errorf("digest %q: want sha256:<64 hex>", d.Digest)
	}
	b, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", hexd))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != hexd || int64(len(b)) != d.Size {
		return nil, fmt.Errorf("blob %s does not match its digest or size", d.Digest)
	}
	return b, nil
}

func readJSON(dir string, d descriptor, v any) error {
	b, err := readBlob(dir, d)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// inspected is what `release inspect` reports of a layout: the image
// index's digest and, per platform, its manifest and its one layer.
type inspected struct {
	ref       string
	index     descriptor
	platforms []inspectedPlatform
}

type inspectedPlatform struct {
	platform string
	manifest descriptor
	layer    descriptor
	entry    []string
}

func inspectLayout(dir string) (inspected, error) {
	var res inspected
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		return res, err
	}
	var top manifest
	if err := json.Unmarshal(b, &top); err != nil {
		return res, err
	}
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != mediaIndex {
		return res, fmt.Errorf("index.json: want one image index, have %d descriptors", len(top.Manifests))
	}
	res.index = top.Manifests[0]
	res.ref = res.index.Annotations["io.containerd.image.name"]
	var index manifest
	if err := readJSON(dir, res.index, &index); err != nil {
		return res, err
	}
	for _, md := range index.Manifests {
		if md.Platform == nil {
			return res, fmt.Errorf("manifest %s names no platform", md.Digest)
		}
		var m manifest
		if err := readJSON(dir, md, &m); err != nil {
			return res, err
		}
		var cfg imageConfig
		if m.Config == nil || len(m.Layers) != 1 {
			return res, fmt.Errorf("manifest %s: want a config and one layer", md.Digest)
		}
		if err := readJSON(dir, *m.Config, &cfg); err != nil {
			return res, err
		}
		if cfg.Architecture != md.Platform.Architecture || cfg.OS != md.Platform.OS {
			return res, fmt.Errorf("manifest %s: its config is for %s/%s", md.Digest, cfg.OS, cfg.Architecture)
		}
		p := md.Platform.OS + "/" + md.Platform.Architecture
		if md.Platform.Variant != "" {
			p += "/" + md.Platform.Variant
		}
		res.platforms = append(res.platforms, inspectedPlatform{
			platform: p, manifest: md, layer: m.Layers[0], entry: cfg.Config.Entrypoint,
		})
	}
	return res, nil
}

// extract returns the content of the regular file name (no leading slash)
// of a gzip-compressed layer.
func extract(layer []byte, name string) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(layer))
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("%s is not in the layer", name)
		}
		if err != nil {
			return nil, err
		}
		if hdr.Name == name && hdr.Typeflag == tar.TypeReg {
			return io.ReadAll(tr)
		}
	}
}

func cmdInspect(args []string) error {
	fs := flag.NewFlagSet("inspect", flag.ExitOnError)
	dir := fs.String("layout", "", "the OCI layout directory")
	plat := fs.String("platform", "", "with -extract: the platform (os/arch[/variant]) whose layer to read")
	name := fs.String("extract", "", "a file of the image to write to -out, e.g. usr/sbin/nft")
	out := fs.String("out", "", "where -extract writes")
	fs.Parse(args)
	res, err := inspectLayout(*dir)
	if err != nil {
		return err
	}
	if *name == "" {
		fmt.Printf("ref %s\nindex %s %d\n", res.ref, res.index.Digest, res.index.Size)
		for _, p := range res.platforms {
			fmt.Printf("platform %s manifest %s layer %s %d entrypoint %s\n",
				p.platform, p.manifest.Digest, p.layer.Digest, p.layer.Size, strings.Join(p.entry, " "))
		}
		return nil
	}
	for _, p := range res.platforms {
		if p.platform != *plat && !strings.HasPrefix(p.platform, *plat+"/") {
			continue
		}
		layer, err := readBlob(*dir, p.layer)
		if err != nil {
			return err
		}
		b, err := extract(layer, strings.TrimPrefix(*name, "/"))
		if err != nil {
			return err
		}
		return writeFileAtomic(*out, b, 0o755)
	}
	return fmt.Errorf("no platform %s in the index", *plat)
}
