// Package verify checks, at run time, that the kernel decides new
// connections as the policy model does.
//
// The ruleset (compile.RenderConfig.Verify) sends a sample of the first
// packets of new connections, at the rule that decided them, allowed or
// denied, to an NFLOG group, with a short id of that rule as the prefix,
// bounded per source address in the kernel. The group's reader
// (pkg/nflogread) hands the Verifier (its Consumer) each sample; it
// decides each sampled connection again with the evaluator (the program
// the kernel ruleset was rendered from) and compares the verdict of the
// sampled direction with the kernel's. A disagreement is confirmed once
// more after a short settling time, against the program then in force
// (the program may lag the kernel by the refresh delay after incremental
// changes), then counted and logged with the packet, both verdicts, the
// model's reason and the kernel's deciding rule.
//
// It imports pkg/compile (the program, the decision ids), pkg/evaluate
// (the verdict type), pkg/queue (the packet type), pkg/nflogread and
// pkg/denylog (endpoint names); nothing imports it but the command.
package verify
