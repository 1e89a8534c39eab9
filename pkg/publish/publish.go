package publish

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Config is the publisher's configuration.
type Config struct {
	// LeaseNamespace and LeaseName name the Lease of the leader election.
	LeaseNamespace, LeaseName string
	// SyncedLeaseName names the Lease (in LeaseNamespace) that the leader
	// renews only while its slices are current: after its first full
	// reconcile, and then every RetryPeriod while no pod change or slice
	// write has waited longer than MaxBacklog and its pod watch is not
	// failing for longer. The agents trust the slices while it is fresh;
	// the election's Lease says only that a leader is alive, which a new
	// leader renews before it has caught up.
	SyncedLeaseName string
	// MaxBacklog is the longest a pod change may wait to be written with
	// the slices still called current.
	MaxBacklog time.Duration
	// Identity is this replica's name in the Lease (its pod's name).
	Identity string
	// Window is how long the leader gathers pod changes after the first
	// into one write per slice. It adds to the programming delay of a
	// remote pod, which must stay within twice an agent watching Pods.
	Window time.Duration
	// LeaseDuration, RenewDeadline and RetryPeriod are the leader
	// election's (client-go's meanings). A standby takes over at most
	// LeaseDuration after the leader stops renewing; the leader renews
	// every RetryPeriod.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// WriteQPS and WriteBurst limit the slice writes (client-side).
	WriteQPS   float32
	WriteBurst int
}

// Defaults fills what is unset.
func (c *Config) Defaults() {
	if c.LeaseNamespace == "" {
		c.LeaseNamespace = "kube-system"
	}
	if c.LeaseName == "" {
		c.LeaseName = "nftpolicy-publisher"
	}
	if c.SyncedLeaseName == "" {
		c.SyncedLeaseName = c.LeaseName + "-synced"
	}
	if c.MaxBacklog == 0 {
		c.MaxBacklog = 10 * time.Second
	}
	if c.Window == 0 {
		c.Window = 2 * time.Millisecond
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 15 * time.Second
	}
	if c.RenewDeadline == 0 {
		c.RenewDeadline = 10 * time.Second
	}
	if c.RetryPeriod == 0 {
		c.RetryPeriod = 2 * time.Second
	}
	if c.WriteQPS == 0 {
		c.WriteQPS = 50
	}
	if c.WriteBurst == 0 {
		c.WriteBurst = 100
	}
}

// MaxWindow bounds Window: a remote pod's programming delay is an agent's
// own (tens of milliseconds) plus the window and one write.
const MaxWindow = 100 * time.Millisecond

// Validate says what is wrong with the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.Identity == "" {
		errs = append(errs, errors.New("no identity (the pod's name)"))
	}
	if c.LeaseNamespace == "" || c.LeaseName == "" || c.SyncedLeaseName == "" {
		errs = append(errs, errors.New("no lease namespace or name"))
	}
	if c.SyncedLeaseName == c.LeaseName {
		errs = append(errs, errors.New("the synced Lease cannot be the leader election's"))
	}
	if c.MaxBacklog <= 0 {
		errs = append(errs, fmt.Errorf("max backlog %v is not positive", c.MaxBacklog))
	}
	if c.Window < 0 || c.Window > MaxWindow {
		errs = append(errs, fmt.Errorf("window %v is not within 0-%v", c.Window, MaxWindow))
	}
	if c.LeaseDuration <= c.RenewDeadline || c.RenewDeadline <= c.RetryPeriod || c.RetryPeriod <= 0 {
		errs = append(errs, fmt.Errorf("lease duration %v, renew deadline %v and retry period %v must be decreasing and positive",
			c.LeaseDuration, c.RenewDeadline, c.RetryPeriod))
	}
	if c.WriteQPS <= 0 || c.WriteBurst <= 0 {
		errs = append(errs, errors.New("write QPS and burst must be positive"))
	}
	return errors.Join(errs...)
}

// Publisher is one replica of the publisher.
type Publisher struct {
	cfg     Config
	rest    *rest.Config
	metrics *Metrics
	log     logr.Logger
	termMu  sync.Mutex
}

// New returns a publisher that talks to the API server through rc; m
// holds its metrics (registered by the caller).
func New(cfg Config, rc *rest.Config, m *Metrics, log logr.Logger) (*Publisher, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Publisher{cfg: cfg, rest: rest.CopyConfig(rc), metrics: m, log: log}, nil
}

// Run takes part in the leader election until ctx ends, and publishes
// while it leads. Leadership lost (the Lease not renewed in time) ends
// the term: its writes stop, and it stands again.
func (p *Publisher) Run(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(p.rest)
	if err != nil {
		return err
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: p.cfg.LeaseNamespace, Name: p.cfg.LeaseName},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: p.cfg.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: p.cfg.LeaseName, ReleaseOnCancel: true,
			LeaseDuration: p.cfg.LeaseDuration, RenewDeadline: p.cfg.RenewDeadline, RetryPeriod: p.cfg.RetryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: p.lead,
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			return err
		}
		le.Run(ctx)
	}
	// A term ends with its context, which Run's return cancelled; wait
	// for the last one to stop writing.
	p.termMu.Lock()
	defer p.termMu.Unlock()
	return nil
}

// lead publishes for one term of leadership.
// The elector starts it in a goroutine that may outlive the elector's
// Run by a moment: termMu makes a replica's next term wait until the
// previous one stopped, so that two terms of one replica never write
// together.
func (p *Publisher) lead(ctx context.Context) {
	p.termMu.Lock()
	defer p.termMu.Unlock()
	if ctx.Err() != nil {
		return
	}
	log := p.log.WithValues("identity", p.cfg.Identity)
	log.Info("leading: publishing PodAddressSlices")
	p.metrics.Leader.Set(1)
	defer func() {
		p.metrics.Leader.Set(0)
		p.metrics.Slices.Set(0)
		p.metrics.Pods.Set(0)
		log.Info("no longer leading")
	}()
	t, err := newTerm(p, log)
	if err != nil {
		log.Error(err, "starting the term")
		<-ctx.Done()
		return
	}
	t.run(ctx)
}
