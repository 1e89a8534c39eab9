package compile

import (
	"reflect"
	"testing"
	"weak"
)

// testNameFormat differs from names in every part: nothing but names.go
// may know the format.
var testNameFormat = nameFormat{hashLen: 12, peers: "sel-", nodes: "nodesel-", isolated: "iso", deny: "logdrop-"}

// UseTestNameFormat makes the generated names follow another format until
// the test ends.
func UseTestNameFormat(t testing.TB) {
	saved := names
	names = testNameFormat
	t.Cleanup(func() { names = saved })
}

// MaxPolicyRefChars lets the external tests check names against the cut.
const MaxPolicyRefChars = maxPolicyRefChars

// NotSubjectIntact reports whether the record that every pod that is not
// local shares still says "selected by nothing": no code path may write
// it through a remote pod.
func NotSubjectIntact() bool {
	return reflect.DeepEqual(notSubject, Subject{IngressTable: -1, EgressTable: -1})
}

// TrackerBuildState returns weak pointers to what the tracker holds of its
// last build: its builder and its renderer.
func TrackerBuildState(t *Tracker) (weak.Pointer[builder], weak.Pointer[renderer]) {
	return weak.Make(t.b), weak.Make(t.r)
}

// ShareFrom makes peer sets of n pods or more shared by content until the
// test ends (ShareMinMembers otherwise), so that small clusters share.
func ShareFrom(t testing.TB, n int) {
	saved := shareMinMembers
	shareMinMembers = n
	t.Cleanup(func() { shareMinMembers = saved })
}
