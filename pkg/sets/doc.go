// Package sets applies desired rulesets of the nftpolicy table to the
// kernel: it keeps what it last applied and writes each new ruleset as one
// transaction holding only the differences.
//
// The first sync (and any sync after a failure) is full: every chain of
// the table is flushed and refilled, every set and map deleted and added
// again (so one whose type or flags changed between versions is replaced),
// stale objects deleted, in one transaction; the table itself is never
// deleted, so enforcement has no gap and packets waiting in NFQUEUE are not
// dropped. With Config.Netlink (a pkg/nftnl connection), a full sync over a
// table that is already hooked (a restarted agent, a periodic repair) reads
// the declarations and elements of the kernel's sets and keeps every set
// whose declaration is the desired one, writing into the same single
// transaction only the elements that differ (or a flush and refill of a set
// where that is as cheap, and of interval sets); the rest is replaced as
// above (resync.go). When the table has no base chain yet (a node's first
// agent), it declares the sets, writes their elements in one netlink batch
// and only then hooks the chains with every rule in one nft transaction, so
// no packet meets a set before it is whole (fullfill.go).
//
// Later syncs diff the desired ruleset against the one last applied and
// write only the changes: pod churn becomes set and map element changes, an
// edited policy refills its own chains (syncer.go, writeDiff). With
// Config.Netlink, those changes are one netlink batch when pkg/nftnl can
// encode every one of them (netlink.go); anything else sends the whole sync
// through nft. A batch the kernel refuses (the table drifted from what the
// syncer believes) changed nothing; it is counted and the same Sync falls
// back to a full sync. ApplyDelta writes a tracker's element changes without
// comparing rulesets (delta.go). With Config.OneCommandPerSet, full syncs
// hand nft each set's elements as one command instead of one per element
// (onecommand.go). Dynamic sets (DNS learning's) keep their elements across
// full syncs (dynamic.go).
//
// WarmNFT, which the agent wraps around knftables, runs each transaction
// that still needs nft in an `nft -f -` process started before it was
// needed, so it does not wait for nft to start; each transaction is still
// its own nft invocation.
package sets
