// Package wire connects DNS learning (pkg/fqdn) to the kernel.
//
// It adapts the netlink element writer of pkg/sets and an NFQUEUE runtime
// of pkg/queue on the DNS queue to pkg/fqdn's interfaces. The agent and the
// in-process test agent both use it; pkg/fqdn itself stays free of those
// packages.
package wire
