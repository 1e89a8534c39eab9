// Package queuerule installs the rule that sends packets to NFQUEUE: it
// probes which variant the kernel supports (the native nft queue statement
// or the xtables NFQUEUE target through nft_compat), writes the xt-compat
// rule over netlink (nft cannot write it), and points a queue chain at other
// queues when one agent hands its traffic to another.
package queuerule
