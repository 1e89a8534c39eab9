package kubeenv

import "syscall"

// sysProcAttr makes the kernel kill a child if the test process dies without
// running its cleanups (e.g. a panic or go test -timeout).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
