// Package version is the build's identity: the release version and the
// commit it was built from, stamped by the linker (make build passes
// -ldflags "-X github.com/nftpolicy/nftpolicy/pkg/version.Version=...
// -X ...Commit=..." from the VERSION file and git; so do make release and
// the Dockerfile), and the Go version and
// platform of the binary. A plain `go build` or `go install` is not stamped:
// the version is then "unknown" and the commit is the one Go's build
// information records (vcs.revision, with "-dirty" for a modified tree),
// when the build had it.
package version

import (
	"runtime"
	"runtime/debug"
)

// Version and Commit are stamped by the linker (see the package comment);
// read them through Get, which fills in what a build did not stamp.
var (
	Version string
	Commit  string
)

// Unknown is the version and commit of a build that recorded neither.
const Unknown = "unknown"

// Info is what `nftpolicy version -o json` prints; the field names are
// stable (scripts read them).
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns the binary's build information.
func Get() Info {
	return resolve(Version, Commit, debug.ReadBuildInfo)
}

// resolve fills the build information from the stamped values, falling
// back to Go's build information for the commit.
func resolve(v, c string, read func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: v, Commit: c, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if info.Commit == "" {
		info.Commit = vcsCommit(read)
	}
	if info.Version == "" {
		info.Version = Unknown
	}
	if info.Commit == "" {
		info.Commit = Unknown
	}
	return info
}

// vcsCommit is the revision Go's build information records, "" when none.
func vcsCommit(read func() (*debug.BuildInfo, bool)) string {
	bi, ok := read()
	if !ok {
		return ""
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" && dirty {
		rev += "-dirty"
	}
	return rev
}

// String is the one-line form the agent logs and `nftpolicy --version`
// prints.
func (i Info) String() string {
	return "nftpolicy " + i.Version + " (commit " + i.Commit + ", " + i.GoVersion + ", " + i.Platform + ")"
}
