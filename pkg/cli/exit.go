package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Exit statuses of every command of both binaries.
const (
	// ExitOK: allowed, done, or printed.
	ExitOK = 0
	// ExitFailure: the connection is denied, the wait timed out, or a node
	// failed to answer (--exit-code=false makes denied and timed out 0).
	ExitFailure = 1
	// ExitBadInput: a bad flag, argument, file, kubeconfig, or an object
	// named on the command line that does not exist.
	ExitBadInput = 2
	// ExitUnreachable: the API server could not be reached or refused the
	// request (connection, authentication, authorization).
	ExitUnreachable = 3
)

// ExitCodes is the table of exit statuses, for the commands' help.
const ExitCodes = `Exit status: 0 allowed or done; 1 denied or timed out (0 with
--exit-code=false); 2 bad input (flags, arguments, files, kubeconfig, an
object that does not exist); 3 the API server cannot be reached or refuses
the request.`

// ParseFlags parses a subcommand's flags. It returns ok=false with the exit
// code when the command must stop: 0 after --help, 2 for bad flags (with the
// error and the usage on stderr).
func ParseFlags(fs *pflag.FlagSet, args []string, stderr io.Writer, usage string) (int, bool) {
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK, false
		}
		fmt.Fprintf(stderr, "nftpolicy: %v\n", err)
		fs.Usage()
		return ExitBadInput, false
	}
	return ExitOK, true
}

// APIErrorCode is the exit status of a failed API request: 2 when the
// object named on the command line does not exist, otherwise 3.
func APIErrorCode(err error) int {
	if apierrors.IsNotFound(err) {
		return ExitBadInput
	}
	return ExitUnreachable
}

// FailCode is the exit status of a denial or a timeout: 1, or 0 when the
// user turned it off with --exit-code=false.
func FailCode(exitCode bool) int {
	if exitCode {
		return ExitFailure
	}
	return ExitOK
}
