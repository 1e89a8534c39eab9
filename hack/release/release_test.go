package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var epoch = time.Unix(1700000000, 0).UTC()

func mustWrite(t *testing.T, path, content string, perm os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
}

// tree makes a small root filesystem with a file, a directory, a sticky
// directory and a symbolic link, its times set to now.
func tree(t *testing.T, content string) string {
	t.Helper()
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "usr/sbin/nft"), content, 0o755)
	mustWrite(t, filepath.Join(dir, "etc/protocols"), "tcp 6 TCP\n", 0o644)
	if err := os.Symlink("usr/sbin", filepath.Join(dir, "sbin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestLayerReproducible: two trees of equal content made at different
// times give the same layer, whose headers record no owner and only the
// given time.
func TestLayerReproducible(t *testing.T) {
	a := tree(t, "nft")
	time.Sleep(1100 * time.Millisecond)
	b := tree(t, "nft")
	now := time.Now()
	if err := os.Chtimes(filepath.Join(b, "usr/sbin/nft"), now.Add(-time.Hour), now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	layer := func(dir string) []byte {
		entries, err := treeEntries(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		gz, _, err := tarGz(entries, epoch)
		if err != nil {
			t.Fatal(err)
		}
		return gz
	}
	la, lb := layer(a), layer(b)
	if !bytes.Equal(la, lb) {
		t.Fatal("equal trees made at different times gave different layers")
	}
	zr, err := gzip.NewReader(bytes.NewReader(la))
	if err != nil {
		t.Fatal(err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" {
		t.Errorf("gzip header records time %v, name %q", zr.ModTime, zr.Name)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(epoch) ||
			!h.AccessTime.IsZero() || !h.ChangeTime.IsZero() || len(h.PAXRecords) != 0 {
			t.Errorf("%s: header records the build machine: %+v", h.Name, h)
		}
		if h.Name == "tmp/" && h.Mode != 0o1777 {
			t.Errorf("tmp/ mode %o, want 1777", h.Mode)
		}
		if h.Name == "sbin" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/sbin") {
			t.Errorf("sbin: %c -> %q, want a link to usr/sbin", h.Typeflag, h.Linkname)
		}
	}
	want := "etc/ etc/protocols sbin tmp/ usr/ usr/sbin/ usr/sbin/nft"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("entries %q, want %q (sorted)", got, want)
	}
	if bytes.Equal(la, layer(tree(t, "nft2"))) {
		t.Error("a changed file gave the same layer")
	}
}

// TestResolveInStaysInStaging: the packages' absolute links are resolved
// inside the unpacked packages, never on the build machine.
func TestResolveInStaysInStaging(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, filepath.Join(root, "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"), "loader", 0o755)
	for link, target := range map[string]string{
		"lib64/ld-linux-x86-64.so.2": "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
		"usr/lib/x86_64-linux-gnu":   "../../lib/x86_64-linux-gnu",
		"etc/hostpasswd":             "/etc/passwd",
		"lib/loop":                   "/lib/loop",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, link)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	for in, want := range map[string]string{
		"/lib64/ld-linux-x86-64.so.2":                    "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
		"/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2": "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
		"/../../lib64/../lib64/ld-linux-x86-64.so.2":     "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
	} {
		got, err := resolveIn(root, in)
		if err != nil || got != want {
			t.Errorf("resolveIn(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	// /etc/passwd exists on the build machine, not in the staging tree.
	if got, err := resolveIn(root, "/etc/hostpasswd"); err == nil {
		t.Errorf("resolveIn(/etc/hostpasswd) = %q: a link out of the packages was followed onto the build machine", got)
	}
	if _, err := resolveIn(root, "/lib/loop"); err == nil || !strings.Contains(err.Error(), "too many levels") {
		t.Errorf("a link loop: %v", err)
	}
}

// TestRootfsChecksMachine: a program of the wrong architecture (this test's
// own amd64 binary offered as arm64's nft) is refused.
func TestRootfsChecksMachine(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	staging := t.TempDir()
	mustWrite(t, filepath.Join(staging, "usr/sbin/nft"), string(b), 0o755)
	own := arches[goarchOf(t, self)]
	// The test binary may load libraries (cgo): the staging tree gets this
	// machine's, as unpacked packages would hold them.
	f, err := elf.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	libs, _ := f.ImportedLibraries()
	copies := map[string]string{} // staging path -> this machine's file
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			prog.ReadAt(b, 0)
			interp := strings.TrimRight(string(b), "\x00")
			// libc names the loader by its soname too, found in the
			// multiarch directory as in Debian's libc6.
			copies[interp] = interp
			copies["/lib/"+own.triplet+"/"+filepath.Base(interp)] = interp
		}
	}
	f.Close()
	for _, lib := range libs {
		p, err := rootfsSpec{arch: own, staging: "/"}.findLib(lib)
		if err != nil {
			t.Fatal(err)
		}
		copies[p] = p
	}
	for dst, src := range copies {
		c, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, filepath.Join(staging, dst), string(c), 0o755)
	}
	mustWrite(t, filepath.Join(staging, "etc/services"), "http 80/tcp\n", 0o644)
	other := arches["arm64"]
	if own.goarch == "arm64" {
		other = arches["amd64"]
	}
	spec := rootfsSpec{arch: other, staging: staging, out: filepath.Join(t.TempDir(), "rootfs"),
		elfs: []string{"/usr/sbin/nft"}, files: []string{"/etc/services"}, extra: map[string]string{"/nftpolicy": self}}
	if err := buildRootfs(spec); err == nil || !strings.Contains(err.Error(), "is built for") {
		t.Fatalf("a %s program taken for %s: %v", own.goarch, other.goarch, err)
	}
	spec.arch = own
	if err := buildRootfs(spec); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"usr/sbin/nft", "etc/services", "nftpolicy", "etc/passwd"} {
		if _, err := os.Stat(filepath.Join(spec.out, p)); err != nil {
			t.Errorf("rootfs: %v", err)
		}
	}
	if l, err := os.Readlink(filepath.Join(spec.out, "lib")); err != nil || l != "usr/lib" {
		t.Errorf("rootfs /lib: %q, %v; want a link to usr/lib", l, err)
	}
}

func goarchOf(t *testing.T, path string) string {
	t.Helper()
	doc, err := sbomFor(path, "self", epoch)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Split(doc.Packages[0].Comment, "; ") {
		if v, ok := strings.CutPrefix(kv, "GOARCH="); ok {
			return v
		}
	}
	t.Fatal("no GOARCH in the build settings")
	return ""
}

// TestImageIndex: two platforms under one index; the layout reads back
// with every blob matching its digest; rebuilding gives the same digest.
func TestImageIndex(t *testing.T) {
	amd, arm := tree(t, "amd64 nft"), tree(t, "arm64 nft")
	build := func(dir string) descriptor {
		pa, _ := parsePlatform("linux/amd64")
		pb, _ := parsePlatform("linux/arm64")
		d, err := buildImage(imageSpec{
			ref: "ghcr.io/nftpolicy/nftpolicy:v1.2.3", created: epoch, entrypoint: []string{"/nftpolicy"},
			annotations: map[string]string{"org.opencontainers.image.version": "v1.2.3"},
			platforms:   []platformRoot{{pa, amd}, {pb, arm}},
		}, dir)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	dir := filepath.Join(t.TempDir(), "layout")
	d1 := build(dir)
	res, err := inspectLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	if res.index.Digest != d1.Digest || res.ref != "ghcr.io/nftpolicy/nftpolicy:v1.2.3" {
		t.Errorf("index %s %q, want %s", res.index.Digest, res.ref, d1.Digest)
	}
	var plats []string
	for _, p := range res.platforms {
		plats = append(plats, p.platform)
		layer, err := readBlob(dir, p.layer)
		if err != nil {
			t.Fatal(err)
		}
		b, err := extract(layer, "usr/sbin/nft")
		if err != nil {
			t.Fatal(err)
		}
		if want := strings.Split(p.platform, "/")[1] + " nft"; string(b) != want {
			t.Errorf("%s: nft %q, want %q", p.platform, b, want)
		}
	}
	if got := strings.Join(plats, " "); got != "linux/amd64 linux/arm64/v8" {
		t.Errorf("platforms %q", got)
	}
	if d2 := build(filepath.Join(t.TempDir(), "again")); d2.Digest != d1.Digest {
		t.Errorf("rebuilt index %s, first %s", d2.Digest, d1.Digest)
	}
	// A blob changed on disk is caught.
	var top manifest
	b, _ := os.ReadFile(filepath.Join(dir, "index.json"))
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, "blobs/sha256", strings.TrimPrefix(top.Manifests[0].Digest, "sha256:")), "{}", 0o644)
	if _, err := inspectLayout(dir); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("a tampered index blob: %v", err)
	}
}

