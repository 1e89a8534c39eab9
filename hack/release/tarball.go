package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// entry is one member of a reproducible tar stream: its name in the
// archive and the file on disk it comes from.
type entry struct {
	name string
	path string
}

// treeEntries lists dir's contents as archive entries named relative to
// dir (prefixed with prefix when it is not empty), in byte order of their
// names so that two walks of equal trees give equal archives.
func treeEntries(dir, prefix string) ([]entry, error) {
	var out []entry
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		name := filepath.ToSlash(rel)
		if prefix != "" {
			name = prefix + "/" + name
		}
		out = append(out, entry{name: name, path: p})
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, err
}

// writeTar writes entries as a tar stream whose bytes depend only on the
// entries' names, contents, permission bits and link targets: owners are
// 0:0 without names, every time is mtime, and no access or change times or
// extended attributes of the build machine are recorded.
func writeTar(w io.Writer, entries []entry, mtime time.Time) error {
	tw := tar.NewWriter(w)
	for _, e := range entries {
		if err := writeTarEntry(tw, e, mtime); err != nil {
			return err
		}
	}
	return tw.Close()
}

func writeTarEntry(tw *tar.Writer, e entry, mtime time.Time) error {
	fi, err := os.Lstat(e.path)
	if err != nil {
		return err
	}
	hdr := &tar.Header{
		Name:    e.name,
		Mode:    int64(fi.Mode().Perm()),
		ModTime: mtime,
		Format:  tar.FormatPAX,
	}
	if fi.Mode()&fs.ModeSticky != 0 {
		hdr.Mode |= 0o1000
	}
	if fi.Mode()&fs.ModeSetuid != 0 || fi.Mode()&fs.ModeSetgid != 0 {
		return fmt.Errorf("%s: set-user-ID or set-group-ID files are refused in a release", e.path)
	}
	switch {
	case fi.Mode().IsRegular():
		hdr.Typeflag = tar.TypeReg
		hdr.Size = fi.Size()
	case fi.IsDir():
		hdr.Typeflag = tar.TypeDir
		hdr.Name = strings.TrimSuffix(e.name, "/") + "/"
	case fi.Mode()&fs.ModeSymlink != 0:
		hdr.Typeflag = tar.TypeSymlink
		if hdr.Linkname, err = os.Readlink(e.path); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%s: %s files are not archived", e.path, fi.Mode().Type())
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil
	}
	f, err := os.Open(e.path)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(tw, f)
	if err == nil && n != hdr.Size {
		err = fmt.Errorf("%s changed while it was archived", e.path)
	}
	return err
}

// gzipBytes compresses b with a gzip header that names no file and no
// time, so the result depends on b alone (for one Go version).
func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarGz returns the gzip-compressed tar of entries and the uncompressed
// tar's bytes (an OCI layer's diff ID is the digest of the latter).
func tarGz(entries []entry, mtime time.Time) (gz, raw []byte, err error) {
	var buf bytes.Buffer
	if err := writeTar(&buf, entries, mtime); err != nil {
		return nil, nil, err
	}
	gz, err = gzipBytes(buf.Bytes())
	return gz, buf.Bytes(), err
}

// writeFileAtomic writes b to path through a temporary file in its
// directory, so a reader never sees half a file.
func writeFileAtomic(path string, b []byte, perm fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, perm); err != nil {
		return err
	}
	if err := os.Chmod(tmp, perm); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
