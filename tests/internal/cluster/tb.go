package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
)

// ProgramTB lets a program that is not a test (the demo) use Start, which,
// like kubeenv.Start, takes a testing.TB. Log output goes to Out (when
// Verbose) and the failure messages to Err; Fatal, FailNow and Skip panic with
// an internal value that Run recovers. Run then calls the cleanups in reverse
// order, as the testing package does.
type ProgramTB struct {
	testing.TB // nil: only satisfies the interface's unexported method

	Out, Err io.Writer
	Verbose  bool

	mu       sync.Mutex
	name     string
	failed   bool
	skipped  bool
	cleanups []func()
	ctx      context.Context
	cancel   context.CancelFunc
}

// errStop is what Fatal, FailNow and Skip panic with.
var errStop = errors.New("cluster: program stopped")

// NewProgramTB returns a TB named name that logs to stdout and stderr.
func NewProgramTB(name string) *ProgramTB {
	ctx, cancel := context.WithCancel(context.Background())
	return &ProgramTB{Out: os.Stdout, Err: os.Stderr, name: name, ctx: ctx, cancel: cancel}
}

// Run calls fn, recovers a Fatal/Skip, runs the cleanups and returns nil
// when nothing failed.
func (p *ProgramTB) Run(fn func(tb *ProgramTB)) (err error) {
	defer func() {
		if r := recover(); r != nil && r != errStop { //nolint:errorlint // sentinel value
			p.fail()
			fmt.Fprintf(p.Err, "panic: %v\n", r)
		}
		p.cancel()
		p.runCleanups()
		switch {
		case p.Failed():
			err = errors.New(p.name + " failed")
		case p.Skipped():
			err = errors.New(p.name + " skipped")
		}
	}()
	fn(p)
	return nil
}

func (p *ProgramTB) runCleanups() {
	for {
		p.mu.Lock()
		n := len(p.cleanups)
		if n == 0 {
			p.mu.Unlock()
			return
		}
		f := p.cleanups[n-1]
		p.cleanups = p.cleanups[:n-1]
		p.mu.Unlock()
		func() {
			defer func() {
				if r := recover(); r != nil && r != errStop { //nolint:errorlint // sentinel value
					p.fail()
					fmt.Fprintf(p.Err, "panic in cleanup: %v\n", r)
				}
			}()
			f()
		}()
	}
}

func (p *ProgramTB) fail() { p.mu.Lock(); p.failed = true; p.mu.Unlock() }

func (p *ProgramTB) Cleanup(f func())  { p.mu.Lock(); p.cleanups = append(p.cleanups, f); p.mu.Unlock() }
func (p *ProgramTB) Error(args ...any) { p.fail(); fmt.Fprintln(p.Err, args...) }
func (p *ProgramTB) Errorf(format string, args ...any) {
	p.fail()
	fmt.Fprintf(p.Err, format+"\n", args...)
}
func (p *ProgramTB) Fail()        { p.fail() }
func (p *ProgramTB) FailNow()     { p.fail(); panic(errStop) }
func (p *ProgramTB) Failed() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.failed }
func (p *ProgramTB) Fatal(args ...any) {
	p.Error(args...)
	panic(errStop)
}
func (p *ProgramTB) Fatalf(format string, args ...any) {
	p.Errorf(format, args...)
	panic(errStop)
}
func (p *ProgramTB) Helper() {}
func (p *ProgramTB) Log(args ...any) {
	if p.Verbose {
		fmt.Fprintln(p.Out, args...)
	}
}
func (p *ProgramTB) Logf(format string, args ...any) {
	if p.Verbose {
		fmt.Fprintf(p.Out, format+"\n", args...)
	}
}
func (p *ProgramTB) Name() string { return p.name }
func (p *ProgramTB) Setenv(key, value string) {
	prev, had := os.LookupEnv(key)
	_ = os.Setenv(key, value)
	p.Cleanup(func() {
		if had {
			_ = os.Setenv(key, prev)
		} else {
			_ = os.Unsetenv(key)
		}
	})
}
func (p *ProgramTB) Chdir(dir string) {
	prev, err := os.Getwd()
	if err != nil {
		p.Fatal(err)
	}
	if err := os.Chdir(dir); err != nil {
		p.Fatal(err)
	}
	p.Cleanup(func() { _ = os.Chdir(prev) })
}
func (p *ProgramTB) Skip(args ...any) {
	fmt.Fprintln(p.Err, args...)
	p.SkipNow()
}
func (p *ProgramTB) SkipNow() { p.mu.Lock(); p.skipped = true; p.mu.Unlock(); panic(errStop) }
func (p *ProgramTB) Skipf(format string, args ...any) {
	fmt.Fprintf(p.Err, format+"\n", args...)
	p.SkipNow()
}
func (p *ProgramTB) Skipped() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.skipped }
func (p *ProgramTB) TempDir() string {
	dir, err := os.MkdirTemp("", "nftpolicy-"+p.name+"-")
	if err != nil {
		p.Fatal(err)
	}
	p.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
func (p *ProgramTB) ArtifactDir() string      { return p.TempDir() }
func (p *ProgramTB) Attr(key, value string)   {}
func (p *ProgramTB) Context() context.Context { return p.ctx }
func (p *ProgramTB) Output() io.Writer        { return p.Out }
