// Package sets owns what the kernel has: it applies desired rulesets of the
// nftpolicy table with knftables, one transaction per sync.
//
// The first sync (and any sync after a failure) is full: every chain of
// the table is flushed and refilled, every set and map deleted and added
// again (so one whose type or flags changed between versions is replaced),
// stale objects deleted, in one transaction; the table itself is never
// deleted, so enforcement has no gap and packets waiting in NFQUEUE are not
// dropped. With Config.Netlink, a full sync over a table that is already
// hooked (a restarted agent, a periodic repair) reads the declarations and
// elements of the kernel's sets over netlink and keeps every set whose
// declaration is the desired one, writing into the same single transaction
// only the elements that differ (or a flush and refill of a set where
// that is as cheap, and of interval sets); the rest is replaced as above
// (resync.go). Later syncs diff the
// desired ruleset against the one last applied and write only the changes:
// pod churn becomes set and map element changes, an edited policy refills
// its own chains. Big sets are never listed from the kernel on this path,
// only on full syncs.
//
// With Config.Netlink, a sync that changes nothing but set and map elements
// (pod churn, the common case) skips nft: NetlinkElements writes the
// deletions and additions, converted from their text form to the bytes nft
// would write, as one nfnetlink batch, which the kernel commits whole or
// not at all. A batch the kernel refuses (the table drifted from what the
// syncer believes) changed nothing; it is counted and the same Sync falls
// back to a full sync. With Config.OneCommandPerSet, full syncs hand nft
// each set's elements as one command instead of one per element. With
// Config.Netlink, a full sync also learns the names of the table's chains,
// sets and maps from a netlink dump of their declarations instead of nft's
// listing, which reads every rule and element; and when the table has no
// base chain yet (a node's first agent), it declares the sets, writes
// their elements in one netlink batch and only then hooks the chains with
// every rule in one nft transaction, so no packet meets a set before it is
// whole (fullfill.go).
//
// With Config.Netlink, a later sync that changes chains too (a policy
// edit, a node's first pod of a combination of policies, a rebuild) is
// also one netlink batch when every change is of a form nlobjects.go
// encodes: regular chains created, flushed, refilled and deleted, the
// compiler's rule forms (set lookups and verdict maps, counter, limit, log,
// accept, drop, jump, goto, comments), the set and map types it declares.
// The bytes are those nft 1.0.6 writes, so `nft list` prints the table as
// if nft had written it. Anything else (a base chain, a timeout set) sends
// the whole sync through nft. This takes nft, about 5 ms per transaction
// however small, off a policy edit's path.
//
// WarmNFT, which the agent wraps around knftables, runs each transaction
// that still needs nft (full syncs, the changes above that netlink does not
// write) in an `nft -f -` process started before it was needed, so it does
// not wait for nft to start; each transaction is still its own nft
// invocation.
//
// It also holds the queue rule variants: the native nft queue statement and,
// for kernels without CONFIG_NFT_QUEUE, the xtables NFQUEUE target installed
// over netlink (nft cannot write it).
package sets
