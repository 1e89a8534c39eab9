package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// addBudgetFlags adds the cost budgets' flags (compile.Budgets): the
// agent's, and explain's, whose program must reject what the agent's
// does. A budget is at least 1: a zero or negative one is refused when the
// flags are parsed, not replaced by the default.
func addBudgetFlags(fs *pflag.FlagSet, b *compile.Budgets) {
	b.Policy, b.Namespace, b.ClusterPolicy = compile.DefaultPolicyBudget, compile.DefaultNamespaceBudget, compile.DefaultClusterPolicyBudget
	fs.Var((*budgetValue)(&b.Policy), "policy-cost-budget",
		"what one NetworkPolicy may make: its entries, the pods its selectors are matched against and its peer sets' elements (docs/security.md); over it, the build stops and the policy is enforced fail-closed (it isolates its pods and allows nothing) and reported")
	fs.Var((*budgetValue)(&b.Namespace), "namespace-cost-budget",
		"what the NetworkPolicies of one namespace may make together, counted as --policy-cost-budget; built in name order, a policy over what its namespace has left is enforced fail-closed and reported")
	fs.Var((*budgetValue)(&b.ClusterPolicy), "cluster-policy-cost-budget",
		"what one ClusterNetworkPolicy may make, counted as --policy-cost-budget (and the nodes its nodes peers are matched against); over it, its Accept rules match nothing and its Deny and Pass rules deny, and it is reported")
}

// budgetValue is a cost budget flag: a whole number of at least 1.
type budgetValue int

func (v *budgetValue) String() string { return strconv.Itoa(int(*v)) }

func (v *budgetValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("not a whole number")
	}
	if n < 1 {
		return fmt.Errorf("a budget is at least 1")
	}
	*v = budgetValue(n)
	return nil
}

func (v *budgetValue) Type() string { return "int" }
