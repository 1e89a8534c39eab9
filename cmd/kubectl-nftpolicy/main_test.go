package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// kernelSide are the import paths the plugin must not link: the kernel
// side of the agent (they are Linux-only and make the binary large) and
// the packages built on them.
var kernelSide = []string{
	"github.com/mdlayher/netlink",
	"github.com/google/nftables",
	"sigs.k8s.io/knftables",
	"github.com/ti-mo/conntrack",
	"github.com/ti-mo/netfilter",
	"github.com/florianl/go-nfqueue",
	"github.com/florianl/go-nflog",
	"github.com/vishvananda/netlink",
	"github.com/nftpolicy/nftpolicy/pkg/compile",
	"github.com/nftpolicy/nftpolicy/pkg/conntrack",
	"github.com/nftpolicy/nftpolicy/pkg/nftnl",
	"github.com/nftpolicy/nftpolicy/pkg/queue",
	"github.com/nftpolicy/nftpolicy/pkg/queuerule",
	"github.com/nftpolicy/nftpolicy/pkg/sets",
	"github.com/nftpolicy/nftpolicy/pkg/controller",
}

// typedAPIs are the typed clientsets and API types: every group's
// generated code, most of a binary that links them. The plugin reads the
// few fields it needs through the dynamic client (pkg/status).
var typedAPIs = []string{
	"k8s.io/api",
	"k8s.io/client-go/kubernetes",
	"k8s.io/client-go/discovery",
	"k8s.io/client-go/applyconfigurations",
	"sigs.k8s.io/network-policy-api",
}

// The plugin's dependencies, for every OS it ships for, hold nothing of
// the kernel side nor the typed API clients.
func TestNoKernelDependencies(t *testing.T) {
	for _, goos := range []string{"linux", "darwin", "windows"} {
		cmd := exec.Command("go", "list", "-deps", ".")
		cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("GOOS=%s go list -deps: %v\n%s", goos, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, bad := range append(kernelSide, typedAPIs...) {
				if dep == bad || strings.HasPrefix(dep, bad+"/") {
					t.Errorf("GOOS=%s: the plugin imports %s", goos, dep)
				}
			}
		}
	}
}

// explain, eval, compile and preview run with the nftpolicy binary from
// PATH, with the same arguments, standard streams and exit status.
func TestDelegatedCommands(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the stand-in nftpolicy is a shell script")
	}
	dir := t.TempDir()
	script := "#!/bin/sh\necho \"args: $*\"\nexit 3\n"
	if err := os.WriteFile(filepath.Join(dir, "nftpolicy"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	var out, errb bytes.Buffer
	if code := run([]string{"explain", "x/a", "x/b", "--port", "80"}, nil, &out, &errb); code != 3 {
		t.Errorf("exit %d, want the binary's 3; stderr: %s", code, errb.String())
	}
	if got, want := out.String(), "args: explain x/a x/b --port 80\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	t.Setenv("PATH", t.TempDir())
	out.Reset()
	errb.Reset()
	if code := run([]string{"compile"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "compile needs the nftpolicy binary on PATH") {
		t.Errorf("without nftpolicy: exit %d, stderr %q", code, errb.String())
	}
	if code := run([]string{"agent"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "agent"`) {
		t.Errorf("agent: exit %d, stderr %q", code, errb.String())
	}
}
