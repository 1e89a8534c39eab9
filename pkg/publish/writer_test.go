package publish

import (
	"encoding/json"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/podslice"
)

// TestSameContentAfterRoundTrip: a slice the publisher wrote, read back
// from JSON as the API server returns it, needs no write; one that
// differs in a pod, its labels or its mark does.
func TestSameContentAfterRoundTrip(t *testing.T) {
	for _, labels := range []map[string]string{nil, {}, {"app": "web"}} {
		g := newGrouping()
		for i, name := range []string{"a", "b"} {
			g.place("ns/"+name, makePod("ns", name, podIP(i+1), labels))
		}
		var want *podslice.PodAddressSlice
		for _, s := range g.byName {
			want = s.slice()
		}
		written := *want
		written.Labels = map[string]string{podslice.ManagedByLabel: podslice.Publisher}
		b, err := json.Marshal(&written)
		if err != nil {
			t.Fatal(err)
		}
		have := &podslice.PodAddressSlice{}
		if err := json.Unmarshal(b, have); err != nil {
			t.Fatal(err)
		}
		if !sameContent(want, have) {
			t.Errorf("labels %#v: a slice read back as written differs from it:\n%s", labels, b)
		}
		other := *have
		other.Pods = append([]podslice.PodEntry(nil), have.Pods...)
		other.Pods[0].IPs = []string{"10.9.9.9"}
		if sameContent(want, &other) {
			t.Errorf("labels %#v: a changed address is the same content", labels)
		}
		unmarked := *have
		unmarked.Labels = nil
		if sameContent(want, &unmarked) {
			t.Errorf("labels %#v: a slice without the publisher's mark is the same content", labels)
		}
	}
}
