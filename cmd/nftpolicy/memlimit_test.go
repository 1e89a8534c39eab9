package main

import (
	"io/fs"
	"testing"
)

func TestMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     string
		files   map[string]string
		want    int64
		source  string
		wantErr bool
	}{
		{name: "nothing", want: 0},
		{name: "env wins over the cgroup", env: "536870912",
			files: map[string]string{"/sys/fs/cgroup/memory.max": "1048576\n"}, want: 536870912, source: "$NFTPOLICY_MEMORY_LIMIT"},
		{name: "env malformed", env: "512Mi", wantErr: true},
		{name: "env zero", env: "0", wantErr: true},
		{name: "cgroup v2, own cgroup", files: map[string]string{
			"/proc/self/cgroup": "0::/kubepods/burstable/pod1/c1\n",
			"/sys/fs/cgroup/kubepods/burstable/pod1/c1/memory.max": "268435456\n",
			"/sys/fs/cgroup/memory.max":                            "max\n",
		}, want: 268435456, source: "/sys/fs/cgroup/kubepods/burstable/pod1/c1/memory.max"},
		{name: "cgroup v2 namespace root", files: map[string]string{
			"/proc/self/cgroup":         "0::/\n",
			"/sys/fs/cgroup/memory.max": "268435456\n",
		}, want: 268435456, source: "/sys/fs/cgroup/memory.max"},
		{name: "cgroup v2 unlimited", files: map[string]string{
			"/proc/self/cgroup":         "0::/\n",
			"/sys/fs/cgroup/memory.max": "max\n",
		}, want: 0, source: "/sys/fs/cgroup/memory.max"},
		{name: "cgroup v1", files: map[string]string{
			"/proc/self/cgroup": "12:cpu,cpuacct:/x\n11:memory:/kubepods/pod2/c2\n",
			"/sys/fs/cgroup/memory/kubepods/pod2/c2/memory.limit_in_bytes": "134217728\n",
		}, want: 134217728, source: "/sys/fs/cgroup/memory/kubepods/pod2/c2/memory.limit_in_bytes"},
		{name: "cgroup v1 unlimited", files: map[string]string{
			"/proc/self/cgroup":                           "11:memory:/\n",
			"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
		}, want: 0, source: "/sys/fs/cgroup/memory/memory.limit_in_bytes"},
		{name: "garbage is skipped", files: map[string]string{
			"/proc/self/cgroup":           "0::/a\n",
			"/sys/fs/cgroup/a/memory.max": "lots\n",
			"/sys/fs/cgroup/memory.max":   "1000000\n",
		}, want: 1000000, source: "/sys/fs/cgroup/memory.max"},
	} {
		t.Run(c.name, func(t *testing.T) {
			getenv := func(k string) string {
				if k == memoryLimitEnv {
					return c.env
				}
				return ""
			}
			read := func(name string) ([]byte, error) {
				if v, ok := c.files[name]; ok {
					return []byte(v), nil
				}
				return nil, fs.ErrNotExist
			}
			got, source, err := memoryLimit(getenv, read)
			if (err != nil) != c.wantErr {
				t.Fatalf("error %v, want error %v", err, c.wantErr)
			}
			if got != c.want || source != c.source {
				t.Errorf("got %d from %q, want %d from %q", got, source, c.want, c.source)
			}
		})
	}
}
