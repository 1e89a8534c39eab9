package main

import (
	"io"

	"github.com/nftpolicy/nftpolicy/pkg/cli"
)

// status and wait run on an operator's machine: they live in pkg/cli,
// shared with the kubectl plugin (cmd/kubectl-nftpolicy).

func runStatus(args []string, stdout, stderr io.Writer) int { return cli.Status(args, stdout, stderr) }

func runWait(args []string, stdout, stderr io.Writer) int { return cli.Wait(args, stdout, stderr) }
