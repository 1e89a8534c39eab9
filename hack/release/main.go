// Command release builds the artifacts of an nftpolicy release
// reproducibly (hack/release.sh drives it; make release): root filesystems
// of the agent image from Debian packages of each architecture, the image
// as one OCI image index, tar.gz archives of the kubectl plugin, SPDX SBOMs
// of the Go binaries, krew's plugin manifest and the checksums file. Every
// output depends only on its inputs and -epoch (SOURCE_DATE_EPOCH): no
// time, owner or order of the build machine is recorded. Standard library
// only, so the release tooling adds no dependency.
//
//	release rootfs -arch arm64 -staging DIR -out DIR -elf /usr/sbin/nft -file /etc/protocols -add /nftpolicy=FILE
//	release image -ref REPO:TAG -epoch N -entrypoint /nftpolicy -platform linux/amd64=ROOTFS... -layout DIR [-archive FILE]
//	release inspect -layout DIR [-platform linux/arm64 -extract PATH -out FILE]
//	release targz -epoch N -out FILE NAME=FILE|DIR...
//	release sbom -epoch N -name NAME -out FILE BINARY
//	release krew -version V -url-base URL -out FILE ARCHIVE...
//	release sums -dir DIR -out FILE
//	release chart-sync [-in install.yaml -out charts/nftpolicy/templates/install.yaml]
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

// list is a repeatable string flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

var commands = map[string]func([]string) error{
	"rootfs":     cmdRootfs,
	"image":      cmdImage,
	"inspect":    cmdInspect,
	"targz":      cmdTargz,
	"sbom":       cmdSBOM,
	"krew":       cmdKrew,
	"sums":       cmdSums,
	"chart-sync": cmdChartSync,
}

