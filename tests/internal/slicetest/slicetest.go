// Package slicetest writes PodAddressSlices and the publisher's Lease as
// `nftpolicy publish` would, for tests of the agent's slice source
// against a real API server (kubeenv): the tests play the publisher.
package slicetest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftpolicy/nftpolicy/pkg/podslice"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// LeaseNamespace and LeaseName are the publisher's Lease, as the agent's
// defaults name it.
const (
	LeaseNamespace = "kube-system"
	LeaseName      = "nftpolicy-publisher-synced"
)

// InstallCRD applies pkg/podslice's CustomResourceDefinition and waits
// until it is served.
func InstallCRD(t testing.TB, env *kubeenv.Env) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "podaddressslices.yaml")
	if err := os.WriteFile(path, []byte(podslice.CRD), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl(t, "apply", "-f", path); err != nil {
		t.Fatalf("applying the PodAddressSlice CRD: %v: %s", err, out)
	}
	if out, err := env.Kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/"+podslice.Resource+"."+podslice.Group); err != nil {
		t.Fatalf("waiting for the PodAddressSlice CRD: %v: %s", err, out)
	}
}

// agentRBAC lets the agent's ServiceAccount read what --pod-source slices
// reads, as install.yaml's agent ClusterRole is to (the publisher's
// change): the slices and the publisher's Lease.
const agentRBAC = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: test-slice-reader}
rules:
  - apiGroups: [nftpolicy.io]
    resources: [podaddressslices]
    verbs: [get, list, watch]
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: test-slice-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: test-slice-reader}
subjects:
  - {kind: ServiceAccount, name: nftpolicy, namespace: kube-system}
`

// GrantAgentRead lets install.yaml's agent ServiceAccount list and watch
// the slices and the Lease.
func GrantAgentRead(t testing.TB, env *kubeenv.Env) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "slice-reader.yaml")
	if err := os.WriteFile(path, []byte(agentRBAC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl(t, "apply", "-f", path); err != nil {
		t.Fatalf("granting the agent the slices: %v: %s", err, out)
	}
}

// Slice is the slice of pods (which share their labels) named name in
// their namespace, as the publisher makes it from the Pods.
func Slice(name string, pods ...*corev1.Pod) *podslice.PodAddressSlice {
	s := &podslice.PodAddressSlice{TypeMeta: metav1.TypeMeta{APIVersion: podslice.Group + "/" + podslice.Version, Kind: podslice.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{podslice.ManagedByLabel: podslice.Publisher}},
		Pods:       []podslice.PodEntry{}}
	for _, p := range pods {
		s.Namespace, s.PodLabels = p.Namespace, p.Labels
		if e, ok := podslice.Entry(slim.Pod(p)); ok {
			s.Pods = append(s.Pods, e)
		}
	}
	podslice.SharePorts(s)
	return s
}

// Write creates or replaces the slice.
func Write(ctx context.Context, cs kubernetes.Interface, s *podslice.PodAddressSlice) error {
	base := "/apis/" + podslice.Group + "/" + podslice.Version + "/namespaces/" + s.Namespace + "/" + podslice.Resource
	rc := cs.CoreV1().RESTClient()
	cur, err := rc.Get().AbsPath(base, s.Name).SetHeader("Accept", "application/json").DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		body, _ := json.Marshal(s)
		_, err = rc.Post().AbsPath(base).SetHeader("Content-Type", "application/json").Body(body).DoRaw(ctx)
		return err
	}
	if err != nil {
		return err
	}
	var old podslice.PodAddressSlice
	if err := json.Unmarshal(cur, &old); err != nil {
		return err
	}
	c := *s
	c.ResourceVersion = old.ResourceVersion
	body, _ := json.Marshal(&c)
	_, err = rc.Put().AbsPath(base, s.Name).SetHeader("Content-Type", "application/json").Body(body).DoRaw(ctx)
	return err
}

// Delete deletes the slice.
func Delete(ctx context.Context, cs kubernetes.Interface, namespace, name string) error {
	return cs.CoreV1().RESTClient().Delete().
		AbsPath("/apis/"+podslice.Group+"/"+podslice.Version+"/namespaces/"+namespace+"/"+podslice.Resource, name).Do(ctx).Error()
}

// Lease renews the publisher's Lease, as a leader would, while it is
// Renewing.
type Lease struct {
	cs       kubernetes.Interface
	mu       sync.Mutex
	renewing bool
}

// StartLease creates the Lease (held by "publisher-0", renewed now) and
// renews it every period until ctx ends or Pause.
func StartLease(ctx context.Context, t testing.TB, cs kubernetes.Interface, period time.Duration) *Lease {
	t.Helper()
	l := &Lease{cs: cs, renewing: true}
	if err := l.renew(ctx); err != nil {
		t.Fatalf("creating the publisher's Lease: %v", err)
	}
	go func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				l.mu.Lock()
				on := l.renewing
				l.mu.Unlock()
				if on {
					_ = l.renew(ctx)
				}
			}
		}
	}()
	return l
}

// Pause stops the renewals (the publisher is away); Resume renews at
// once and again every period.
func (l *Lease) Pause() { l.mu.Lock(); l.renewing = false; l.mu.Unlock() }

// Resume renews the Lease now and goes on renewing it.
func (l *Lease) Resume(ctx context.Context) error {
	l.mu.Lock()
	l.renewing = true
	l.mu.Unlock()
	return l.renew(ctx)
}

// Remove deletes the Lease (and stops the renewals).
func (l *Lease) Remove(ctx context.Context) error {
	l.Pause()
	return l.cs.CoordinationV1().Leases(LeaseNamespace).Delete(ctx, LeaseName, metav1.DeleteOptions{})
}

func (l *Lease) renew(ctx context.Context) error {
	leases := l.cs.CoordinationV1().Leases(LeaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	holder, secs := "publisher-0", int32(15)
	cur, err := leases.Get(ctx, LeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName, Namespace: LeaseNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	cur.Spec.HolderIdentity, cur.Spec.RenewTime, cur.Spec.LeaseDurationSeconds = &holder, &now, &secs
	if _, err := leases.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renewing the publisher's Lease: %w", err)
	}
	return nil
}
