package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// delegatedAuth lets a request through only when the API server says its
// bearer token is valid (TokenReview) and its user may use the request's
// verb on its path (SubjectAccessReview with nonResourceAttributes), as
// kube-rbac-proxy and controller-runtime's metrics filters do. Answers are
// cached for a short time in bounded caches, keyed by hashes (no token is
// kept). A request already allowed is remembered in a cache of its own,
// which only allowed requests enter, so an authorized scraper needs no
// review per scrape and peers making up tokens cannot push it out. Reviews
// are what a peer without a valid token can make the agent do: the gate
// bounds them per address and overall, fairly (reviewGate).
type delegatedAuth struct {
	client kubernetes.Interface
	log    klog.Logger
	result map[string]prometheus.Counter

	allowed *ttlCache[struct{}] // hashes of token, verb and path allowed
	authn   *ttlCache[authnAnswer]
	authz   *ttlCache[bool]

	gate *reviewGate
}

// authnAnswer is a TokenReview's answer.
type authnAnswer struct {
	ok   bool
	user authenticationv1.UserInfo
}

// The caches' bounds. A valid answer is kept 30 s: a revoked token or
// binding still works that long (kube-apiserver's own delegated
// authenticator keeps answers 10 s; the kubelet's, 2 min). A refusal is
// kept 10 s, so a fixed bad token costs one review per 10 s.
const (
	authCacheSize    = 1024
	authAllowedTTL   = 30 * time.Second
	authDeniedTTL    = 10 * time.Second
	authReviewTimout = 5 * time.Second
	// One remote address may cause authReviewRate reviews per second that
	// the caches do not answer (burst authReviewBurst); past that, 429.
	authReviewRate  = 5
	authReviewBurst = 10
	// Overall, authGlobalReviewRate reviews per second (burst
	// authGlobalReviewBurst) and authReviewsInFlight at once. A request
	// waits up to authReviewWait for a turn, in a line of at most
	// authReviewQueue, then gets 429.
	authGlobalReviewRate  = 25
	authGlobalReviewBurst = 50
	authReviewsInFlight   = 8
	authReviewWait        = 2 * time.Second
	authReviewQueue       = 64
	// authReviewSources addresses are remembered (allowance, last review);
	// past that the one unused longest is forgotten.
	authReviewSources = 4096
)

// authGateConfig is the gate of the metrics server.
var authGateConfig = reviewGateConfig{
	perSource: authReviewRate, burst: authReviewBurst,
	globalRate: authGlobalReviewRate, globalBurst: authGlobalReviewBurst,
	inFlight: authReviewsInFlight, maxWait: authReviewWait, maxQueue: authReviewQueue, maxSource: authReviewSources,
}

func newDelegatedAuth(client kubernetes.Interface, results *prometheus.CounterVec, log klog.Logger) *delegatedAuth {
	return newDelegatedAuthWith(client, results, log, authGateConfig)
}

func newDelegatedAuthWith(client kubernetes.Interface, results *prometheus.CounterVec, log klog.Logger, gate reviewGateConfig) *delegatedAuth {
	a := &delegatedAuth{client: client, log: log, result: map[string]prometheus.Counter{},
		allowed: newTTLCache[struct{}](authCacheSize),
		authn:   newTTLCache[authnAnswer](authCacheSize), authz: newTTLCache[bool](authCacheSize),
		gate: newReviewGate(gate)}
	for _, r := range []string{"allowed", "unauthenticated", "forbidden", "throttled", "error"} {
		a.result[r] = results.WithLabelValues(r)
	}
	return a
}

// errThrottled: the peer asked for more reviews than its share.
var errThrottled = errors.New("too many token or access reviews from this address; retry later")

