// Package tablewatch reads the kernel's nftables notifications (netlink
// group NFNLGRP_NFTABLES, what `nft monitor` reads) in one network
// namespace and reports each committed transaction that changed one inet
// table and was not made by this agent: an outside change (`nft flush
// ruleset`, a reloaded firewall service, an administrator's edit), which
// the caller repairs at once instead of at its next periodic full sync.
//
// It owns no table state and writes nothing: it says that something
// outside changed the table and what, not what the table should hold.
package tablewatch
