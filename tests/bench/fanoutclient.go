package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// watchRequest is one watch a simulated client keeps open: the path of the
// collection and the selectors of the real client's informer.
type watchRequest struct {
	path          string
	labelSelector string
	fieldSelector string
	// json: a custom resource, which the API server serves as JSON only.
	json bool
}

// agentWatches are the watches of an nftpolicy agent (cmd/nftpolicy,
// pkg/controller, pkg/podstore): every pod (pkg/podstore, its own client:
// protobuf, HTTP/1.1, no compression), every namespace, NetworkPolicy and
// node (the shared informer factory, protobuf). All of them watch-list:
// pkg/podstore asks for initial events itself, and client-go's
// WatchListClient gate is on by default since 1.35. The
// ClusterNetworkPolicy informer (JSON, a custom resource) is left out: it
// runs only where that CRD is installed.
func agentWatches(string) []watchRequest {
	return []watchRequest{
		{path: "/api/v1/pods"},
		{path: "/api/v1/namespaces"},
		{path: "/apis/networking.k8s.io/v1/networkpolicies"},
		{path: "/api/v1/nodes"},
	}
}

// kubeProxySelector is kube-proxy's label selector of Services and
// EndpointSlices: no headless Service, none proxied by another proxy.
const kubeProxySelector = "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"

// kubeProxyWatches are kube-proxy's (pkg/proxy, cmd/kube-proxy): every
// EndpointSlice and Service it proxies, and its own Node.
func kubeProxyWatches(node string) []watchRequest {
	return []watchRequest{
		{path: "/apis/discovery.k8s.io/v1/endpointslices", labelSelector: kubeProxySelector},
		{path: "/api/v1/services", labelSelector: kubeProxySelector},
		{path: "/api/v1/nodes", fieldSelector: "metadata.name=" + node},
	}
}

// watchCounts are what a simulated watch received.
type watchCounts struct {
	added, modified, deleted atomic.Int64
	// payload is the bytes of the watch's frames (the response body
	// without HTTP chunking).
	payload atomic.Int64
	synced  chan struct{} // closed at the bookmark that ends the initial events
	ended   chan struct{} // closed when the watch has ended
	err     atomic.Pointer[error]
}

func newWatchCounts() *watchCounts {
	return &watchCounts{synced: make(chan struct{}), ended: make(chan struct{})}
}

// simClient is one simulated client (an agent or a kube-proxy): its own
// connections (HTTP/1.1: one TCP+TLS connection per watch, as client-go
// opens them), counting the bytes the API server sent on them.
type simClient struct {
	watches []*watchCounts
	wire    atomic.Int64 // bytes read from the sockets: TLS records, HTTP headers and chunking included
	retries atomic.Int64 // watches opened again after an error event before their initial events
	tr      *http.Transport
	cancel  context.CancelFunc
	done    chan struct{}
}

// simConfig is what simulated clients share: the API server and the TLS
// configuration of a client certificate.
type simConfig struct {
	server    string
	tls       *tls.Config
	userAgent string
}

func newSimConfig(rc *rest.Config, userAgent string) (simConfig, error) {
	tc, err := rest.TLSConfigFor(rc)
	if err != nil {
		return simConfig{}, err
	}
	tc.NextProtos = []string{"http/1.1"}
	return simConfig{server: rc.Host, tls: tc, userAgent: userAgent}, nil
}

// startSimClient opens the client's watches; they run until stop.
func startSimClient(ctx context.Context, sc simConfig, reqs []watchRequest) *simClient {
	ctx, cancel := context.WithCancel(ctx)
	c := &simClient{cancel: cancel, done: make(chan struct{})}
	d := &net.Dialer{Timeout: 30 * time.Second}
	c.tr = &http.Transport{
		TLSClientConfig:     sc.tls.Clone(),
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: len(reqs),
		TLSHandshakeTimeout: 30 * time.Second,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: conn, n: &c.wire}, nil
		},
	}
	left := atomic.Int64{}
	left.Store(int64(len(reqs)))
	for _, r := range reqs {
		w := newWatchCounts()
		c.watches = append(c.watches, w)
		go func() {
			err := c.run(ctx, sc, r, w)
			if err == nil && ctx.Err() == nil {
				err = fmt.Errorf("watch %s ended by the API server", r.path)
			}
			if err != nil && ctx.Err() == nil {
				w.err.Store(&err)
			}
			close(w.ended)
			if left.Add(-1) == 0 {
				close(c.done)
			}
		}()
	}
	return c
}

func (c *simClient) stop() {
	c.cancel()
	<-c.done
	c.tr.CloseIdleConnections()
}

// err returns the first failed watch's error.
func (c *simClient) err() error {
	for _, w := range c.watches {
		if e := w.err.Load(); e != nil {
			return *e
		}
	}
	return nil
}

// watchQuery is the query of a watch-list request as client-go's reflector
// and pkg/podstore send it.
func watchQuery(r watchRequest) url.Values {
	q := url.Values{}
	q.Set("watch", "true")
	q.Set("allowWatchBookmarks", "true")
	q.Set("sendInitialEvents", "true")
	q.Set("resourceVersionMatch", string(metav1.ResourceVersionMatchNotOlderThan))
	q.Set("timeoutSeconds", "3600") // longer than a run: a re-opened watch is not what is measured
	if r.labelSelector != "" {
		q.Set("labelSelector", r.labelSelector)
	}
	if r.fieldSelector != "" {
		q.Set("fieldSelector", r.fieldSelector)
	}
	return q
}

