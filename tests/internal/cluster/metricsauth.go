package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// MetricsReaderToken returns a token of ServiceAccount namespace/name,
// which it creates once with a ClusterRole binding that allows `get` on
// /metrics only (as a Prometheus would be bound).
func (c *Cluster) MetricsReaderToken(ctx context.Context, namespace, name string) (string, error) {
	cl := c.Client
	role := "metrics-reader-" + namespace + "-" + name
	create := func(err error) error {
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	}
	if err := c.EnsureNamespace(ctx, namespace, nil); err != nil {
		return "", err
	}
	_, err := cl.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err := create(err); err != nil {
		return "", err
	}
	_, err = cl.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{})
	if err := create(err); err != nil {
		return "", err
	}
	_, err = cl.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: namespace, Name: name}}}, metav1.CreateOptions{})
	if err := create(err); err != nil {
		return "", err
	}
	exp := int64(3600)
	tr, err := cl.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// MetricsLockout is issue 43's attack on delegated metrics authentication
// (item 7): Sources addresses, each a pod of the crowd, send one request
// with a made-up token to the agent's metrics address, then a scraper
// that has never connected (a Prometheus rescheduled) scrapes with a valid
// token.
type MetricsLockout struct {
	Node string
	// Addr is the agent's metrics address (host:port) on Node.
	Addr    string
	Sources int
	// Scraper is where the valid scrape comes from, Token its token.
	Scraper netlab.Endpoint
	Token   string
	// HealthAddr, when set, is the agent's health address (host:port) on
	// Node: before the attack, the scraper is waited for until its health
	// check answers (until the agent knows a pod, its connections wait).
	HealthAddr string
}

// MetricsLockoutResult is what MetricsLockout saw: the crowd's answers by
// status code (0: no answer) and the scrape's.
type MetricsLockoutResult struct {
	Crowd       map[int]int
	ScrapeCode  int
	ScrapeError string
}

// ScrapeOK reports whether the valid scrape got the metrics.
func (r MetricsLockoutResult) ScrapeOK() bool { return r.ScrapeCode == http.StatusOK }

// crowdAddr is the i-th address of the crowd (100.64.0.0/10, never a pod
// or node address of the lab).
func crowdAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{100, 64, byte(i / 250), byte(1 + i%250)})
}

// RunMetricsLockout plays m: the crowd is an external host behind m.Node
// holding m.Sources addresses (every request of the crowd comes from
// another one); the requests go 8 at a time, each on a connection of its
// own.
func (c *Cluster) RunMetricsLockout(ctx context.Context, m MetricsLockout) (MetricsLockoutResult, error) {
	res := MetricsLockoutResult{Crowd: map[int]int{}}
	if m.HealthAddr != "" {
		if err := waitHealthFrom(ctx, c.Lab, m.Scraper, m.HealthAddr); err != nil {
			return res, err
		}
	}
	ips := make([]netip.Addr, m.Sources)
	for i := range ips {
		ips[i] = crowdAddr(i)
	}
	name := fmt.Sprintf("crowd-%d", time.Now().UnixNano()%100000)
	if err := c.Lab.AddExternal(netlab.ExternalSpec{Name: name, Node: m.Node, IPs: ips}); err != nil {
		return res, err
	}
	defer func() { _ = c.Lab.RemoveExternal(name) }()
	url := "https://" + m.Addr + "/metrics"
	var mu sync.Mutex
	next := make(chan netip.Addr)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range next {
				cl := metricsClient(c.Lab, netlab.Ext(name), a)
				code, _, _ := metricsGet(ctx, cl, url, "made-up-"+a.String())
				mu.Lock()
				res.Crowd[code]++
				mu.Unlock()
			}
		}()
	}
	for _, a := range ips {
		next <- a
	}
	close(next)
	wg.Wait()
	code, body, err := metricsGet(ctx, metricsClient(c.Lab, m.Scraper, netip.Addr{}), url, m.Token)
	res.ScrapeCode = code
	if err != nil {
		res.ScrapeError = err.Error()
	} else if code != http.StatusOK {
		res.ScrapeError = strings.TrimSpace(body)
	}
	return res, nil
}

// metricsClient is an HTTPS client (certificate not verified: the agent's
// is self-signed) whose sockets are made in ep's namespace, from local
// address from when it is valid; one connection per request.
func metricsClient(lab *netlab.Lab, ep netlab.Endpoint, from netip.Addr) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			err = lab.InNetns(ep, func() error {
				d := net.Dialer{}
				if from.IsValid() {
					d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
				}
				conn, err = d.DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
		DisableKeepAlives: true,
	}}
}

func metricsGet(ctx context.Context, cl *http.Client, url, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := cl.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, string(body), err
}

// waitHealthFrom waits up to a minute until a GET of /healthz on addr from
// ep answers 200.
func waitHealthFrom(ctx context.Context, lab *netlab.Lab, ep netlab.Endpoint, addr string) error {
	cl := metricsClient(lab, ep, netip.Addr{})
	cl.Timeout = time.Second
	url := "http://" + addr + "/healthz"
	for end := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		code, _, err := metricsGet(ctx, cl, url, "")
		if err == nil && code == http.StatusOK {
			return nil
		}
		if time.Now().After(end) || ctx.Err() != nil {
			return fmt.Errorf("%v cannot reach %s: %d %v", ep, url, code, err)
		}
	}
}
