package main

import (
	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// addBudgetFlags adds the cost budgets' flags (compile.Budgets): the
// agent's, and explain's, whose program must reject what the agent's
// does.
func addBudgetFlags(fs *pflag.FlagSet, b *compile.Budgets) {
	fs.IntVar(&b.Policy, "policy-cost-budget", compile.DefaultPolicyBudget,
		"what one NetworkPolicy may make: its entries, the pods its selectors are matched against and its peer sets' elements (docs/security.md); over it, the build stops and the policy is enforced fail-closed (it isolates its pods and allows nothing) and reported")
	fs.IntVar(&b.Namespace, "namespace-cost-budget", compile.DefaultNamespaceBudget,
		"what the NetworkPolicies of one namespace may make together, counted as --policy-cost-budget; built in name order, a policy over what its namespace has left is enforced fail-closed and reported")
	fs.IntVar(&b.ClusterPolicy, "cluster-policy-cost-budget", compile.DefaultClusterPolicyBudget,
		"what one ClusterNetworkPolicy may make, counted as --policy-cost-budget (and the nodes its nodes peers are matched against); over it, its Accept rules match nothing and its Deny and Pass rules deny, and it is reported")
}