func (c *simClient) run(ctx context.Context, sc simConfig, r watchRequest, w *watchCounts) error {
	backoff := 800 * time.Millisecond // client-go reflector's first back-off
	for attempt := 0; ; attempt++ {
		err := c.runOnce(ctx, sc, r, w)
		if ctx.Err() != nil || !retryable(err, w) || attempt == watchRetries {
			return err
		}
		c.retries.Add(1)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

func (c *simClient) runOnce(ctx context.Context, sc simConfig, r watchRequest, w *watchCounts) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, sc.server+r.path+"?"+watchQuery(r).Encode(), nil)
	if err != nil {
		return err
	}
	if r.json {
		req.Header.Set("Accept", runtime.ContentTypeJSON)
	} else {
		req.Header.Set("Accept", runtime.ContentTypeProtobuf+","+runtime.ContentTypeJSON)
	}
	req.Header.Set("User-Agent", sc.userAgent)
	resp, err := (&http.Client{Transport: c.tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("watch %s: %s: %s", r.path, resp.Status, body)
	}
	if r.json {
		return readJSONWatch(resp.Body, w)
	}
	return readWatchFrames(bufio.NewReaderSize(resp.Body, 64<<10), w)
}

// readJSONWatch reads a JSON watch stream (one event object after the
// other) and counts its events as readWatchFrames does.
func readJSONWatch(r io.Reader, w *watchCounts) error {
	cr := &countingReader{r: r}
	dec := json.NewDecoder(bufio.NewReaderSize(cr, 64<<10))
	synced := false
	for {
		var ev struct {
			Type   watch.EventType `json:"type"`
			Object struct {
				Metadata struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			} `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		w.payload.Store(cr.n)
		switch ev.Type {
		case watch.Added:
			w.added.Add(1)
		case watch.Modified:
			w.modified.Add(1)
		case watch.Deleted:
			w.deleted.Add(1)
		case watch.Bookmark:
			if !synced && ev.Object.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
				synced = true
				close(w.synced)
			}
		case watch.Error:
			return &watchErrorEvent{msg: "(JSON stream)"}
		default:
			return fmt.Errorf("watch event of type %q", ev.Type)
		}
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// protobufMagic starts every object the API server encodes as protobuf.
var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

// maxWatchFrame bounds one frame: larger is a broken stream, not an object.
const maxWatchFrame = 64 << 20

// readWatchFrames reads a protobuf watch stream (each frame a 4-byte
// big-endian length, then a WatchEvent in the protobuf envelope) and
// counts its events by type, decoding only bookmarks' objects (to see the
// end of the initial events).
func readWatchFrames(r io.Reader, w *watchCounts) error {
	var hdr [4]byte
	var buf []byte
	synced := false
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxWatchFrame {
			return fmt.Errorf("watch frame of %d bytes", n)
		}
		if cap(buf) < int(n) {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		w.payload.Add(int64(n) + 4)
		typ, obj, err := decodeWatchFrame(buf)
		if err != nil {
			return err
		}
		switch typ {
		case watch.Added:
			w.added.Add(1)
		case watch.Modified:
			w.modified.Add(1)
		case watch.Deleted:
			w.deleted.Add(1)
		case watch.Bookmark:
			if !synced && endsInitialEvents(obj) {
				synced = true
				close(w.synced)
			}
		case watch.Error:
			return &watchErrorEvent{msg: watchErrorMessage(obj)}
		}
	}
}

// decodeWatchFrame returns a frame's event type and its object's bytes.
// The API server's protobuf stream serializer writes the WatchEvent raw;
// a frame in the envelope of a whole object (the magic prefix, then
// runtime.Unknown) is read too.
func decodeWatchFrame(frame []byte) (watch.EventType, []byte, error) {
	raw := frame
	if len(frame) >= len(protobufMagic) && string(frame[:len(protobufMagic)]) == string(protobufMagic) {
		var unk runtime.Unknown
		if err := unk.Unmarshal(frame[len(protobufMagic):]); err != nil {
			return "", nil, fmt.Errorf("watch frame envelope: %w", err)
		}
		raw = unk.Raw
	}
	var ev metav1.WatchEvent
	if err := ev.Unmarshal(raw); err != nil {
		return "", nil, fmt.Errorf("watch event: %w", err)
	}
	if ev.Type == "" {
		return "", nil, errors.New("watch event without a type")
	}
	return watch.EventType(ev.Type), ev.Object.Raw, nil
}

// endsInitialEvents reports whether a bookmark's object carries the
// annotation that ends a watch-list's initial events.
func endsInitialEvents(raw []byte) bool {
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
	if err != nil {
		return false
	}
	m, ok := obj.(metav1.Object)
	return ok && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true"
}

// watchErrorEvent is an ERROR event of a watch.
type watchErrorEvent struct{ msg string }

func (e *watchErrorEvent) Error() string { return "watch error event: " + e.msg }

// watchRetries bounds the re-opens of a watch that failed before its
// initial events.
const watchRetries = 10

// retryable reports whether a watch that ended with err is opened again,
// as client-go's reflector and pkg/podstore do (after a back-off): any
// failure before its initial events ended, such as a TLS handshake that
// timed out or the API server's "Too large resource version" when its
// watch cache lags behind etcd.
func retryable(err error, w *watchCounts) bool {
	if err == nil {
		return false
	}
	select {
	case <-w.synced:
		return false
	default:
		return true
	}
}

// watchErrorMessage returns the message of an error event's Status.
func watchErrorMessage(raw []byte) string {
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
	if err != nil {
		return err.Error()
	}
	if st, ok := obj.(*metav1.Status); ok {
		return fmt.Sprintf("%s (%s, %d)", st.Message, st.Reason, st.Code)
	}
	return fmt.Sprintf("%T", obj)
}

// countingConn counts the bytes read from a connection.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}
