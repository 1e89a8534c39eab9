package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// Enforcer is the NetworkPolicy enforcer a cluster runs as the agent of
// every node: nftpolicy itself, or the peer it is compared with (issue 30,
// hack/compare.sh).
type Enforcer string

const (
	// EnforcerNftpolicy runs `nftpolicy agent` (the default).
	EnforcerNftpolicy Enforcer = "nftpolicy"
	// EnforcerKNP runs kube-network-policies (sigs.k8s.io/kube-network-policies),
	// as hack/compare.sh builds it.
	EnforcerKNP Enforcer = "kube-network-policies"
)

// String returns the enforcer's name.
func (e Enforcer) String() string { return string(e) }

// KNPBinEnv names the kube-network-policies binary; when unset, KNPBinary
// looks in hack/compare.sh's cache.
const KNPBinEnv = "NFTPOLICY_KNP_BIN"

// The peer's fixed settings: its nftables table (v0.8.0's default name)
// and the queue number it binds (its default, given explicitly).
const (
	KNPTable    = "kube-network-policies"
	KNPQueueNum = 100
	// knpSettle is how long WaitProgrammed waits after the peer's pod-IP
	// sets match the API: the peer decides from its informer caches and
	// exposes nothing that says which objects it has seen, so the sets are
	// the only sign of a sync and the settle covers a policy change that
	// leaves them unchanged.
	knpSettle = 500 * time.Millisecond
	// saDir is where a pod's ServiceAccount token and CA are mounted; the
	// peer has no --kubeconfig and reads only these (rest.InClusterConfig).
	saDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// KNPBinary returns $NFTPOLICY_KNP_BIN, or the binary hack/compare.sh
// builds into ${NFTPOLICY_COMPARE:-/var/cache/nftpolicy/compare}/bin. The
// error says how to build it; tests skip with it.
func KNPBinary() (string, error) {
	if p := os.Getenv(KNPBinEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s: %w", KNPBinEnv, err)
		}
		return p, nil
	}
	cache := os.Getenv("NFTPOLICY_COMPARE")
	if cache == "" {
		cache = "/var/cache/nftpolicy/compare"
	}
	p := filepath.Join(cache, "bin", "kube-network-policies")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("the kube-network-policies binary is not built (%v): run `bash hack/compare.sh build` or set %s", err, KNPBinEnv)
	}
	return p, nil
}

// RequireKNP skips t, with the reason and how to build it, unless
// KNPBinary finds the peer: it is not a tool every suite needs, and make
// test does not build it, so even NFTPOLICY_REQUIRE_TOOLS does not turn
// its absence into a failure.
func RequireKNP(t testing.TB) {
	t.Helper()
	if _, err := KNPBinary(); err != nil {
		t.Skipf("the comparison with kube-network-policies needs its binary, which make test does not build: %v", err)
	}
}

// CompareRunEnv is set by hack/compare.sh: the side-by-side measurements
// (minutes long) run only then, not in every `go test ./...` of a machine
// where the peer happens to be built.
const CompareRunEnv = "NFTPOLICY_COMPARE_RUN"

// RequireCompareRun skips t unless hack/compare.sh runs it (CompareRunEnv),
// and then as RequireKNP does.
func RequireCompareRun(t testing.TB) {
	t.Helper()
	if os.Getenv(CompareRunEnv) == "" {
		t.Skipf("the side-by-side measurement with kube-network-policies runs from hack/compare.sh (make compare), which sets %s=1", CompareRunEnv)
	}
	RequireKNP(t)
}

// tableName is the nftables table the cluster's enforcer owns in each node
// namespace.
func (c *Cluster) tableName() string {
	if c.cfg.Enforcer == EnforcerKNP {
		return KNPTable
	}
	return compile.TableName
}

// Enforcer is the cluster's enforcer.
func (c *Cluster) Enforcer() Enforcer { return c.cfg.Enforcer }

// writeKNPServiceAccount writes the files the peer reads from saDir into
// dir: the token and the API server's CA.
func writeKNPServiceAccount(dir, token string, ca []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(token), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o644)
}

// knpArgv is the peer's command line, to run inside the node namespace. It
// gets a mount namespace of its own (unshare) with a private tmpfs on /run
// (/var/run), holding only the ServiceAccount files it reads; nothing else
// of /run is used by it (its NRI socket is absent either way, which it only
// logs). The tmpfs goes with the namespace when the process exits. The
// shell execs the peer, so the PID the harness holds is the peer's.
func (a *Agent) knpArgv() []string {
	script := `set -e
mount -t tmpfs -o size=1m,mode=0755 nftpolicy-harness /run
mkdir -p ` + saDir + `
cp "$1/token" "$1/ca.crt" ` + saDir + `/
shift
exec "$@"`
	argv := []string{"unshare", "--mount", "sh", "-c", script, "knp-harness", a.saDir, a.c.bin,
		"--hostname-override", a.Node,
		"--nfqueue-id", strconv.Itoa(KNPQueueNum),
		"--metrics-bind-address", a.MetricsAddr,
		// v0.8.0 logs every packet at -v=2.
		"--v", "1",
	}
	return append(argv, a.c.cfg.AgentArgs...)
}

