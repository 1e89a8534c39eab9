package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/version"
)

// runVersion prints the build's version, commit, Go version and platform:
// one line of text, or with -o json an object with version.Info's fields.
func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("version", pflag.ContinueOnError)
	output := fs.StringP("output", "o", "text", "output format: text or json")
	if code, ok := parseFlags(fs, args, stderr, "usage: nftpolicy version [-o text|json]\n\nPrints the version, commit, Go version and platform of this binary."); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nftpolicy version: unexpected argument %q\n", fs.Arg(0))
		return exitBadInput
	}
	info := version.Get()
	switch *output {
	case "text":
		fmt.Fprintln(stdout, info)
	case "json":
		b, err := json.MarshalIndent(info, "", "  ")
		if err != nil {
			fmt.Fprintf(stderr, "nftpolicy version: %v\n", err)
			return exitFailure
		}
		fmt.Fprintf(stdout, "%s\n", b)
	default:
		fmt.Fprintf(stderr, "nftpolicy version: -o %q: must be text or json\n", *output)
		return exitBadInput
	}
	return exitOK
}
