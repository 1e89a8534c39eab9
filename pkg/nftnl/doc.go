// Package nftnl is the nftables netlink codec of the nftpolicy table: it
// encodes changes (set and map elements, chains, rules, set declarations)
// into nfnetlink batches the kernel commits whole or not at all, writes
// them, and reads back the table's objects and set elements.
//
// It encodes the compiler's typed values (compile.TableRule, Element,
// RuleVerdict), never rule text. The bytes are those nft 1.0.6 writes for
// their printing, so that `nft list` prints the table as if nft had
// written it and a later read-back finds no difference (the kernel tests
// compare both ways of writing). What it cannot express in those bytes (a
// typeof declaration, a base chain, a rule with an expression of a kind
// only nft writes, compile.ExprNft and the meters and sampling) is
// ErrUnsupported: the caller writes it with nft instead.
//
// Files: conn.go (the connection, Write), batch.go and acks.go (a batch's
// encoding and its acknowledgements), elements.go and keys.go (typed
// elements, compile.Element, to kernel bytes and back), objects.go and rules.go (chains, sets, rules),
// readback.go and listing.go (dumps), timed.go (DNS learning's elements
// with timeouts).
package nftnl
