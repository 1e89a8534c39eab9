package evaluate

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// A restarted agent has no program until its informers have synced and its
// first transaction committed: half a second to a second in which, in queue
// mode, every new connection is dropped (fail-closed) or admitted unchecked
// (fail-open). The kernel's table, which stays in place, goes on queueing.
// So the agent keeps, on the node, a snapshot of the input of the program in
// force, and a new agent rebuilds that program before it binds the queues:
// it then decides exactly as the dead one did, from its first packet.
//
// The snapshot never admits what the program in force at the crash would
// not: Swap removes the file (synchronously) before it publishes a new
// program, and the new program's snapshot is written afterwards, in the
// background; a crash in between leaves no snapshot, and the agent starts
// fail-closed as without one. A snapshot is used only until the agent's
// first sync publishes a program, and only when its checksum, format
// version and node name match. Keep it on a tmpfs (/run): after a reboot
// the table is gone and so must the snapshot be.

// SnapshotFile returns the snapshot's name in the state directory. It
// names the node: test clusters whose "nodes" share one host file system
// (network namespaces) give every agent the same hostPath.
func SnapshotFile(node string) string { return "program-input-" + node + ".json" }

// snapshotVersion changes whenever the saved fields change meaning.
// Version 2: pods in compile.PodInfo form (the controller's), and the pod
// ranges (--pod-cidrs, the nodes' spec.podCIDRs).
const snapshotVersion = 2

// ErrUnknownSnapshotFormat wraps the error of a snapshot written in a
// format version this agent does not read (an agent of another version
// wrote it: an upgrade or a rollback). The agent then starts without it.
var ErrUnknownSnapshotFormat = errors.New("program snapshot of a format this agent does not know")

// peekVersion returns the format version of a document that begins, as
// encodeSnapshot writes it, with its "version" field (JSON whitespace
// allowed), and false for any other: the version is read before the rest,
// whose shape another version may have changed.
func peekVersion(doc []byte) (int, bool) {
	rest := doc
	for _, tok := range []string{"{", `"version"`, ":"} {
		rest = bytes.TrimLeft(rest, " \t\r\n")
		var ok bool
		if rest, ok = bytes.CutPrefix(rest, []byte(tok)); !ok {
			return 0, false
		}
	}
	rest = bytes.TrimLeft(rest, " \t\r\n")
	n, digits := 0, 0
	for _, c := range rest {
		if c < '0' || c > '9' || digits == 9 {
			break
		}
		n, digits = n*10+int(c-'0'), digits+1
	}
	return n, digits > 0
}

// Snapshots keeps the snapshot of the program in force in a directory.
// Attach it to an Evaluator (Evaluator.Snapshots) and run Run.
type Snapshots struct {
	// AfterWrite, if set before Run, is called after each snapshot
	// written or failed: writing one of a large cluster makes megabytes
	// of garbage (controller.MemoryReleaser.Soon).
	AfterWrite func()

	path string
	node string
	log  klog.Logger

	// mu orders removal and renames: gen counts invalidations, and a
	// snapshot is renamed into place only if no invalidation came after
	// the Save of its program.
	mu  sync.Mutex
	gen uint64
	// broken: the file could not be removed once; never write again.
	broken bool
	next   atomic.Pointer[pendingSnapshot]
	kick   chan struct{}

	saved, failed atomic.Uint64
	lastBytes     atomic.Int64
}

type pendingSnapshot struct {
	p   *compile.Program
	gen uint64
}

// NewSnapshots returns the snapshots of node's program in dir, creating
// dir (mode 0700: the snapshot holds pod and policy metadata).
func NewSnapshots(dir, node string, log klog.Logger) (*Snapshots, error) {
	if dir == "" || node == "" {
		return nil, errors.New("snapshots need a directory and a node name")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if strings.ContainsAny(node, "/\x00") || node == "." || node == ".." {
		return nil, fmt.Errorf("node name %q cannot name a file", node)
	}
	return &Snapshots{path: filepath.Join(dir, SnapshotFile(node)), node: node, log: log, kick: make(chan struct{}, 1)}, nil
}

// Path returns the snapshot file's path.
func (s *Snapshots) Path() string { return s.path }

// invalidate removes the snapshot: called before a new program is
// published, so that the file never outlives the program it holds.
func (s *Snapshots) invalidate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	if s.broken {
		return
	}
	if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		// A snapshot that cannot be removed could outlive its program.
		// Emptied, it fails the checksum; either way no snapshot is
		// written any more.
		s.broken = true
		s.failed.Add(1)
		terr := os.WriteFile(s.path, nil, 0o600)
		s.log.Error(errors.Join(err, terr), "Cannot remove the program snapshot; snapshots are off until the agent restarts", "path", s.path)
	}
}

