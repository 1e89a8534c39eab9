package main

import "io"

func runAgent(args []string, stdout, stderr io.Writer) int { return exitFailure }
