// Command pause is the infrastructure ("sandbox") container of every pod in
// the conformance cluster: it holds the pod's namespaces, reaps the zombies it
// inherits and exits on SIGINT/SIGTERM, like registry.k8s.io/pause.
//
// hack/conformance/tools.sh builds it statically and hack/image.sh wraps it
// as registry.k8s.io/pause:3.10.2. The leading underscore of _gosrc keeps it
// out of the nftpolicy module's ./... patterns.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (nftpolicy conformance)")
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", s)
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