// save schedules a snapshot of p, the program just published.
func (s *Snapshots) save(p *compile.Program) {
	s.mu.Lock()
	g := s.gen
	s.mu.Unlock()
	s.next.Store(&pendingSnapshot{p: p, gen: g})
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// snapshotIdleFactor spaces the writes: after a write that took d, the
// next one waits 4d, so that writing snapshots of a large cluster under
// churn takes at most a fifth of a CPU. Meanwhile there is no snapshot
// (each publication removes it), which only means fail-closed as without
// one if the agent dies then.
const snapshotIdleFactor = 4

// Run writes the snapshots Save schedules, the latest only when programs
// come faster than they are written, until ctx is done.
func (s *Snapshots) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
		ps := s.next.Swap(nil)
		if ps == nil {
			continue
		}
		start := time.Now()
		if err := s.write(ps); err != nil {
			s.failed.Add(1)
			s.log.Error(err, "Cannot write the program snapshot; a restarted agent will drop queued connections until its first sync", "path", s.path)
		}
		if s.AfterWrite != nil {
			s.AfterWrite()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(snapshotIdleFactor * time.Since(start)):
		}
	}
}

func (s *Snapshots) write(ps *pendingSnapshot) error {
	tmp, err := os.CreateTemp(filepath.Dir(s.path), ".snapshot-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename: ENOENT, ignored
	size, err := writeSnapshotFile(tmp, s.node, ps.p.Source)
	if err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != ps.gen || s.broken {
		return nil // a newer program was published meanwhile: its own save follows
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return err
	}
	s.saved.Add(1)
	s.lastBytes.Store(size)
	return nil
}

// writeSnapshotFile writes the snapshot of in to f, an empty file: the
// checksum line is written last, over a placeholder of its size, once the
// document has streamed past the hash. It returns the file's size.
func writeSnapshotFile(f *os.File, node string, in compile.Input) (int64, error) {
	var head [sha256.Size*2 + 1]byte
	head[len(head)-1] = '\n'
	if _, err := f.Write(head[:]); err != nil {
		return 0, err
	}
	bw := bufio.NewWriterSize(f, 64<<10)
	sum, err := encodeSnapshot(bw, node, in)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return 0, err
	}
	hex.Encode(head[:], sum[:])
	if _, err := f.WriteAt(head[:len(head)-1], 0); err != nil {
		return 0, err
	}
	return f.Seek(0, io.SeekCurrent) // WriteAt leaves the offset at the end
}

// SnapshotStats counts snapshot writes.
type SnapshotStats struct {
	Saved, Failed uint64
	// LastBytes is the size of the last snapshot written.
	LastBytes int64
}

// Stats returns the counters.
func (s *Snapshots) Stats() SnapshotStats {
	return SnapshotStats{Saved: s.saved.Load(), Failed: s.failed.Load(), LastBytes: s.lastBytes.Load()}
}

// Load reads the snapshot and rebuilds its program. It returns an error
// wrapping os.ErrNotExist when there is none, and another error when it
// is unusable (corrupt, another format version, another node's): the
// caller then starts without a program.
func (s *Snapshots) Load() (*compile.Program, time.Time, error) {
	b, err := os.ReadFile(s.path)
	if err != nil {
		return nil, time.Time{}, err
	}
	in, written, err := decodeSnapshot(s.node, b)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%s: %w", s.path, err)
	}
	return compile.Build(in), written, nil
}

// snapshotDoc is the file's JSON document, after a first line with the
// SHA-256 of the rest.
type snapshotDoc struct {
	Version         int                                `json:"version"`
	Node            string                             `json:"node"`
	Written         time.Time                          `json:"written"`
	NodeIPs         []string                           `json:"nodeIPs,omitempty"`
	Namespaces      []*corev1.Namespace                `json:"namespaces,omitempty"`
	Pods            []snapshotPod                      `json:"pods,omitempty"`
	PodCIDRs        []string                           `json:"podCIDRs,omitempty"`
	Policies        []*networkingv1.NetworkPolicy      `json:"policies,omitempty"`
	ClusterPolicies []*npav1beta1.ClusterNetworkPolicy `json:"clusterPolicies,omitempty"`
	Nodes           []*corev1.Node                     `json:"nodes,omitempty"`
	// Budgets are the agent's cost budgets (compile.Input.Budgets): a
	// program restored with other budgets would admit a policy the agent
	// rejected, or reject one it admitted.
	Budgets *snapshotBudgets `json:"budgets,omitempty"`
}

// snapshotBudgets is a compile.Budgets, with JSON names.
type snapshotBudgets struct {
	Policy        int `json:"policy,omitempty"`
	Namespace     int `json:"namespace,omitempty"`
	ClusterPolicy int `json:"clusterPolicy,omitempty"`
}

