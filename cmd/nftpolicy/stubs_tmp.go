package main

import "io"

func runCompile(args []string, stdout, stderr io.Writer) int { return exitFailure }
func runAgent(args []string, stdout, stderr io.Writer) int   { return exitFailure }
