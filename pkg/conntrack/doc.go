// Package conntrack cuts connections that a policy change denies.
//
// The ruleset accepts `ct state established,related` before any policy is
// consulted, so a connection admitted under yesterday's policies would
// keep flowing after a change that denies it. After each publication the
// agent hands the previous and the new program to a Revoker. It works out
// from the delta which local pod addresses' decisions may have changed
// (Affected: pods whose isolating NetworkPolicies or ClusterNetworkPolicies
// changed in content or membership, domain names included, new pods,
// reused addresses), and when there are any it streams the conntrack table
// once over ctnetlink, decides each entry touching such an address with
// both programs as it arrives, and deletes exactly the entries allowed
// before and denied now. Every protocol is judged, as the ruleset judges
// every protocol's first packet: ICMP and ICMPv6 echoes and the protocols
// without ports are decided as connections without ports (Forwarded). The next packet of a deleted flow is a new
// connection to the kernel, which drops it. Nothing runs on a timer and no
// entry that is still allowed is touched. A pass keeps no entry: its
// memory does not grow with the table, which pods can inflate (dump.go).
//
// The package decides through a DecideFunc so that it depends on
// pkg/compile only. The agent passes the queue evaluator's
// (Evaluator.DecideSides), which decides domainNames peers from what the
// pods resolved: a flow admitted only by a name is revoked when the rule
// no longer names it, and kept while a remaining name still admits it.
package conntrack