// snapshotPod is a compile.PodInfo: the pod as compile.Build reads it.
// Its own type, with JSON names, so that a field added to PodInfo does not
// change the file's format unnoticed.
type snapshotPod struct {
	Namespace         string                  `json:"namespace"`
	Name              string                  `json:"name"`
	Labels            map[string]string       `json:"labels,omitempty"`
	CreationTimestamp metav1.Time             `json:"created"`
	DeletionTimestamp *metav1.Time            `json:"deleted,omitempty"`
	Node              string                  `json:"node,omitempty"`
	Eligible          bool                    `json:"eligible,omitempty"`
	IPs               []netip.Addr            `json:"ips,omitempty"`
	Ports             []compile.ContainerPort `json:"ports,omitempty"`
}

func leanPod(p *compile.PodInfo) snapshotPod {
	return snapshotPod{
		Namespace: p.Namespace, Name: p.Name, Labels: p.Labels,
		CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp,
		Node: p.Node, Eligible: p.Eligible, IPs: p.IPs, Ports: p.Ports,
	}
}

func (sp snapshotPod) info() *compile.PodInfo {
	pi := &compile.PodInfo{
		Labels: sp.Labels, CreationTimestamp: sp.CreationTimestamp, DeletionTimestamp: sp.DeletionTimestamp,
		Node: sp.Node, Eligible: sp.Eligible, IPs: sp.IPs, Ports: sp.Ports,
	}
	pi.SetKey(sp.Namespace, sp.Name)
	return pi
}

// encodeSnapshot writes the document of a snapshot (what follows its
// checksum line) to w and returns its SHA-256. It encodes what
// compile.Build reads of in, and nothing else (no managed fields,
// annotations but the staged one, images, volumes ...): a pod takes a
// few hundred bytes. Pods are saved as compile.PodInfos (the controller's
// form), in.Pods read into that form.
//
// The document streams out item by item (pods in batches of podBatch
// bytes), so that a large cluster's snapshot is never held whole (with its
// copies and encoding/json's pooled buffer, which outlives the write): the
// agent's resident memory does not depend on whether a snapshot is being
// written. The pods, nearly all of it, are written by podJSON, exactly as
// encoding/json would write them, without its reflection.
func encodeSnapshot(w io.Writer, node string, in compile.Input) (sum [sha256.Size]byte, err error) {
	h := sha256.New()
	mw := io.MultiWriter(w, h)
	d := docWriter{w: mw, enc: json.NewEncoder(mw)}
	d.raw("{")
	d.field("version", snapshotVersion) // first: see peekVersion
	d.field("node", node)
	d.field("written", time.Now().UTC())
	writeArray(&d, "nodeIPs", in.NodeIPs, func(a netip.Addr) any { return a.String() })
	writeArray(&d, "namespaces", in.Namespaces, func(ns *corev1.Namespace) any {
		return &corev1.Namespace{ObjectMeta: leanMeta(ns.ObjectMeta)}
	})
	writePods(&d, in)
	writeArray(&d, "podCIDRs", in.PodCIDRs, func(c netip.Prefix) any { return c.String() })
	writeArray(&d, "policies", in.Policies, func(np *networkingv1.NetworkPolicy) any {
		return &networkingv1.NetworkPolicy{ObjectMeta: leanMeta(np.ObjectMeta), Spec: np.Spec}
	})
	writeArray(&d, "clusterPolicies", in.ClusterPolicies, func(cnp *npav1beta1.ClusterNetworkPolicy) any {
		return &npav1beta1.ClusterNetworkPolicy{ObjectMeta: leanMeta(cnp.ObjectMeta), Spec: cnp.Spec}
	})
	if in.Budgets != (compile.Budgets{}) {
		d.field("budgets", snapshotBudgets{Policy: in.Budgets.Policy, Namespace: in.Budgets.Namespace, ClusterPolicy: in.Budgets.ClusterPolicy})
	}
	writeArray(&d, "nodes", in.Nodes, func(n *corev1.Node) any {
		return &corev1.Node{ObjectMeta: leanMeta(n.ObjectMeta),
			Spec:   corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
			Status: corev1.NodeStatus{Addresses: n.Status.Addresses}}
	})
	d.raw("}")
	if d.err != nil {
		return sum, fmt.Errorf("encoding the program snapshot: %w", d.err)
	}
	h.Sum(sum[:0])
	return sum, nil
}

// podBatch is how many bytes of encoded pods are written at once: the
// pods go out in batches of about this size, through one reused buffer.
const podBatch = 32 << 10

