package podstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftpolicy/nftpolicy/pkg/podslice"
)

// renewing is a LeaseWatch of a publisher that renews its Lease every
// 50 ms.
func renewing(ctx context.Context, seen func(*coordinationv1.Lease)) {
	for {
		seen(lease("p-0", time.Now()))
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestSlicedFallsBackWhenSlicesUnreadable: with the publisher's Lease
// fresh but the slices unreadable (no CRD, no access), the store does not
// stay empty and unsynced: after the stale bound it reads every Pod.
func TestSlicedFallsBackWhenSlicesUnreadable(t *testing.T) {
	cs := fake.NewSimpleClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}, Spec: corev1.PodSpec{NodeName: "me"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"}, Spec: corev1.PodSpec{NodeName: "other"}})
	pods := ClientsetSource(cs)
	refused := SliceSource{
		List: func(context.Context, metav1.ListOptions) (*podslice.PodAddressSliceList, error) {
			return nil, errors.New("the server could not find the requested resource")
		},
		Watch: func(context.Context, metav1.ListOptions) (SliceEvents, error) {
			return nil, errors.New("the server could not find the requested resource")
		},
	}
	s, err := NewSliced(SlicedConfig{Node: "me", Local: pods, Pods: pods, Slices: refused, Lease: renewing,
		StaleAfter: 500 * time.Millisecond, Limits: DefaultSliceLimits}, func(string) {}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	eventually(t, "the store reads every Pod", func() bool { return s.HasSynced() && s.Source() == SourcePods && s.Len() == 2 })
}
