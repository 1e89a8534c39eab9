// Package config owns the agent's configuration: the versioned
// AgentConfiguration (nftpolicy.io/v1alpha1) read from --config, its
// defaults, its validation and the command-line flags bound to its fields,
// so that a setting has one default and one check whether it comes from the
// file or a flag. A flag given on the command line wins over the file.
//
// The package imports nothing of the kernel side (netlink, nftables,
// NFQUEUE, NFLOG): it is read by the agent, by `nftpolicy compile` and by
// the generator of docs/config.md (hack/configdoc). The defaults of the
// packages that consume a setting are checked against Default by the
// agent's tests.
package config
