package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	ct "github.com/ti-mo/conntrack"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/klog/v2"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// previewServerOptions is the agent's --preview-socket.
type previewServerOptions struct{ socket string }

// defaultPreviewSocket is where install.yaml's agent listens (an emptyDir
// of its pod) and where `nftpolicy preview --local` asks.
const defaultPreviewSocket = "/run/nftpolicy-preview/preview.sock"

// Bounds of one preview: the agent answers one at a time, reads at most
// previewMaxRequest bytes, and stops judging entries after
// previewTimeout.
const (
	previewMaxRequest = 4 << 20
	previewTimeout    = 20 * time.Second
	// defaultPreviewFlows is how many connections a node lists; the
	// rest are counted.
	defaultPreviewFlows = 200
	maxPreviewFlows     = 10000
)

// previewRequest is what `preview --local` sends the agent.
type previewRequest struct {
	// Manifest is the policies, as `kubectl apply -f` reads them.
	Manifest string `json:"manifest"`
	// Namespace is given to NetworkPolicies that name none.
	Namespace string `json:"namespace"`
	// Delete previews deleting the manifest's policies instead.
	Delete   bool `json:"delete,omitempty"`
	MaxFlows int  `json:"maxFlows,omitempty"`
}

// PreviewResult is one node's answer (`nftpolicy preview -o json`).
type PreviewResult struct {
	Node string `json:"node"`
	// Revocation says whether the node's agent revokes connections
	// (--revoke-connections): when it does not, a connection listed as
	// cut keeps flowing until it ends.
	Revocation bool `json:"revocation"`
	// Cut and Allow count the connections whose verdict would change;
	// Flows lists the first MaxFlows of them.
	Cut   int           `json:"cut"`
	Allow int           `json:"allow"`
	Flows []PreviewFlow `json:"flows"`
	// AffectedAddresses is how many local pod addresses the change may
	// decide differently; DumpedEntries how many conntrack entries were
	// read (0: none needed reading).
	AffectedAddresses int      `json:"affectedAddresses"`
	DumpedEntries     int      `json:"dumpedEntries"`
	DurationSeconds   float64  `json:"durationSeconds"`
	Warnings          []string `json:"warnings,omitempty"`
	// Error is set by `kubectl nftpolicy preview` for a node it could not
	// ask.
	Error string `json:"error,omitempty"`
}

// PreviewFlow is one live connection whose verdict would change.
type PreviewFlow struct {
	// Change is "cut" (allowed now, denied then) or "allow".
	Change   string `json:"change"`
	Protocol string `json:"protocol"`
	// Source is the client; Destination the server after Service DNAT,
	// with the port policy sees.
	Source      string `json:"source"`
	Destination string `json:"destination"`
	// Policy is the policy that would deny a cut connection (as
	// nftpolicy_revoked_flows_total names it); Reason the deciding rule
	// of the verdict it would get.
	Policy string `json:"policy,omitempty"`
	Reason string `json:"reason"`
}

// previewServer answers previews for the agent of node.
type previewServer struct {
	node string
	// snapshot and current are the controller's inputs and program in
	// force.
	snapshot func() (compile.Input, error)
	current  func() *compile.Program
	eval     *evaluate.Evaluator
	revoke   bool
	// table opens the node's conntrack table; nil: ctnetlink in the
	// agent's network namespace.
	table func() (conntrack.Table, func(), error)
	// afterBuild returns the candidate program's memory (MemoryReleaser).
	afterBuild func()
	busy       chan struct{}
	log        klog.Logger
}

// start listens on --preview-socket and serves previews until ctx ends.
// The socket is the only way in: mode 0600 in a directory of the agent's
// own pod, so only root there (what `kubectl exec` into it runs as, with
// the RBAC that allows that) can ask. Previews are a diagnostic: when the
// socket cannot be made or served, the agent logs it and goes on
// enforcing.
func (o *previewServerOptions) start(ctx context.Context, s *previewServer) {
	if o.socket == "" {
		return
	}
	s.busy = make(chan struct{}, 1)
	s.log = klog.FromContext(ctx).WithName("preview")
	if s.table == nil {
		s.table = openConntrack
	}
	ln, err := listenUnixPrivate(o.socket)
	if err != nil {
		s.log.Error(err, "No previews on this node: cannot listen on --preview-socket", "socket", o.socket)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /preview", s.serve)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: previewTimeout + 30*time.Second, IdleTimeout: 10 * time.Second, MaxHeaderBytes: 16 << 10}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		defer ln.remove()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error(err, "Preview server stopped; no previews on this node until the agent restarts")
		}
	}()
	s.log.Info("Answering previews", "socket", o.socket)
}

