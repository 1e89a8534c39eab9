package main

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/controller"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/pkg/fqdn/wire"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
)

// fqdnOptions are the flags of DNS learning (domainNames peers).
type fqdnOptions struct {
	queueNum       uint16
	servers        []string
	service        string
	minTTL, maxTTL time.Duration
	maxNames       int
	maxAddrs       int
	queryTimeout   time.Duration
	// removed is the agent's: set once it removed its table at exit.
	removed *atomic.Bool
}

// dnsQueueNum resolves --dns-queue-num for the connection queues base..
// base+n-1 (n after --queues 0 is resolved). Queue numbers: the connection
// queues and their alternate range, base..base+2n-1 (startQueue); then the
// DNS queue and its alternate, d and d+1 (chooseDNSQueue), by default
// d = base+2n. The two pairs must not overlap.
func (o *fqdnOptions) dnsQueueNum(base, n uint16) (uint16, error) {
	d := uint32(o.queueNum)
	if d == 0 {
		d = uint32(base) + 2*uint32(n)
	}
	end := uint32(base) + 2*uint32(n) // after the connection queues' alternate range
	switch {
	case d+1 > 0xffff:
		return 0, fmt.Errorf("--dns-queue-num %d: the DNS queue and its alternate (%d) exceed 65535", d, d+1)
	case d+1 >= uint32(base) && d < end:
		return 0, fmt.Errorf("--dns-queue-num %d: the DNS queue and its alternate (%d) overlap the connection queues and their alternate range %d-%d",
			d, d+1, base, end-1)
	}
	return uint16(d), nil
}

// chooseDNSQueue picks d or its alternate d+1 as chooseQueueRange does for
// the connection queues: the one no other agent listens on.
func chooseDNSQueue(log klog.Logger, d uint16) (uint16, error) {
	return chooseQueueRange(log.WithName("fqdn"), d, 1, compile.ChainDNS)
}

// sources parses --dns-servers.
func (o *fqdnOptions) sources() (*fqdn.Sources, error) {
	var ps []netip.Prefix
	for _, s := range o.servers {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			ps = append(ps, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("--dns-servers %q: neither an address nor a CIDR", s)
		}
		ps = append(ps, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return fqdn.NewSources(ps), nil
}

// startFQDN starts DNS learning: the trusted sources (and the DNS
// service's EndpointSlice informer), the learner, which the evaluator asks
// about domainNames peers and whose hooks join hooks, and the runtime
// on the DNS queue. It returns
// once the queue is bound. stop, called when the agent exits, hands the
// DNS queue over to a successor listening on the other of the DNS queue's
// two numbers (as the connection queues are, see startQueue) and closes it.
func (o *fqdnOptions) startFQDN(ctx context.Context, render compile.RenderConfig, base uint16, eval *evaluate.Evaluator, elements *nftnl.Conn,
	client kubernetes.Interface, reg prometheus.Registerer, errs chan<- error, hooks *controller.Hooks) (stop func(), err error) {
	log := klog.FromContext(ctx).WithName("fqdn")
	stop = func() {}
	src, err := o.sources()
	if err != nil {
		return stop, err
	}
	if o.service != "" {
		if err := watchDNSEndpoints(ctx, client, o.service, src, log); err != nil {
			return stop, err
		}
	}
	m := fqdn.NewMetrics()
	if err := m.Register(reg); err != nil {
		return stop, err
	}
	cfg := fqdn.Config{Program: eval.Program, Trusted: src.Contains, MinTTL: o.minTTL, MaxTTL: o.maxTTL,
		FailOpen: render.FailOpen, Metrics: m, Logger: log, MaxNamesPerPod: o.maxNames, MaxAddrsPerPod: o.maxAddrs,
		QueryTimeout: o.queryTimeout}
	if render.Mode != compile.ModeQueue {
		// Hybrid: the kernel decides from the rules' learned sets.
		cfg.Writer = wire.Writer{W: elements}
	}
	l, err := fqdn.New(cfg)
	if err != nil {
		return stop, err
	}
	eval.Resolved = l
	// After each publication: pods that left lose their learned elements,
	// rules with new sets get what their pods resolved.
	hooks.OnProgram(l.OnProgram)
	// And at once when a pod's removal reaches the kernel incrementally,
	// before a new pod can be given its address.
	hooks.OnPodApplied(l.OnPodApplied)
	rt, err := queue.NewRuntime(wire.RuntimeConfig(render, 0, log), wire.Decider{L: l})
	if err != nil {
		return stop, err
	}
	stop = runUntilHandedOver(ctx, rt, "DNS queue runtime", errs, o.removed, func() {
		succ := render
		succ.DNSQueueNum = base // the DNS queue's two numbers: base and base+1
		if render.DNSQueueNum == base {
			succ.DNSQueueNum = base + 1
		}
		handOver(log, rt, render.QueueVariant, compile.ChainDNS, render.DNSQueueNum, queuerule.CompatRuleConfig(succ, compile.ChainDNS))
	})
	select {
	case <-rt.Ready():
		log.Info("Learning DNS replies for domainNames peers", "queue", render.DNSQueueNum, "dnsService", o.service, "dnsServers", o.servers,
			"minTTL", o.minTTL, "maxTTL", o.maxTTL, "queryTimeout", o.queryTimeout)
		return stop, nil
	case <-ctx.Done():
		return stop, ctx.Err()
	}
}

// watchDNSEndpoints keeps src's endpoints equal to the addresses of the
// DNS service's EndpointSlices.
func watchDNSEndpoints(ctx context.Context, client kubernetes.Interface, service string, src *fqdn.Sources, log klog.Logger) error {
	ns, name, ok := strings.Cut(service, "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("--dns-service %q: want namespace/name", service)
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = discoveryv1.LabelServiceName + "=" + name }))
	inf := f.Discovery().V1().EndpointSlices()
	lister := inf.Lister()
	update := func() {
		slices, err := lister.List(labels.Everything())
		if err != nil {
			return
		}
		var addrs []netip.Addr
		for _, s := range slices {
			for _, ep := range s.Endpoints {
				for _, a := range ep.Addresses {
					if x, err := netip.ParseAddr(a); err == nil {
						addrs = append(addrs, x)
					}
				}
			}
		}
		src.SetEndpoints(addrs)
		log.V(2).Info("Trusted DNS endpoints", "service", service, "addresses", addrs)
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { update() },
		UpdateFunc: func(any, any) { update() },
		DeleteFunc: func(any) { update() },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	return nil
}
