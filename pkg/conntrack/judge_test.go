package conntrack_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	ct "github.com/ti-mo/conntrack"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack/conntracktest"
)

// allowRole admits pods with role=role to the pods of x.
func allowRole(role string) *networkingv1.NetworkPolicy {
	np := allowFrom("x")
	np.Spec.Ingress[0].From[0].PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"role": role}}
	return np
}

// TestPreviewListsWhatRevokeCuts: x's policy moves from admitting
// role=client (y/c1) to role=server (y/c2). Preview reports y/c1's flows
// to both x pods as cut and y/c2's as allowed, deletes nothing, and a
// Revoker given the same programs deletes exactly the flows preview
// reported as cut; a flow denied before and after is in neither list.
func TestPreviewListsWhatRevokeCuts(t *testing.T) {
	current := compile.Build(input("server", allowRole("client")))
	candidate := compile.Build(input("server", allowRole("server")))
	flows := []ct.Flow{
		flow("10.244.2.10", "10.244.1.10", 80), // c1 -> srv: cut
		flow("10.244.2.10", "10.244.1.11", 80), // c1 -> other: cut
		flow("10.244.2.11", "10.244.1.10", 80), // c2 -> srv: allowed now
		flow("10.244.1.11", "10.244.1.10", 80), // other -> srv: denied before and after
		flow("10.244.2.11", "10.9.9.9", 80),    // touches no local pod
	}
	key := func(f *ct.Flow) string {
		return fmt.Sprintf("%s -> %s", f.TupleOrig.IP.SourceAddress, f.TupleOrig.IP.DestinationAddress)
	}
	table := &conntracktest.Table{Flows: flows}
	j := conntrack.Judge{Decide: decide}
	var cut, allowed, policies []string
	res, err := j.Preview(context.Background(), table, current, candidate, func(f *ct.Flow, c conntrack.Conn, ch conntrack.Change, d conntrack.Decision) {
		switch ch {
		case conntrack.Cut:
			cut = append(cut, key(f))
			policies = append(policies, conntrack.DecidingPolicy(candidate, c, d))
		case conntrack.Allow:
			allowed = append(allowed, key(f))
		default:
			t.Errorf("%s: change %v handed over", key(f), ch)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.244.2.10 -> 10.244.1.10", "10.244.2.10 -> 10.244.1.11"}; !slices.Equal(cut, want) {
		t.Errorf("would cut %v, want %v", cut, want)
	}
	if want := []string{"10.244.2.11 -> 10.244.1.10"}; !slices.Equal(allowed, want) {
		t.Errorf("would allow %v, want %v", allowed, want)
	}
	if !slices.Equal(policies, []string{"x/allow-clients", "x/allow-clients"}) {
		t.Errorf("deciding policies %v", policies)
	}
	if len(table.Deleted) != 0 || res.Dumped != len(flows) || res.Affected != 2 {
		t.Errorf("preview deleted %v; result %+v", table.Deleted, res)
	}

	revoked := &conntracktest.Table{Flows: flows}
	r, err := conntrack.NewRevoker(conntrack.Config{Decide: decide, Table: revoked})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Revoke([]*compile.Program{current}, candidate); err != nil {
		t.Fatal(err)
	}
	var deleted []string
	for i := range revoked.Deleted {
		deleted = append(deleted, key(&revoked.Deleted[i]))
	}
	if !slices.Equal(deleted, cut) {
		t.Errorf("revocation deleted %v, preview listed %v", deleted, cut)
	}
}
