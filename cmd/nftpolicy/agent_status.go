package main

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/controller"
	"github.com/nftpolicy/nftpolicy/pkg/status"
	"github.com/nftpolicy/nftpolicy/pkg/version"
)

// statusOptions are the flags of the node's status (pkg/status): the
// NodeEnforcement the agent keeps current for `kubectl nftpolicy status`
// and `wait`.
type statusOptions struct {
	report bool
}

// newController creates the controller with cfg, its status hooks wired to
// a Reporter of the node's NodeEnforcement unless --report-status=false.
// Status never holds up enforcement: the hooks only record, the Reporter
// writes from its own goroutine and retries with backoff.
func (o *statusOptions) newController(ctx context.Context, cfg controller.Config, dyn dynamic.Interface, reg prometheus.Registerer) (*controller.Controller, error) {
	if !o.report {
		return controller.New(cfg)
	}
	s := newStatusReporter(ctx, cfg.NodeName, dyn, reg, cfg.Logger.WithName("status"))
	cfg.OnStatus, cfg.OnSyncFailed = s.programmed, s.syncFailed
	ctrl, err := controller.New(cfg)
	if err != nil {
		return nil, err
	}
	s.nodeUID = ctrl.NodeUID
	return ctrl, nil
}

// statusReporter starts the Reporter at the controller's first status
// hook: the caches have synced by then, so the Node's UID (the
// NodeEnforcement's owner: deleted with the Node) is known.
type statusReporter struct {
	ctx     context.Context
	cfg     status.ReporterConfig
	nodeUID func() types.UID
	once    sync.Once
	r       *status.Reporter
	// writes counts the Reporter's writes by result; apiMissing is set
	// while the NodeEnforcement API is not served (logged once).
	writes     *prometheus.CounterVec
	apiMissing bool
}

func newStatusReporter(ctx context.Context, node string, dyn dynamic.Interface, reg prometheus.Registerer, log klog.Logger) *statusReporter {
	s := &statusReporter{ctx: ctx, cfg: status.ReporterConfig{Node: node, Client: dyn, Logger: log, AgentVersion: version.Get().Version}}
	s.writes = newStatusWrites(reg)
	s.cfg.OnWrite = s.written
	return s
}

// newStatusWrites registers nftpolicy_status_writes_total, both results
// present from the start.
func newStatusWrites(reg prometheus.Registerer) *prometheus.CounterVec {
	writes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nftpolicy_status_writes_total",
		Help: "Writes of the node's NodeEnforcement (the status kubectl nftpolicy status and wait read), by result (ok, error); failed writes are retried with backoff.",
	}, []string{"result"})
	writes.WithLabelValues("ok")
	writes.WithLabelValues("error")
	reg.MustRegister(writes)
	return writes
}

// reporter returns the Reporter, started at the first call; nil if it
// could not be made (logged).
func (s *statusReporter) reporter() *status.Reporter {
	s.once.Do(func() {
		if s.nodeUID != nil {
			s.cfg.NodeUID = s.nodeUID()
		}
		r, err := status.NewReporter(s.cfg)
		if err != nil {
			s.cfg.Logger.Error(err, "Not reporting this node's status")
			return
		}
		s.r = r
		go r.Run(s.ctx)
	})
	return s.r
}

func (s *statusReporter) programmed(p status.Publication) {
	if r := s.reporter(); r != nil {
		r.Programmed(p)
	}
}

func (s *statusReporter) syncFailed(err error, at time.Time) {
	if r := s.reporter(); r != nil {
		r.SyncFailed(err, at)
	}
}

// written counts a write and says once, clearly, that the NodeEnforcement
// API is missing: the write's create is answered 404 when the
// CustomResourceDefinition is not installed.
func (s *statusReporter) written(err error) {
	log := s.cfg.Logger
	switch {
	case err == nil:
		s.writes.WithLabelValues("ok").Inc()
		if s.apiMissing {
			s.apiMissing = false
			log.Info("NodeEnforcement API served again; this node's status is reported", "node", s.cfg.Node)
		}
		return
	case apierrors.IsNotFound(err) && !s.apiMissing:
		s.apiMissing = true
		log.Info("The NodeEnforcement API is not served (install.yaml's CustomResourceDefinition nodeenforcements."+status.Group+" is not installed): "+
			"this node's status is not reported until it is; enforcement is not affected. Retrying with backoff; --report-status=false stops reporting",
			"node", s.cfg.Node, "err", err)
	}
	s.writes.WithLabelValues("error").Inc()
}
