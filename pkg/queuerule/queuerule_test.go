package queuerule

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// fakeProber answers ChooseQueueVariant's questions.
type fakeProber struct {
	native, compat       bool
	nativeErr, compatErr error
	compatAsked          bool
}

func (p *fakeProber) NativeQueue(context.Context) (bool, error) { return p.native, p.nativeErr }
func (p *fakeProber) CompatQueue(context.Context) (bool, error) {
	p.compatAsked = true
	return p.compat, p.compatErr
}

func TestChooseQueueVariant(t *testing.T) {
	broken := errors.New("nft: syntax error")
	for _, tc := range []struct {
		name       string
		p          fakeProber
		want       compile.QueueVariant
		wantErr    error
		wantCompat bool // whether the xt probe must have run
	}{
		{name: "native", p: fakeProber{native: true, compat: true}, want: compile.QueueNative},
		{name: "xt-compat only", p: fakeProber{compat: true}, want: compile.QueueXTCompat, wantCompat: true},
		{name: "neither", p: fakeProber{}, wantErr: ErrNoQueueSupport, wantCompat: true},
		{name: "native probe broken", p: fakeProber{nativeErr: broken, compat: true}, wantErr: broken},
		{name: "xt probe broken", p: fakeProber{compatErr: broken}, wantErr: broken, wantCompat: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChooseQueueVariant(context.Background(), &tc.p)
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Errorf("ChooseQueueVariant = %s, %v; want %s, %v", got, err, tc.want, tc.wantErr)
			}
			if tc.p.compatAsked != tc.wantCompat {
				t.Errorf("xt probe asked: %v, want %v", tc.p.compatAsked, tc.wantCompat)
			}
		})
	}
}

// requireKernel skips tests that need root and nft, unless
// NFTPOLICY_REQUIRE_TOOLS is set (as `make test` does), where it fails.
func requireKernel(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "needs root: creates a network namespace and writes nftables rulesets in it"
	} else if _, err := exec.LookPath("nft"); err != nil {
		why = "needs the nft binary: " + err.Error()
	}
	if why == "" {
		return
	}
	if os.Getenv("NFTPOLICY_REQUIRE_TOOLS") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// inScratchNetNS runs fn on a thread moved into a new network namespace
// (its children, such as nft, inherit it); ns is the namespace's fd, for
// netlink sockets. The thread is never unlocked: it ends with its
// goroutine, and the namespace with it.
func inScratchNetNS(t *testing.T, fn func(ns *os.File) error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		ns, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		errc <- fn(ns)
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestKernelQueueProber runs the agent's probe against this kernel, in a
// scratch namespace: it must decide without error, agree with the
// individual probes, and leave no table behind. On a kernel without the
// native queue expression (the machine this was written on) it must pick
// xt-compat, and the xt probe must find the target.
func TestKernelQueueProber(t *testing.T) {
	requireKernel(t)
	inScratchNetNS(t, func(ns *os.File) error {
		ctx := context.Background()
		p := KernelQueueProber{NetNS: ns}
		v, err := ChooseQueueVariant(ctx, p)
		if err != nil {
			return err
		}
		native, err := p.NativeQueue(ctx)
		if err != nil {
			return err
		}
		compat, err := p.CompatQueue(ctx)
		if err != nil {
			return err
		}
		t.Logf("native queue expression: %v, xt NFQUEUE target: %v; chosen: %s", native, compat, v)
		switch {
		case native && v != compile.QueueNative:
			t.Errorf("kernel has the native expression, but %s was chosen", v)
		case !native && v != compile.QueueXTCompat:
			t.Errorf("kernel lacks the native expression, but %s was chosen", v)
		case !native && !compat:
			t.Error("xt-compat chosen, but the xt probe says the target is missing")
		}
		conn, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
		if err != nil {
			return err
		}
		tables, err := conn.ListTables()
		if err != nil {
			return err
		}
		for _, tb := range tables {
			t.Errorf("the probe left table %s behind", tb.Name)
		}
		return nil
	})
}