func main() {
	if len(os.Args) < 2 || commands[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: release rootfs|image|inspect|targz|sbom|krew|sums|chart-sync [flags] (see hack/release/main.go)")
		os.Exit(2)
	}
	if err := commands[os.Args[1]](os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "release %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// splitPair reads "key=value".
func splitPair(s string) (string, string, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" || v == "" {
		return "", "", fmt.Errorf("%q: want KEY=VALUE", s)
	}
	return k, v, nil
}

func epochFlag(fs *flag.FlagSet) *int64 {
	return fs.Int64("epoch", -1, "SOURCE_DATE_EPOCH: the time recorded in every output")
}

func epochTime(e int64) (time.Time, error) {
	if e < 0 {
		return time.Time{}, fmt.Errorf("-epoch is required")
	}
	return time.Unix(e, 0).UTC(), nil
}

func cmdRootfs(args []string) error {
	fs := flag.NewFlagSet("rootfs", flag.ExitOnError)
	archName := fs.String("arch", "", "GOARCH of the image: amd64 or arm64")
	var spec rootfsSpec
	var elfs, files, adds list
	fs.StringVar(&spec.staging, "staging", "", "the unpacked packages")
	fs.StringVar(&spec.out, "out", "", "the root filesystem to make (replaced)")
	fs.Var(&elfs, "elf", "a program of staging, with its libraries (repeatable)")
	fs.Var(&files, "file", "a plain file of staging (repeatable)")
	fs.Var(&adds, "add", "IMAGEPATH=FILE: a file of the build (repeatable)")
	fs.Parse(args)
	a, ok := arches[*archName]
	if !ok || spec.staging == "" || spec.out == "" {
		return fmt.Errorf("need -arch amd64|arm64, -staging and -out")
	}
	spec.arch, spec.elfs, spec.files, spec.extra = a, elfs, files, map[string]string{}
	for _, s := range adds {
		k, v, err := splitPair(s)
		if err != nil {
			return err
		}
		spec.extra[k] = v
	}
	return buildRootfs(spec)
}

func cmdImage(args []string) error {
	fs := flag.NewFlagSet("image", flag.ExitOnError)
	ref := fs.String("ref", "", "the image's name, repository:tag")
	epoch := epochFlag(fs)
	dir := fs.String("layout", "", "the OCI layout directory to write (replaced)")
	archive := fs.String("archive", "", "also write the layout as this oci-archive tarball")
	var entry, plats, annos list
	fs.Var(&entry, "entrypoint", "an entrypoint argument (repeatable)")
	fs.Var(&plats, "platform", "OS/ARCH=ROOTFS (repeatable)")
	fs.Var(&annos, "annotation", "KEY=VALUE on the index and manifests (repeatable)")
	fs.Parse(args)
	created, err := epochTime(*epoch)
	if err != nil {
		return err
	}
	if !strings.Contains(*ref, ":") || *dir == "" || len(entry) == 0 || len(plats) == 0 {
		return fmt.Errorf("need -ref REPO:TAG, -layout, -entrypoint and -platform")
	}
	spec := imageSpec{ref: *ref, created: created, entrypoint: entry, annotations: map[string]string{}}
	for _, a := range annos {
		k, v, err := splitPair(a)
		if err != nil {
			return err
		}
		spec.annotations[k] = v
	}
	for _, p := range plats {
		k, v, err := splitPair(p)
		if err != nil {
			return err
		}
		pl, err := parsePlatform(k)
		if err != nil {
			return err
		}
		spec.platforms = append(spec.platforms, platformRoot{platform: pl, rootfs: v})
	}
	index, err := buildImage(spec, *dir)
	if err != nil {
		return err
	}
	if *archive != "" {
		if err := archiveLayout(*dir, *archive, created); err != nil {
			return err
		}
	}
	fmt.Println(index.Digest)
	return nil
}

func cmdTargz(args []string) error {
	fs := flag.NewFlagSet("targz", flag.ExitOnError)
	epoch := epochFlag(fs)
	out := fs.String("out", "", "the archive to write")
	fs.Parse(args)
	mtime, err := epochTime(*epoch)
	if err != nil {
		return err
	}
	var entries []entry
	for _, a := range fs.Args() {
		k, v, err := splitPair(a)
		if err != nil {
			return err
		}
		entries = append(entries, entry{name: k, path: v})
		if fi, err := os.Stat(v); err == nil && fi.IsDir() {
			tree, err := treeEntries(v, k)
			if err != nil {
				return err
			}
			entries = append(entries, tree...)
		}
	}
	if *out == "" || len(entries) == 0 {
		return fmt.Errorf("need -out and NAME=FILE arguments")
	}
	gz, _, err := tarGz(entries, mtime)
	if err != nil {
		return err
	}
	return writeFileAtomic(*out, gz, 0o644)
}

func cmdSBOM(args []string) error {
	fs := flag.NewFlagSet("sbom", flag.ExitOnError)
	epoch := epochFlag(fs)
	name := fs.String("name", "", "the binary's name in the release")
	out := fs.String("out", "", "the SPDX JSON file to write")
	fs.Parse(args)
	created, err := epochTime(*epoch)
	if err != nil {
		return err
	}
	if *name == "" || *out == "" || fs.NArg() != 1 {
		return fmt.Errorf("need -name, -out and one binary")
	}
	return writeSBOM(fs.Arg(0), *name, *out, created)
}

func cmdKrew(args []string) error {
	fs := flag.NewFlagSet("krew", flag.ExitOnError)
	version := fs.String("version", "", "the release's version")
	urlBase := fs.String("url-base", "", "where the archives are downloaded from")
	out := fs.String("out", "", "the manifest to write")
	fs.Parse(args)
	if *version == "" || *urlBase == "" || *out == "" || fs.NArg() == 0 {
		return fmt.Errorf("need -version, -url-base, -out and archives")
	}
	var archives []pluginArchive
	for _, p := range fs.Args() {
		a, err := parsePluginArchive(p)
		if err != nil {
			return err
		}
		archives = append(archives, a)
	}
	return writeFileAtomic(*out, []byte(krewManifest(*version, *urlBase, archives)), 0o644)
}

func cmdSums(args []string) error {
	fs := flag.NewFlagSet("sums", flag.ExitOnError)
	dir := fs.String("dir", "", "the release directory")
	out := fs.String("out", "SHA256SUMS", "the checksums file, relative to -dir")
	fs.Parse(args)
	if *dir == "" {
		return fmt.Errorf("need -dir")
	}
	s, err := checksums(*dir, *out)
	if err != nil {
		return err
	}
	return writeFileAtomic(*dir+"/"+*out, []byte(s), 0o644)
}
