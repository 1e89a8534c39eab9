package slim

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// TestPodClientSpeaksHTTP1: the pod client asks for HTTP/1.1 even from a
// server that offers HTTP/2 (see NewPodClient), while the configuration
// it was made from keeps its own protocols.
func TestPodClientSpeaksHTTP1(t *testing.T) {
	var mu sync.Mutex
	var protos []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		protos = append(protos, r.Proto)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{
		CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})}}

	c, err := NewPodClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Get().Resource("pods").Do(context.Background()).Error(); err != nil {
		t.Fatal(err)
	}
	// The same configuration through client-go's ordinary transport: the
	// server does offer HTTP/2, so the check below means something.
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(srv.URL + "/api/v1/pods")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(protos) != 2 || protos[0] != "HTTP/1.1" || protos[1] != "HTTP/2.0" {
		t.Errorf("requests arrived as %v, want the pod client's as HTTP/1.1, then an ordinary client's as HTTP/2.0", protos)
	}
	if cfg.TLSClientConfig.NextProtos != nil {
		t.Errorf("NewPodClient changed the configuration it was given: NextProtos %v", cfg.TLSClientConfig.NextProtos)
	}
}

// TestPodWatchInJSON: from an API server that answers in JSON, the
// EventReader reads pods into their stored form too, bookmarks with the
// end-of-initial-events annotation kept, and an ERROR event's Status as
// its error.
func TestPodWatchInJSON(t *testing.T) {
	pods := wirePods()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "true" {
			http.Error(w, "watch only", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		for _, p := range pods {
			p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
			typ := watch.Added
			if p.Name == "" {
				typ = watch.Bookmark
			}
			enc.Encode(map[string]any{"type": typ, "object": p})
		}
		enc.Encode(map[string]any{"type": watch.Error, "object": &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
			Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired}})
	}))
	defer srv.Close()
	c, err := NewPodClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	body, err := c.Get().Resource("pods").Param("watch", "true").Stream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r := NewEventReader(body)
	defer r.Close()
	for i, p := range pods {
		typ, got, err := r.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if want := watch.Added; p.Name == "" && typ != watch.Bookmark || p.Name != "" && typ != want {
			t.Errorf("event %d: %s", i, typ)
		}
		want := podEvent(p, p.Annotations[metav1.InitialEventsAnnotationKey])
		if diff := cmp.Diff(want, got, podInfoCmp...); diff != "" {
			t.Errorf("event %d (-want +got):\n%s", i, diff)
		}
	}
	if typ, _, err := r.Next(); typ != watch.Error || !apierrors.IsResourceExpired(err) {
		t.Errorf("last event %s, %v; want the Status's error (expired)", typ, err)
	}
	if _, _, err := r.Next(); err != io.EOF {
		t.Errorf("after the last event: %v, want EOF", err)
	}
}