func (a *delegatedAuth) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, why := a.check(r)
		if code != http.StatusOK {
			// No keep-alive for a refused peer: it must connect again (and
			// wait for the connection limits) to try again.
			w.Header().Set("Connection", "close")
			if code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="nftpolicy"`)
			}
			http.Error(w, why, code)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// check returns http.StatusOK for a request to let through, else the
// status and text to answer with; it counts the result.
func (a *delegatedAuth) check(r *http.Request) (int, string) {
	src, _ := netip.ParseAddrPort(r.RemoteAddr)
	token, ok := bearerToken(r)
	if !ok {
		a.result["unauthenticated"].Inc()
		return http.StatusUnauthorized, "Unauthorized: a bearer token is needed"
	}
	verb := strings.ToLower(r.Method)
	if r.Method == http.MethodHead {
		verb = "get"
	}
	allowedKey := requestKey(token, verb, r.URL.Path)
	if _, ok := a.allowed.get(allowedKey); ok {
		a.result["allowed"].Inc()
		return http.StatusOK, ""
	}
	user, err := a.authenticate(r.Context(), src.Addr().Unmap(), token)
	if code, why, done := a.failed(err); done {
		return code, why
	}
	if !user.ok {
		a.result["unauthenticated"].Inc()
		return http.StatusUnauthorized, "Unauthorized"
	}
	allowed, err := a.authorize(r.Context(), src.Addr().Unmap(), user.user, verb, r.URL.Path)
	if code, why, done := a.failed(err); done {
		return code, why
	}
	if !allowed {
		a.result["forbidden"].Inc()
		return http.StatusForbidden, fmt.Sprintf("Forbidden: %q may not %s %s", user.user.Username, verb, r.URL.Path)
	}
	a.allowed.put(allowedKey, struct{}{}, authAllowedTTL)
	a.result["allowed"].Inc()
	return http.StatusOK, ""
}

func (a *delegatedAuth) failed(err error) (int, string, bool) {
	switch {
	case err == nil:
		return 0, "", false
	case errors.Is(err, errThrottled):
		a.result["throttled"].Inc()
		return http.StatusTooManyRequests, err.Error(), true
	default:
		a.result["error"].Inc()
		a.log.V(2).Info("Could not review a metrics request", "err", err)
		return http.StatusInternalServerError, "the API server could not be asked", true
	}
}

// bearerToken returns the request's "Authorization: Bearer" token.
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func (a *delegatedAuth) authenticate(ctx context.Context, src netip.Addr, token string) (authnAnswer, error) {
	key := sha256.Sum256([]byte(token))
	if v, ok := a.authn.get(key); ok {
		return v, nil
	}
	var ans authnAnswer
	err := a.review(ctx, src, func(ctx context.Context) error {
		tr, err := a.client.AuthenticationV1().TokenReviews().Create(ctx,
			&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("TokenReview: %w", err)
		}
		ans = authnAnswer{ok: tr.Status.Authenticated, user: tr.Status.User}
		return nil
	})
	if err != nil {
		return authnAnswer{}, err
	}
	a.authn.put(key, ans, ttlOf(ans.ok))
	return ans, nil
}

func (a *delegatedAuth) authorize(ctx context.Context, src netip.Addr, u authenticationv1.UserInfo, verb, path string) (bool, error) {
	key := authzKey(u, verb, path)
	if v, ok := a.authz.get(key); ok {
		return v, nil
	}
	var allowed bool
	err := a.review(ctx, src, func(ctx context.Context) error {
		extra := map[string]authorizationv1.ExtraValue{}
		for k, v := range u.Extra {
			extra[k] = authorizationv1.ExtraValue(v)
		}
		sar, err := a.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
				NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
			}}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("SubjectAccessReview: %w", err)
		}
		allowed = sar.Status.Allowed && !sar.Status.Denied
		return nil
	})
	if err != nil {
		return false, err
	}
	a.authz.put(key, allowed, ttlOf(allowed))
	return allowed, nil
}

func ttlOf(ok bool) time.Duration {
	if ok {
		return authAllowedTTL
	}
	return authDeniedTTL
}

// requestKey hashes a token with the verb and path it was allowed for.
func requestKey(token, verb, path string) [32]byte {
	h := sha256.New()
	for _, s := range []string{token, verb, path} {
		fmt.Fprintf(h, "%d:%s", len(s), s)
	}
	var key [32]byte
	h.Sum(key[:0])
	return key
}

// authzKey hashes everything a SubjectAccessReview is asked about.
func authzKey(u authenticationv1.UserInfo, verb, path string) [32]byte {
	h := sha256.New()
	field := func(s string) { fmt.Fprintf(h, "%d:%s", len(s), s) }
	field(u.Username)
	field(u.UID)
	for _, g := range u.Groups {
		field("g=" + g)
	}
	keys := make([]string, 0, len(u.Extra))
	for k := range u.Extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		field("x=" + k)
		for _, v := range u.Extra[k] {
			field(v)
		}
	}
	field(verb)
	field(path)
	var key [32]byte
	h.Sum(key[:0])
	return key
}

// review runs one review the caches could not answer, when the gate
// gives src a turn.
func (a *delegatedAuth) review(ctx context.Context, src netip.Addr, fn func(context.Context) error) error {
	release, err := a.gate.acquire(ctx, src)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, authReviewTimout)
	defer cancel()
	return fn(ctx)
}

// ttlCache is a bounded map of answers that expire. When full, expired
// entries go first, then arbitrary ones: an entry lost early only costs
// one more review.
type ttlCache[V any] struct {
	max int
	now func() time.Time

	mu sync.Mutex
	m  map[[32]byte]ttlEntry[V]
}

type ttlEntry[V any] struct {
	v       V
	expires time.Time
}

func newTTLCache[V any](max int) *ttlCache[V] {
	return &ttlCache[V]{max: max, now: time.Now, m: map[[32]byte]ttlEntry[V]{}}
}

func (c *ttlCache[V]) get(k [32]byte) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || !c.now().Before(e.expires) {
		var zero V
		return zero, false
	}
	return e.v, true
}

func (c *ttlCache[V]) put(k [32]byte, v V, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		for key, e := range c.m {
			if !now.Before(e.expires) {
				delete(c.m, key)
			}
		}
		for key := range c.m {
			if len(c.m) < c.max {
				break
			}
			delete(c.m, key)
		}
	}
	c.m[k] = ttlEntry[V]{v: v, expires: now.Add(ttl)}
}

// certSource is the metrics server's certificate: from files, re-read
// when they change (checked at most every certCheckEvery), or self-signed
// and made again before it expires.
type certSource struct {
	certFile, keyFile string
	hosts             []string
	log               klog.Logger
	now               func() time.Time

	mu      sync.Mutex
	cert    *tls.Certificate
	checked time.Time
	modTime [2]time.Time
	expires time.Time
}

const (
	certCheckEvery   = 10 * time.Second
	selfSignedLife   = 365 * 24 * time.Hour
	selfSignedRenew  = 24 * time.Hour // made again this long before it expires
	selfSignedIssuer = "nftpolicy-metrics"
)

func newCertSource(certFile, keyFile, node string, nodeIPs []string, log klog.Logger) (*certSource, error) {
	s := &certSource{certFile: certFile, keyFile: keyFile, log: log, now: time.Now,
		hosts: append([]string{node, "localhost", "127.0.0.1", "::1"}, nodeIPs...)}
	if _, err := s.get(); err != nil {
		return nil, err
	}
	return s, nil
}

func serverTLSConfig(s *certSource) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.get()
		},
	}
}

func (s *certSource) get() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.cert != nil && now.Sub(s.checked) < certCheckEvery {
		return s.cert, nil
	}
	s.checked = now
	if s.certFile == "" {
		if s.cert == nil || now.After(s.expires.Add(-selfSignedRenew)) {
			c, expires, err := selfSigned(s.hosts, now)
			if err != nil {
				return nil, fmt.Errorf("metrics: self-signed certificate: %w", err)
			}
			s.cert, s.expires = c, expires
		}
		return s.cert, nil
	}
	var mod [2]time.Time
	for i, f := range []string{s.certFile, s.keyFile} {
		st, err := os.Stat(f)
		if err != nil {
			return s.keep(fmt.Errorf("metrics: TLS certificate: %w", err))
		}
		mod[i] = st.ModTime()
	}
	if s.cert != nil && mod == s.modTime {
		return s.cert, nil
	}
	c, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		return s.keep(fmt.Errorf("metrics: TLS certificate: %w", err))
	}
	s.cert, s.modTime = &c, mod
	s.log.Info("Metrics TLS certificate loaded", "certFile", s.certFile)
	return s.cert, nil
}

// keep answers with the certificate in use when its files cannot be read
// again (mid-rotation); err only when there is none.
func (s *certSource) keep(err error) (*tls.Certificate, error) {
	if s.cert == nil {
		return nil, err
	}
	s.log.Info("Keeping the metrics TLS certificate in use", "err", err)
	return s.cert, nil
}

// selfSigned makes an ECDSA P-256 certificate for hosts (names and
// addresses), valid for selfSignedLife.
func selfSigned(hosts []string, now time.Time) (*tls.Certificate, time.Time, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, time.Time{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, time.Time{}, err
	}
	expires := now.Add(selfSignedLife)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: selfSignedIssuer + "@" + hosts[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     expires,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, time.Time{}, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, expires, nil
}
