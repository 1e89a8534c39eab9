package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/controller"
	"github.com/nftpolicy/nftpolicy/pkg/publish"
	"github.com/nftpolicy/nftpolicy/pkg/version"
)

const publishUsage = `usage: nftpolicy publish [flags]

Publishes every eligible pod's address, labels and ports as PodAddressSlices
(docs/scale-out.md), so that agents need not watch every Pod. Run as a
Deployment of two or more replicas: they elect a leader on a Lease, and only
the leader watches Pods and writes slices.`

type publishOptions struct {
	kubeconfig     string
	cfg            publish.Config
	metricsAddress string
}

func (o *publishOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: the pod's ServiceAccount (in-cluster)")
	fs.StringVar(&o.cfg.LeaseNamespace, "lease-namespace", "kube-system", "namespace of the leader election's Lease and of the synced Lease")
	fs.StringVar(&o.cfg.LeaseName, "lease-name", "nftpolicy-publisher", "name of the leader election's Lease")
	fs.StringVar(&o.cfg.SyncedLeaseName, "synced-lease-name", "nftpolicy-publisher-synced",
		"name of the Lease the leader renews only while its slices are current, which the agents read (--pod-slices-lease-name)")
	fs.DurationVar(&o.cfg.MaxBacklog, "max-backlog", 10*time.Second,
		"the synced Lease is not renewed while a pod change has waited longer than this to be written, or the pod watch has failed for longer")
	fs.StringVar(&o.cfg.Identity, "identity", "", "this replica's name in the Lease; empty: $POD_NAME (set from the downward API)")
	fs.DurationVar(&o.cfg.Window, "batch-window", 2*time.Millisecond,
		fmt.Sprintf("how long the leader gathers pod changes after the first into one write per slice (at most %v: it adds to a remote pod's programming delay)", publish.MaxWindow))
	fs.StringVar(&o.metricsAddress, "metrics-bind-address", ":9404", "address of /metrics and /healthz (plain HTTP; empty: none)")
}

func publishFlagSet(o *publishOptions) *pflag.FlagSet {
	fs := pflag.NewFlagSet("publish", pflag.ContinueOnError)
	o.addFlags(fs)
	return fs
}

func runPublish(args []string, stdout, stderr io.Writer) int {
	o := &publishOptions{}
	fs := publishFlagSet(o)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintf(stderr, "%s\n\nflags:\n%s", publishUsage, fs.FlagUsages()) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		return exitBadInput
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "nftpolicy publish: unexpected arguments %q\n", fs.Args())
		return exitBadInput
	}
	if o.cfg.Identity == "" {
		o.cfg.Identity = os.Getenv("POD_NAME")
	}
	o.cfg.Defaults()
	if err := o.cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "nftpolicy publish: %v\n", err)
		return exitBadInput
	}
	defer klog.Flush()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := klog.Background().WithName("publisher")
	info := version.Get()
	logger.Info("Starting nftpolicy publisher", "version", info.Version, "commit", info.Commit, "identity", o.cfg.Identity)
	if err := runPublisher(ctx, o, logger); err != nil {
		logger.Error(err, "Publisher failed")
		return exitFailure
	}
	return exitOK
}

// publisherCollectors registers what the publisher serves on /metrics,
// with the functions it calls (the Go and process collectors aside).
func publisherCollectors(reg prometheus.Registerer) (*publish.Metrics, error) {
	m := publish.NewMetrics()
	reg.MustRegister(controller.NewBuildInfo(version.Get()))
	return m, m.Register(reg)
}

func runPublisher(ctx context.Context, o *publishOptions, logger klog.Logger) error {
	rc, err := restConfig(o.kubeconfig)
	if err != nil {
		return fmt.Errorf("API client: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := publisherCollectors(reg)
	if err != nil {
		return err
	}
	p, err := publish.New(o.cfg, rc, m, logger)
	if err != nil {
		return err
	}
	if o.metricsAddress != "" {
		ln, err := net.Listen("tcp", o.metricsAddress)
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		mux := metricsMux(reg, false)
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "Serving metrics")
			}
		}()
		defer srv.Close()
	}
	return p.Run(ctx)
}
