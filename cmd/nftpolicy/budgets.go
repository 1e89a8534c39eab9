package main

import (
	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/config"
)

// compileBudgets converts the configuration's budgets.
func compileBudgets(b config.CostBudgets) compile.Budgets {
	return compile.Budgets{Policy: b.Policy, Namespace: b.Namespace, ClusterPolicy: b.ClusterPolicy}
}
