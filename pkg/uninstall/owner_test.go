package uninstall

import "testing"

func TestDecide(t *testing.T) {
	owner := Owner{Namespace: "kube-system", Name: "nftpolicy", UID: "u1"}
	for _, tc := range []struct {
		name string
		obs  Observation
		want Verdict
	}{
		{"unknown", Observation{}, Keep},
		{"present", Observation{Known: true, Exists: true, UID: "u1"}, Keep},
		{"gone", Observation{Known: true}, Remove},
		{"deleting", Observation{Known: true, Exists: true, UID: "u1", Deleting: true}, Remove},
		{"re-created", Observation{Known: true, Exists: true, UID: "u2"}, Keep},
		{"re-created and deleting", Observation{Known: true, Exists: true, UID: "u2", Deleting: true}, Remove},
	} {
		if got, why := Decide(owner, tc.obs); got != tc.want {
			t.Errorf("%s: %v (%s), want %v", tc.name, got, why, tc.want)
		}
	}
}