// knpEnv is the environment the peer finds the API server by: the node's
// relay, as a pod would find the kubernetes Service.
func (a *Agent) knpEnv() []string {
	host, port, _ := strings.Cut(a.relay.addr(), ":")
	return append(os.Environ(), "KUBERNETES_SERVICE_HOST="+host, "KUBERNETES_SERVICE_PORT="+port)
}

// waitKNPReady polls until the peer has installed its table and bound its
// queue in the node namespace (it binds the queue after its first sync).
func (a *Agent) waitKNPReady(ctx context.Context) error {
	for {
		p := a.current()
		if p.exited() {
			return fmt.Errorf("cluster: the %s agent of %s exited (%s) before it was ready; log tail:\n%s", EnforcerKNP, a.Node, exitText(p.err), a.LogTail(30))
		}
		has, err := a.c.HasTable(a.Node)
		var bound bool
		if err == nil && has {
			err = a.c.Lab.InNode(a.Node, func() error {
				st, err := queue.ReadKernelQueueStats()
				bound = queue.BoundQueues(st, KNPQueueNum, 1) == 1
				if errors.Is(err, os.ErrNotExist) {
					return nil
				}
				return err
			})
		}
		if bound {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: the %s agent of %s is not ready (table %v, queue bound %v, err %v): %w; log tail:\n%s",
				EnforcerKNP, a.Node, has, bound, err, ctx.Err(), a.LogTail(30))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// knpWantIPs returns, per node, the pod IPs the peer puts in its
// podips-v4/-v6 sets: every address of the pods of that node that some
// NetworkPolicy's podSelector selects (v0.8.0's getLocalPodsForNetworkPolicy).
func (c *Cluster) knpWantIPs(ctx context.Context) (map[string][]netip.Addr, error) {
	nps, err := c.Client.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing network policies: %w", err)
	}
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	want := map[string][]netip.Addr{}
	for i := range nps.Items {
		np := &nps.Items[i]
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			continue // the peer skips it too
		}
		for j := range pods.Items {
			pod := &pods.Items[j]
			if pod.Namespace != np.Namespace || !sel.Matches(labels.Set(pod.Labels)) {
				continue
			}
			want[pod.Spec.NodeName] = append(want[pod.Spec.NodeName], podAddrs(pod)...)
		}
	}
	for n, ips := range want {
		slices.SortFunc(ips, func(a, b netip.Addr) int { return a.Compare(b) })
		want[n] = slices.Compact(ips)
	}
	return want, nil
}

func podAddrs(pod *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// knpSetIPs reads the peer's podips-v4 and podips-v6 sets in a node's
// namespace, sorted.
func (c *Cluster) knpSetIPs(node string) ([]netip.Addr, error) {
	var out []netip.Addr
	err := c.Lab.InNode(node, func() error {
		conn, err := nftables.New()
		if err != nil {
			return err
		}
		t := &nftables.Table{Family: nftables.TableFamilyINet, Name: KNPTable}
		for _, name := range []string{"podips-v4", "podips-v6"} {
			set, err := conn.GetSetByName(t, name)
			if err != nil {
				return fmt.Errorf("set %s: %w", name, err)
			}
			els, err := conn.GetSetElements(set)
			if err != nil {
				return fmt.Errorf("elements of set %s: %w", name, err)
			}
			for _, e := range els {
				if a, ok := netip.AddrFromSlice(e.Key); ok {
					out = append(out, a)
				}
			}
		}
		return nil
	})
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out, err
}

// waitKNPProgrammed is WaitProgrammed for the peer: every running agent's
// pod-IP sets equal what the API's objects select on its node, then
// knpSettle.
func (c *Cluster) waitKNPProgrammed(ctx context.Context, agents []*Agent) (time.Duration, error) {
	start := time.Now()
	var last string
	for {
		want, err := c.knpWantIPs(ctx)
		done := err == nil
		if err != nil {
			last = err.Error()
		}
		for _, a := range agents {
			if !done {
				break
			}
			if !a.Running() {
				return time.Since(start), fmt.Errorf("cluster: WaitProgrammed: the %s agent of %s exited; log tail:\n%s", EnforcerKNP, a.Node, a.LogTail(30))
			}
			have, err := c.knpSetIPs(a.Node)
			if err != nil || !slices.Equal(have, want[a.Node]) {
				done = false
				last = fmt.Sprintf("%s: sets hold %v, the API selects %v (err %v)", a.Node, have, want[a.Node], err)
			}
		}
		if done {
			select {
			case <-ctx.Done():
				return time.Since(start), ctx.Err()
			case <-time.After(knpSettle):
			}
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return time.Since(start), fmt.Errorf("cluster: WaitProgrammed (%s): %w after %v; last: %s", EnforcerKNP, ctx.Err(), time.Since(start).Round(time.Millisecond), last)
		case <-time.After(25 * time.Millisecond):
		}
	}
}