// writePods writes the field "pods": in.PodInfos, then in.Pods, each
// followed by a newline as json.Encoder ends what it encodes (podJSON
// writes them as encoding/json would).
func writePods(d *docWriter, in compile.Input) {
	n := len(in.PodInfos) + len(in.Pods)
	if n == 0 {
		return
	}
	d.key("pods")
	d.raw("[")
	var (
		e   podJSON
		sp  snapshotPod
		buf = make([]byte, 0, podBatch+4<<10)
	)
	for i := range n {
		if i < len(in.PodInfos) {
			sp = leanPod(in.PodInfos[i])
		} else {
			sp = leanPod(compile.NewPodInfo(in.Pods[i-len(in.PodInfos)]))
		}
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(e.appendPod(buf, &sp), '\n')
		if len(buf) >= podBatch {
			d.write(buf)
			buf = buf[:0]
		}
	}
	d.write(buf)
	d.raw("]")
}

// docWriter writes a JSON object field by field; the first error sticks.
type docWriter struct {
	w      io.Writer
	enc    *json.Encoder
	fields int
	err    error
}

func (d *docWriter) raw(s string) {
	if d.err == nil {
		_, d.err = io.WriteString(d.w, s)
	}
}

func (d *docWriter) write(b []byte) {
	if d.err == nil {
		_, d.err = d.w.Write(b)
	}
}

// value encodes v (the encoder ends it with a newline, which JSON reads as
// space).
func (d *docWriter) value(v any) {
	if d.err == nil {
		d.err = d.enc.Encode(v)
	}
}

func (d *docWriter) key(name string) {
	if d.fields > 0 {
		d.raw(",")
	}
	d.fields++
	d.value(name)
	d.raw(":")
}

func (d *docWriter) field(name string, v any) {
	d.key(name)
	d.value(v)
}

// item writes the i-th element of an array.
func (d *docWriter) item(i int, v any) {
	if i > 0 {
		d.raw(",")
	}
	d.value(v)
}

// writeArray writes the field name with items, each as conv returns it;
// nothing when there are none (the document's omitempty).
func writeArray[T any](d *docWriter, name string, items []T, conv func(T) any) {
	if len(items) == 0 {
		return
	}
	d.key(name)
	d.raw("[")
	for i, it := range items {
		d.item(i, conv(it))
	}
	d.raw("]")
}

func decodeSnapshot(node string, b []byte) (compile.Input, time.Time, error) {
	var in compile.Input
	nl := bytes.IndexByte(b, '\n')
	if nl != 64 {
		return in, time.Time{}, errors.New("not a program snapshot (no checksum line)")
	}
	sum := sha256.Sum256(b[nl+1:])
	if hex.EncodeToString(sum[:]) != string(b[:nl]) {
		return in, time.Time{}, errors.New("checksum mismatch: the snapshot is damaged")
	}
	if v, ok := peekVersion(b[nl+1:]); ok && v != snapshotVersion {
		return in, time.Time{}, fmt.Errorf("%w: format version %d, this agent reads %d", ErrUnknownSnapshotFormat, v, snapshotVersion)
	}
	var d snapshotDoc
	if err := decodeDoc(b[nl+1:], &d); err != nil {
		return in, time.Time{}, fmt.Errorf("decoding: %w", err)
	}
	if d.Version != snapshotVersion {
		return in, time.Time{}, fmt.Errorf("%w: format version %d, this agent reads %d", ErrUnknownSnapshotFormat, d.Version, snapshotVersion)
	}
	if d.Node != node {
		return in, time.Time{}, fmt.Errorf("snapshot of node %q, this is %q", d.Node, node)
	}
	in.NodeName = d.Node
	for _, s := range d.NodeIPs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return compile.Input{}, time.Time{}, fmt.Errorf("node address %q: %w", s, err)
		}
		in.NodeIPs = append(in.NodeIPs, a)
	}
	for _, s := range d.PodCIDRs {
		c, err := netip.ParsePrefix(s)
		if err != nil {
			return compile.Input{}, time.Time{}, fmt.Errorf("pod range %q: %w", s, err)
		}
		in.PodCIDRs = append(in.PodCIDRs, c)
	}
	in.PodInfos = make([]*compile.PodInfo, len(d.Pods))
	for i, sp := range d.Pods {
		in.PodInfos[i] = sp.info()
	}
	in.Namespaces, in.Policies, in.ClusterPolicies, in.Nodes = d.Namespaces, d.Policies, d.ClusterPolicies, d.Nodes
	if b := d.Budgets; b != nil {
		in.Budgets = compile.Budgets{Policy: b.Policy, Namespace: b.Namespace, ClusterPolicy: b.ClusterPolicy}
	}
	return in, d.Written, nil
}

// leanMeta keeps the metadata compile.Build reads: identity, labels,
// the staged annotation and the timestamps that decide which pod owns a
// contested address.
func leanMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	lean := metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, Generation: m.Generation, Labels: m.Labels,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
	}
	if v, ok := m.Annotations[compile.StagedAnnotation]; ok {
		lean.Annotations = map[string]string{compile.StagedAnnotation: v}
	}
	return lean
}