// privateUnixListener is a unix socket that removes its path when done,
// unless another process has replaced it meanwhile.
type privateUnixListener struct {
	*net.UnixListener
	path string
	info os.FileInfo
}

// listenUnixPrivate creates the socket at path (replacing a stale one),
// mode 0600, in a directory made mode 0700 when it does not exist.
func listenUnixPrivate(path string) (*privateUnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	// Connecting needs write permission, which the umask (022 for root)
	// already withholds from others until this.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	fi, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, err
	}
	return &privateUnixListener{UnixListener: ln, path: path, info: fi}, nil
}

func (l *privateUnixListener) remove() {
	if fi, err := os.Lstat(l.path); err == nil && os.SameFile(fi, l.info) {
		_ = os.Remove(l.path)
	}
}

func (s *previewServer) serve(w http.ResponseWriter, r *http.Request) {
	select {
	case s.busy <- struct{}{}:
		defer func() { <-s.busy }()
	default:
		http.Error(w, "another preview is running on this node; try again", http.StatusServiceUnavailable)
		return
	}
	var req previewRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, previewMaxRequest))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		http.Error(w, fmt.Sprintf("reading the request (at most %d bytes): %v", previewMaxRequest, err), http.StatusBadRequest)
		return
	}
	m, err := scenario.ParseManifest([]byte(req.Manifest), req.Namespace)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), previewTimeout)
	defer cancel()
	res, err := s.preview(ctx, m, req.Delete, req.MaxFlows)
	if err != nil {
		s.log.Error(err, "Preview failed")
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.log.V(2).Info("Previewed a policy change", "cut", res.Cut, "allow", res.Allow, "dumped", res.DumpedEntries, "duration", res.DurationSeconds)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

// preview judges the node's live connections under the program in force
// and the one the manifest's change would give, as the revoker would
// after that change.
func (s *previewServer) preview(ctx context.Context, m *scenario.Manifest, del bool, maxFlows int) (*PreviewResult, error) {
	start := time.Now()
	if maxFlows <= 0 {
		maxFlows = defaultPreviewFlows
	}
	maxFlows = min(maxFlows, maxPreviewFlows)
	cur := s.current()
	if cur == nil {
		return nil, errors.New("the agent has not synced yet: no program in force")
	}
	in, err := s.snapshot()
	if err != nil {
		return nil, err
	}
	res := &PreviewResult{Node: s.node, Revocation: s.revoke, Flows: []PreviewFlow{}}
	res.Warnings = applyManifest(&in, m, del)
	candidate := compile.Build(in)
	defer s.afterBuild()
	table, closeTable, err := s.table()
	if err != nil {
		return nil, err
	}
	defer closeTable()
	j := conntrack.Judge{Decide: s.eval.DecideSides, DecideBefore: s.eval.DecideSidesBeforeIn(candidate)}
	pass, err := j.Preview(ctx, table, cur, candidate, func(f *ct.Flow, c conntrack.Conn, ch conntrack.Change, d conntrack.Decision) {
		row := previewRow(f, c, d)
		if ch == conntrack.Cut {
			res.Cut++
			row.Change, row.Policy = "cut", conntrack.DecidingPolicy(candidate, c, d)
		} else {
			res.Allow++
		}
		if len(res.Flows) < maxFlows {
			res.Flows = append(res.Flows, row)
		}
	})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(res.Flows, func(i, k int) bool {
		a, b := res.Flows[i], res.Flows[k]
		if a.Change != b.Change {
			return a.Change > b.Change // cut first
		}
		if a.Destination != b.Destination {
			return a.Destination < b.Destination
		}
		return a.Source < b.Source
	})
	res.AffectedAddresses, res.DumpedEntries = pass.Affected, pass.Dumped
	res.DurationSeconds = time.Since(start).Seconds()
	return res, nil
}

// previewRow is a connection's row, as "allow" (preview sets "cut"): a
// protocol without ports (ICMP echoes, GRE, ...) has addresses alone and
// its nft name.
func previewRow(f *ct.Flow, c conntrack.Conn, d conntrack.Decision) PreviewFlow {
	if !c.HasPorts() {
		return PreviewFlow{Change: "allow", Protocol: strings.ToUpper(c.Proto.Name()), Source: c.Src.String(), Destination: c.Dst.String(), Reason: d.Reason}
	}
	return PreviewFlow{Change: "allow", Protocol: c.Proto.String(),
		Source:      netip.AddrPortFrom(c.Src, f.TupleOrig.Proto.SourcePort).String(),
		Destination: netip.AddrPortFrom(c.Dst, c.Port).String(), Reason: d.Reason}
}

// applyManifest replaces (or, with del, removes) in's policies of the
// same namespace/name as the manifest's, after the agent's informer
// transform, so the candidate is built from what the agent would keep of
// them. Staged policies (nftpolicy.io/staged) stay unenforced in the
// build, as in the agent's. It returns what could not be deleted, and the
// staged policies applied (the agent logs them, enforces nothing of them).
func applyManifest(in *compile.Input, m *scenario.Manifest, del bool) []string {
	var warnings []string
	stagedNS := map[string]bool{}
	for _, ns := range in.Namespaces {
		stagedNS[ns.Name] = compile.Staged(ns)
	}
	note := func(kind, key string, found, staged bool) {
		switch {
		case del && !found:
			warnings = append(warnings, fmt.Sprintf("%s %s: not found; nothing to delete", kind, key))
		case !del && staged:
			warnings = append(warnings, fmt.Sprintf("%s %s is staged (%s): logged, not enforced (an enforced version it replaces stops being enforced)", kind, key, compile.StagedAnnotation))
		}
	}
	for i := range m.Policies {
		np := transformed(&m.Policies[i])
		var found bool
		in.Policies, found = replaceByKey(in.Policies, np, del, func(p *networkingv1.NetworkPolicy) string { return p.Namespace + "/" + p.Name })
		note("networkpolicy", np.Namespace+"/"+np.Name, found, compile.NetworkPolicyStaged(np, stagedNS[np.Namespace]))
	}
	for i := range m.ClusterNetworkPolicies {
		cnp := transformed(&m.ClusterNetworkPolicies[i])
		var found bool
		in.ClusterPolicies, found = replaceByKey(in.ClusterPolicies, cnp, del, func(p *npav1beta1.ClusterNetworkPolicy) string { return p.Name })
		note("clusternetworkpolicy", cnp.Name, found, compile.Staged(cnp))
	}
	return warnings
}

// replaceByKey returns list without the items of obj's key and, unless
// del, with obj added; found says whether list had it. list is not
// modified (it is the informers' cache's).
func replaceByKey[T any](list []*T, obj *T, del bool, key func(*T) string) ([]*T, bool) {
	out := make([]*T, 0, len(list)+1)
	found := false
	for _, p := range list {
		if key(p) == key(obj) {
			found = true
			continue
		}
		out = append(out, p)
	}
	if !del {
		out = append(out, obj)
	}
	return out, found
}

// askPreview sends req to the agent's socket and returns its answer.
func askPreview(ctx context.Context, socket string, req previewRequest) (*PreviewResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent/preview", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("asking the agent (%s; does it run with --preview-socket?): %w", socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the agent's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the agent: %s", trimNewline(data))
	}
	var res PreviewResult
	if err := json.Unmarshal(data, &res); err != nil {
		return nil, fmt.Errorf("decoding the agent's answer: %w", err)
	}
	return &res, nil
}

// openConntrack opens the agent's network namespace's conntrack table.
func openConntrack() (conntrack.Table, func(), error) {
	t, err := conntrack.Dial(0)
	if err != nil {
		return nil, nil, err
	}
	return t, func() { _ = t.Close() }, nil
}
