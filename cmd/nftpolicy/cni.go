package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/bootcni"
)

// runBootPlugin is the binary run as the chained CNI plugin (executed by
// the runtime under the name bootcni.PluginName, without arguments).
func runBootPlugin(stdin io.Reader, stdout io.Writer) int {
	return bootcni.Run(os.Getenv, stdin, stdout, bootcni.KernelHolder{})
}

const cniInstallUsage = `usage: nftpolicy cni-install [--cni-bin-dir DIR] [--cni-conf-dir DIR]

Installs the boot hold on this node (the DaemonSet's init container runs
it): copies this binary into the CNI plugin directory as nftpolicy-boot
and appends it to the configuration list the runtime uses (the first
*.conflist, *.conf or *.json of the configuration directory), so that a
pod started before the agent's first sync (after a reboot) is held, not
open. Idempotent. See docs/security.md, "The boot window".

A configuration of one plugin (a .conf) cannot be chained: it warns and
succeeds (the agent starts; the boot window stays open on that node).

Exit status: 0 installed (or no configuration to chain into), 1 failed, 2 bad usage.`

// cniDirs are the host's CNI directories as the container mounts them.
type cniDirs struct{ bin, conf string }

func (d *cniDirs) addFlags(fs *pflag.FlagSet, defBin, defConf string) {
	fs.StringVar(&d.bin, "cni-bin-dir", defBin, "the node's CNI plugin directory (/opt/cni/bin), as mounted: where the boot plugin is installed (agent: kept chained while it runs, removed at uninstall)")
	fs.StringVar(&d.conf, "cni-conf-dir", defConf, "the node's CNI configuration directory (/etc/cni/net.d), as mounted")
}

// runCNIInstall is `nftpolicy cni-install`.
func runCNIInstall(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("cni-install", pflag.ContinueOnError)
	var dirs cniDirs
	dirs.addFlags(fs, "/host/opt/cni/bin", "/host/etc/cni/net.d")
	if code, ok := parseFlags(fs, args, stderr, cniInstallUsage); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nftpolicy cni-install: unexpected argument %q\n", fs.Arg(0))
		return exitBadInput
	}
	self, err := os.Executable()
	if err == nil {
		var conf string
		conf, err = bootcni.Install(self, dirs.bin, dirs.conf)
		switch {
		case errors.Is(err, bootcni.ErrSingleConf):
			// The agent must start all the same: it enforces everything
			// but the boot window.
			fmt.Fprintf(stderr, "nftpolicy cni-install: WARNING: %v: pods that start before the agent's first sync after a reboot are not held on this node\n", err)
			err = nil
		case err != nil:
		case conf == "":
			fmt.Fprintf(stdout, "installed %s/%s; no CNI configuration in %s yet: run again once the network plugin wrote it (the agent's restart does)\n",
				dirs.bin, bootcni.PluginName, dirs.conf)
		default:
			fmt.Fprintf(stdout, "installed %s/%s, chained in %s\n", dirs.bin, bootcni.PluginName, conf)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "nftpolicy cni-install: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// removeBootPlugin takes the boot plugin out of the node's CNI
// configuration and plugin directory, if dirs are set. It must run before
// the table goes: a plugin left configured without an agent would hold
// every new pod.
func removeBootPlugin(stdout io.Writer, dirs cniDirs) error {
	if dirs.conf == "" || dirs.bin == "" {
		return nil
	}
	changed, err := bootcni.Remove(dirs.bin, dirs.conf)
	for _, p := range changed {
		if filepath.Dir(p) == filepath.Clean(dirs.bin) {
			fmt.Fprintf(stdout, "removed %s\n", p)
		} else {
			fmt.Fprintf(stdout, "removed %s from %s\n", bootcni.PluginName, p)
		}
	}
	if err != nil {
		return fmt.Errorf("removing the boot plugin: %w", err)
	}
	return nil
}
