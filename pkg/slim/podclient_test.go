package slim

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

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
