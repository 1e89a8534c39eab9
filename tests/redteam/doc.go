// Package redteam enacts, on the real kernel, the attacks that pods and
// namespace users can make on a node's agent (docs/security.md), each the
// way an attacker would: raw sockets, forged and spoofed DNS replies, small
// TCP segments, floods, pathological policies. Every test asserts that its
// attack fails; each was shown to succeed on the code without its defence
// (the commit that added the defence says how).
//
// The suite builds its nodes and pods as network namespaces (tests/internal/lab
// and netlab), needs root and skips without it, and never touches
// the caller's namespace, firewall or routes. Floods are bounded in count
// and time. `make test` runs it; `go test ./tests/redteam -run NAME -v`
// runs one attack.
package redteam
