package version

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func buildInfo(settings ...string) func() (*debug.BuildInfo, bool) {
	return func() (*debug.BuildInfo, bool) {
		bi := &debug.BuildInfo{}
		for i := 0; i+1 < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi, true
	}
}

func TestResolve(t *testing.T) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		name, v, c string
		read       func() (*debug.BuildInfo, bool)
		want       Info
	}{
		{"stamped", "v1.2.3", "abc123", buildInfo("vcs.revision", "fff"),
			Info{"v1.2.3", "abc123", runtime.Version(), platform}},
		{"vcs fallback", "", "", buildInfo("vcs.revision", "fff", "vcs.modified", "false"),
			Info{Unknown, "fff", runtime.Version(), platform}},
		{"vcs dirty", "v1", "", buildInfo("vcs.revision", "fff", "vcs.modified", "true"),
			Info{"v1", "fff-dirty", runtime.Version(), platform}},
		{"nothing", "", "", func() (*debug.BuildInfo, bool) { return nil, false },
			Info{Unknown, Unknown, runtime.Version(), platform}},
	} {
		if got := resolve(tc.v, tc.c, tc.read); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
