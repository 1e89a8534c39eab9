package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"
)

// ReporterConfig configures a Reporter.
type ReporterConfig struct {
	// Node is the node's name, and the NodeEnforcement's.
	Node string
	// NodeUID, if set, makes the Node the NodeEnforcement's owner: it is
	// deleted with the Node.
	NodeUID types.UID
	Client  dynamic.Interface
	// RetryDelay is the wait after a failed write (default 100 ms, doubling
	// up to 30 s).
	RetryDelay time.Duration
	// AgentVersion is the agent's version, written into the status.
	AgentVersion string
	// OnWrite, if set, is told each write's outcome (metrics).
	OnWrite func(err error)
	Logger  klog.Logger
}

// Publication is what a commit put in force.
type Publication struct {
	Watermarks Watermarks
	// Changes are the policy changes this commit programmed.
	Changes []Change
	// Problems are all the policies enforced fail-closed, now.
	Problems []Problem
	At       time.Time
}

// Reporter keeps the node's NodeEnforcement current. Programmed and
// SyncFailed never block; Run writes.
type Reporter struct {
	cfg  ReporterConfig
	mu   sync.Mutex
	st   NodeStatus
	gen  uint64 // bumped by each change of st
	kick chan struct{}
}

// NewReporter returns a Reporter; start it with Run.
func NewReporter(cfg ReporterConfig) (*Reporter, error) {
	if cfg.Node == "" || cfg.Client == nil {
		return nil, errors.New("status reporter: Node and Client are required")
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = 100 * time.Millisecond
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background().WithName("status")
	}
	return &Reporter{cfg: cfg, st: NodeStatus{AgentVersion: cfg.AgentVersion}, kick: make(chan struct{}, 1)}, nil
}

// Programmed records a commit.
func (r *Reporter) Programmed(p Publication) {
	r.mu.Lock()
	at := metav1.NewMicroTime(p.At)
	r.st.Programmed, r.st.ProgrammedAt, r.st.SyncError = p.Watermarks, &at, nil
	r.st.Changes = append(r.st.Changes, p.Changes...)
	if n := len(r.st.Changes) - MaxChanges; n > 0 {
		r.st.Changes = append([]Change(nil), r.st.Changes[n:]...)
	}
	problems := append([]Problem(nil), p.Problems...)
	sort.Slice(problems, func(i, j int) bool { return problems[i].String() < problems[j].String() })
	r.st.ProblemsOmitted = 0
	if n := len(problems) - MaxProblems; n > 0 {
		problems, r.st.ProblemsOmitted = problems[:MaxProblems], n
	}
	for i := range problems {
		problems[i].Message = truncate(problems[i].Message, maxMessage)
	}
	r.st.Problems = problems
	r.gen++
	r.mu.Unlock()
	r.wake()
}

// SyncFailed records a failed sync; the first failure since the last
// commit sets the error's start.
func (r *Reporter) SyncFailed(err error, at time.Time) {
	r.mu.Lock()
	msg := truncate(err.Error(), maxMessage)
	if r.st.SyncError == nil {
		r.st.SyncError = &SyncError{Since: metav1.NewMicroTime(at)}
	}
	if r.st.SyncError.Message == msg {
		r.mu.Unlock()
		return
	}
	// A new SyncError: Run may be writing the previous one.
	se := *r.st.SyncError
	se.Message = msg
	r.st.SyncError = &se
	r.gen++
	r.mu.Unlock()
	r.wake()
}

func (r *Reporter) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run writes the status after each change until ctx ends: one write in
// flight, so changes during a write are coalesced into the next one.
func (r *Reporter) Run(ctx context.Context) {
	var written uint64
	var lastErr string // logged at error level once while it repeats
	delay := r.cfg.RetryDelay
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		r.mu.Lock()
		gen, st := r.gen, r.st
		r.mu.Unlock()
		if gen == written {
			continue
		}
		err := r.write(ctx, &st)
		if r.cfg.OnWrite != nil {
			r.cfg.OnWrite(err)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if msg := err.Error(); msg != lastErr {
				lastErr = msg
				r.cfg.Logger.Error(err, "Writing the node's NodeEnforcement failed; retrying", "node", r.cfg.Node, "retryIn", delay)
			} else {
				r.cfg.Logger.V(2).Info("Writing the node's NodeEnforcement failed again; retrying", "node", r.cfg.Node, "err", err, "retryIn", delay)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, 30*time.Second)
			r.wake()
			continue
		}
		delay, lastErr = r.cfg.RetryDelay, ""
		written = gen
	}
}

// write merges the status into the object, creating it when missing.
func (r *Reporter) write(ctx context.Context, st *NodeStatus) error {
	res := r.cfg.Client.Resource(GVR)
	patch, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		return err
	}
	_, err = res.Patch(ctx, r.cfg.Node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	if !apierrors.IsNotFound(err) {
		return err
	}
	obj := &NodeEnforcement{
		TypeMeta:   metav1.TypeMeta{APIVersion: Group + "/" + Version, Kind: Kind},
		ObjectMeta: metav1.ObjectMeta{Name: r.cfg.Node, Labels: map[string]string{"app.kubernetes.io/name": "nftpolicy"}},
		Status:     *st,
	}
	if r.cfg.NodeUID != "" {
		obj.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: r.cfg.Node, UID: r.cfg.NodeUID}}
	}
	u, err := toUnstructured(obj)
	if err != nil {
		return err
	}
	_, err = res.Create(ctx, u, metav1.CreateOptions{FieldManager: fieldManager})
	if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("created by someone else meanwhile: %w", err)
	}
	return err
}

const fieldManager = "nftpolicy-agent"

func toUnstructured(v any) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// FromUnstructured decodes a NodeEnforcement read through a dynamic client.
func FromUnstructured(u *unstructured.Unstructured) (*NodeEnforcement, error) {
	var ne NodeEnforcement
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ne); err != nil {
		return nil, fmt.Errorf("NodeEnforcement %s: %w", u.GetName(), err)
	}
	return &ne, nil
}
