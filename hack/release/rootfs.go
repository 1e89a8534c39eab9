package main

import (
	"debug/elf"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// arch describes one target architecture of the agent image: its GOARCH,
// the ELF machine every binary and library of its image must be built
// for, and Debian's multiarch directory of its libraries.
type arch struct {
	goarch   string
	machine  elf.Machine
	triplet  string
	platform string
}

var arches = map[string]arch{
	"amd64": {goarch: "amd64", machine: elf.EM_X86_64, triplet: "x86_64-linux-gnu", platform: "linux/amd64"},
	"arm64": {goarch: "arm64", machine: elf.EM_AARCH64, triplet: "aarch64-linux-gnu", platform: "linux/arm64"},
}

// rootfsSpec is what `release rootfs` assembles: the dynamically linked
// programs of staging (Debian packages unpacked with dpkg-deb -x) with the
// shared libraries and loader they need, plain files of staging, and files
// of the build (the static agent) at given paths.
type rootfsSpec struct {
	arch    arch
	staging string
	out     string
	elfs    []string          // paths inside staging
	files   []string          // paths inside staging
	extra   map[string]string // path in the image -> file of the build
}

// usrMerged maps a path to its place in Debian's usr-merged layout, in
// which /bin, /sbin, /lib and /lib64 are links into /usr.
func usrMerged(p string) string {
	for _, d := range []string{"/bin/", "/sbin/", "/lib/", "/lib64/"} {
		if strings.HasPrefix(p, d) {
			return "/usr" + p
		}
	}
	return p
}

// resolveIn resolves p inside root as if root were "/": every symbolic
// link, absolute or relative, at any component, is followed within root,
// never into the build machine's own files (the packages' absolute links
// such as /lib64/ld-linux-x86-64.so.2 name the target's files).
func resolveIn(root, p string) (string, error) {
	todo := strings.Split(strings.TrimPrefix(path.Clean("/"+p), "/"), "/")
	cur := "/"
	for hops := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("%s: too many levels of symbolic links", p)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return cur, nil
}

func buildRootfs(s rootfsSpec) error {
	if err := os.RemoveAll(s.out); err != nil {
		return err
	}
	if err := skeleton(s.out); err != nil {
		return err
	}
	placed := map[string]bool{}
	todo := append([]string(nil), s.elfs...)
	for len(todo) > 0 {
		p := todo[0]
		todo = todo[1:]
		if placed[p] {
			continue
		}
		placed[p] = true
		deps, err := s.placeELF(p)
		if err != nil {
			return err
		}
		todo = append(todo, deps...)
	}
	for _, p := range s.files {
		src, err := resolveIn(s.staging, p)
		if err != nil {
			return err
		}
		if err := copyFile(filepath.Join(s.staging, src), filepath.Join(s.out, usrMerged(p)), 0o644); err != nil {
			return err
		}
	}
	for dst, src := range s.extra {
		if err := copyFile(src, filepath.Join(s.out, dst), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// skeleton makes the directories and account files every agent image has
// (the same as hack/image.sh's).
func skeleton(out string) error {
	for _, d := range []string{"usr/lib", "usr/lib64", "usr/bin", "usr/sbin", "etc", "tmp", "run", "proc", "sys", "dev", "var"} {
		if err := os.MkdirAll(filepath.Join(out, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(out, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(out, "tmp"), os.ModeSticky|0o777); err != nil {
		return err
	}
	for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+d, filepath.Join(out, d)); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(out, "etc/passwd"), []byte("root:x:0:0:root:/:/nftpolicy\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "etc/group"), []byte("root:x:0:\n"), 0o644)
}

// placeELF copies the ELF file p of staging into the image under p's
// usr-merged name, after checking its machine, and returns the staging
// paths of its loader and of the libraries it names (DT_NEEDED).
func (s rootfsSpec) placeELF(p string) ([]string, error) {
	src, err := resolveIn(s.staging, p)
	if err != nil {
		return nil, err
	}
	full := filepath.Join(s.staging, src)
	f, err := elf.Open(full)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	defer f.Close()
	if f.Machine != s.arch.machine {
		return nil, fmt.Errorf("%s is built for %s, not %s", p, f.Machine, s.arch.machine)
	}
	var deps []string
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, prog.Filesz)
		if _, err := prog.ReadAt(b, 0); err != nil {
			return nil, fmt.Errorf("%s: interpreter: %w", p, err)
		}
		deps = append(deps, strings.TrimRight(string(b), "\x00"))
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	for _, lib := range libs {
		found, err := s.findLib(lib)
		if err != nil {
			return nil, fmt.Errorf("%s needs %s: %w", p, lib, err)
		}
		deps = append(deps, found)
	}
	return deps, copyFile(full, filepath.Join(s.out, usrMerged(p)), 0o755)
}

// findLib looks for a library by its soname where the dynamic loader of
// Debian looks for it (the multiarch directories first).
func (s rootfsSpec) findLib(soname string) (string, error) {
	if strings.Contains(soname, "/") {
		return "", fmt.Errorf("library names with a path are not resolved")
	}
	for _, d := range []string{"/lib/" + s.arch.triplet, "/usr/lib/" + s.arch.triplet, "/lib", "/usr/lib"} {
		p := path.Join(d, soname)
		if _, err := resolveIn(s.staging, p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in the unpacked packages (add its package to hack/release/debs.txt)")
}

// copyFile copies src's content to dst (made with perm, its directories
// 0755).
func copyFile(src, dst string, perm os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(dst, b, perm); err != nil {
		return err
	}
	return os.Chmod(dst, perm)
}
