package bench

import "github.com/nftpolicy/nftpolicy/tests/internal/inproc"

// quiet discards logs: the in-process agent's logger.
var quiet = inproc.Quiet
