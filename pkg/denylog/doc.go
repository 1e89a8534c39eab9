// Package denylog turns the kernel's deny log into one structured log line
// per denied connection.
//
// The ruleset (compile.RenderConfig.DenyLogGroup) sends the first packets
// of denied connections to an NFLOG group, rate limited in the kernel, with
// a short id as the prefix; the group's reader (pkg/nflogread) hands the
// Logger (its Consumer) each message with a deny id, which it maps back to
// the policy and rule through the program in force, resolves the addresses
// to pods or nodes, and logs, rate limited again per (source, destination,
// policy) and overall.
//
// It imports pkg/compile (the program, the deny ids), pkg/queue (the
// packet type) and pkg/nflogread; nothing imports it but the command.
package denylog
