// Package conntrack cuts connections that a policy change denies.
//
// The ruleset accepts `ct state established,related` before any policy is
// consulted, so a connection admitted under yesterday's policies would
// keep flowing after a change that denies it. After each publication the
// agent hands the previous and the new program to a Revoker. It works out
// from the delta which local pod addresses' decisions may have changed
// (Affected: pods whose isolating NetworkPolicies or ClusterNetworkPolicies
// changed in content or membership, new pods, reused addresses), and when
// there are any it dumps the conntrack table once over ctnetlink, decides
// each entry touching such an address with both programs, and deletes
// exactly the entries allowed before and denied now. The next packet of a
// deleted flow is a new connection to the kernel, which drops it. Nothing
// runs on a timer and no entry that is still allowed is touched.
//
// The package decides through a DecideFunc (the agent passes the queue
// evaluator's) so that it depends on pkg/compile only.
package conntrack
