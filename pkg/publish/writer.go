package publish

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/nftpolicy/nftpolicy/pkg/podslice"
)

// Writer writes PodAddressSlices with optimistic concurrency: an update
// or a delete names the resourceVersion its writer read, so that it fails
// with a conflict when anyone (another leader) wrote the slice since.
type Writer struct {
	client  dynamic.NamespaceableResourceInterface
	metrics *Metrics
}

// NewWriter returns a writer through cfg (whose QPS and Burst limit the
// writes); m counts them.
func NewWriter(cfg *rest.Config, m *Metrics) (*Writer, error) {
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Writer{client: c.Resource(podslice.GVR), metrics: m}, nil
}

// Put creates the slice (rv empty) or replaces the one at resourceVersion
// rv, labelled as the publisher's, and returns what was written.
func (w *Writer) Put(ctx context.Context, s *podslice.PodAddressSlice, rv string) (*podslice.PodAddressSlice, error) {
	out := *s
	out.TypeMeta = metav1.TypeMeta{APIVersion: podslice.Group + "/" + podslice.Version, Kind: podslice.Kind}
	out.ObjectMeta = metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: rv,
		Labels: map[string]string{podslice.ManagedByLabel: podslice.Publisher}}
	u, err := toUnstructured(&out)
	if err != nil {
		return nil, err
	}
	op := "update"
	var got *unstructured.Unstructured
	if rv == "" {
		op = "create"
		got, err = w.client.Namespace(s.Namespace).Create(ctx, u, metav1.CreateOptions{})
	} else {
		got, err = w.client.Namespace(s.Namespace).Update(ctx, u, metav1.UpdateOptions{})
	}
	w.count(op, err)
	if err != nil {
		return nil, fmt.Errorf("%s slice %s/%s: %w", op, s.Namespace, s.Name, err)
	}
	return fromUnstructured(got)
}

// Delete deletes the slice if it is still at resourceVersion rv.
func (w *Writer) Delete(ctx context.Context, namespace, name, rv string) error {
	err := w.client.Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	w.count("delete", err)
	if err != nil {
		return fmt.Errorf("delete slice %s/%s: %w", namespace, name, err)
	}
	return nil
}

// Get reads a slice; nil when there is none.
func (w *Writer) Get(ctx context.Context, namespace, name string) (*podslice.PodAddressSlice, error) {
	u, err := w.client.Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get slice %s/%s: %w", namespace, name, err)
	}
	return fromUnstructured(u)
}

func (w *Writer) count(op string, err error) {
	if w.metrics == nil {
		return
	}
	result := "ok"
	switch {
	case apierrors.IsConflict(err):
		result = "conflict"
	case err != nil:
		result = "error"
	}
	w.metrics.Writes.WithLabelValues(op, result).Inc()
}

func toUnstructured(s *podslice.PodAddressSlice) (*unstructured.Unstructured, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	return u, u.UnmarshalJSON(b)
}

func fromUnstructured(u *unstructured.Unstructured) (*podslice.PodAddressSlice, error) {
	b, err := u.MarshalJSON()
	if err != nil {
		return nil, err
	}
	s := &podslice.PodAddressSlice{}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("reading slice %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return s, nil
}

// sameContent says whether have carries what want does, labelled as the
// publisher's: then want needs no write.
func sameContent(want, have *podslice.PodAddressSlice) bool {
	if have.Labels[podslice.ManagedByLabel] != podslice.Publisher || len(have.Labels) != 1 {
		return false
	}
	a, errA := contentOf(want)
	b, errB := contentOf(have)
	return errA == nil && errB == nil && bytes.Equal(a, b)
}

// contentOf is what a slice says, as JSON: empty labels and ports are
// none, as a slice read back from the API server has them (omitempty).
func contentOf(s *podslice.PodAddressSlice) ([]byte, error) {
	labels, ports := s.PodLabels, s.Ports
	if len(labels) == 0 {
		labels = nil
	}
	if len(ports) == 0 {
		ports = nil
	}
	return json.Marshal(struct {
		L  map[string]string
		Po []podslice.ContainerPort
		P  []podslice.PodEntry
	}{labels, ports, s.Pods})
}

// newer says whether resourceVersion a is later than b (b empty: yes).
// etcd's revisions are the API server's resource versions; one that does
// not parse is taken as newer, so that it is never ignored.
func newer(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return b == "" || errA != nil || errB != nil || x > y
}