func TestSBOMAndKrew(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := sbomFor(self, "release.test", epoch)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range doc.Packages {
		names = append(names, p.Name+"@"+p.VersionInfo)
	}
	got := strings.Join(names, " ")
	if !strings.Contains(got, "github.com/nftpolicy/nftpolicy@") || !strings.Contains(got, "stdlib@go") {
		t.Errorf("SBOM packages %s: want the main module and stdlib", got)
	}
	if doc.CreationInfo.Created != "2023-11-14T22:13:20Z" || len(doc.Relationships) != len(doc.Packages) {
		t.Errorf("SBOM created %s, %d relationships for %d packages", doc.CreationInfo.Created, len(doc.Relationships), len(doc.Packages))
	}

	dir := t.TempDir()
	for _, n := range []string{"kubectl-nftpolicy_linux_amd64.tar.gz", "kubectl-nftpolicy_windows_arm64.tar.gz"} {
		mustWrite(t, filepath.Join(dir, n), n, 0o644)
	}
	if _, err := parsePluginArchive(filepath.Join(dir, "kubectl-nftpolicy-linux.tar.gz")); err == nil {
		t.Error("an archive named without os and arch was taken")
	}
	var archives []pluginArchive
	for _, n := range []string{"kubectl-nftpolicy_linux_amd64.tar.gz", "kubectl-nftpolicy_windows_arm64.tar.gz"} {
		a, err := parsePluginArchive(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, a)
	}
	m := krewManifest("v1.2.3", "https://example.invalid/v1.2.3/", archives)
	for _, want := range []string{
		"uri: https://example.invalid/v1.2.3/kubectl-nftpolicy_windows_arm64.tar.gz\n",
		"sha256: " + archives[0].sha256 + "\n", "bin: kubectl-nftpolicy.exe\n", "os: windows\n          arch: arm64\n",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("krew manifest lacks %q:\n%s", want, m)
		}
	}
	sums, err := checksums(dir, "SHA256SUMS")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(sums), "\n"); len(lines) != 2 ||
		!strings.HasSuffix(lines[0], "  kubectl-nftpolicy_linux_amd64.tar.gz") || lines[0][:64] != archives[0].sha256 {
		t.Errorf("checksums:\n%s", sums)
	}
}
