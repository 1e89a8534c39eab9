package bench

import (
	"context"
	"fmt"
	"time"
)

// fanoutPoint is the cost of one change at one number of clients.
type fanoutPoint struct {
	clients             int
	cpuMS, wire, alloc  float64 // per change
	payload, rssMB, cpu float64
}

// measureChanges connects simulated clients up to each of cfg.Agents and
// times cfg.Changes changes at each: the API server's CPU (less what it
// spends idle with the same clients over the same time), the bytes its
// sockets sent and what it allocated, per change.
func (fx *fanoutCluster) measureChanges(ctx context.Context, res *Result, prefix string, watches func(string) []watchRequest,
	change func(context.Context, int) error) error {
	var clients []*simClient
	defer func() {
		for _, c := range clients {
			c.stop()
		}
	}()
	scrape, err := fx.scrapeAlloc(ctx)
	if err != nil {
		return err
	}
	var points []fanoutPoint
	k := 0
	for _, n := range fx.cfg.Agents {
		t0 := time.Now()
		// In batches: a thousand clients' handshakes at once on the lab's
		// two cores time out, which is not what is measured here.
		for len(clients) < n {
			from := len(clients)
			for len(clients) < min(n, from+fanoutConnectBatch) {
				clients = append(clients, startSimClient(ctx, fx.sim, watches(fanoutNodeName(len(clients)%fx.cfg.Nodes))))
			}
			if err := waitSynced(ctx, clients[from:], 10*time.Minute); err != nil {
				return err
			}
		}
		retries := int64(0)
		for _, c := range clients {
			retries += c.retries.Load()
		}
		fx.cfg.Logf("fanout: %s: %d clients synced in %v (%d watches opened again)", prefix, n, time.Since(t0).Round(time.Millisecond), retries)
		res.Set(fmt.Sprintf("%s_watch_retries_%d_agents", prefix, n), retries)
		p, err := fx.timeChanges(ctx, clients, change, &k, scrape)
		if err != nil {
			return err
		}
		p.clients = n
		points = append(points, p)
		fx.cfg.Logf("fanout: %s: %d clients: %.3f ms CPU, %.0f bytes sent (%.0f of watch frames), %.0f bytes allocated per change; RSS %.0f MB",
			prefix, n, p.cpuMS, p.wire, p.payload, p.alloc, p.rssMB)
		res.Set(fmt.Sprintf("%s_apiserver_cpu_ms_per_pod_change_%d_agents", prefix, n), p.cpuMS)
		res.Set(fmt.Sprintf("%s_apiserver_bytes_per_pod_change_%d_agents", prefix, n), p.wire)
		res.Set(fmt.Sprintf("%s_apiserver_alloc_bytes_per_pod_change_%d_agents", prefix, n), p.alloc)
		res.Set(fmt.Sprintf("%s_apiserver_rss_mb_%d_agents", prefix, n), p.rssMB)
	}
	setFanoutModel(res, prefix, points)
	return nil
}

// fanoutConnectBatch is how many simulated clients connect at once.
const fanoutConnectBatch = 50

// timeChanges makes cfg.Changes changes, each after every client received
// the one before (the first watch of each client is the changed kind).
func (fx *fanoutCluster) timeChanges(ctx context.Context, clients []*simClient, change func(context.Context, int) error,
	k *int, scrape float64) (fanoutPoint, error) {
	idleRate, err := fx.idleRate()
	if err != nil {
		return fanoutPoint{}, err
	}

	base := make([]int64, len(clients))
	var wire0, payload0 int64
	for i, c := range clients {
		base[i] = c.watches[0].modified.Load()
		wire0 += c.wire.Load()
		payload0 += c.watches[0].payload.Load()
	}
	s0, err := fx.sample(ctx, true)
	if err != nil {
		return fanoutPoint{}, err
	}
	t0 := time.Now()
	for j := 1; j <= fx.cfg.Changes; j++ {
		if err := change(ctx, *k); err != nil {
			return fanoutPoint{}, fmt.Errorf("change %d: %w", *k, err)
		}
		*k++
		if err := waitDelivered(ctx, clients, base, int64(j), time.Minute); err != nil {
			return fanoutPoint{}, err
		}
	}
	s1, err := fx.sample(ctx, false)
	if err != nil {
		return fanoutPoint{}, err
	}
	wall := time.Since(t0)
	var wire1, payload1 int64
	for _, c := range clients {
		wire1 += c.wire.Load()
		payload1 += c.watches[0].payload.Load()
	}
	n := float64(fx.cfg.Changes)
	cpu := s1.cpu - s0.cpu - idleRate*wall.Seconds()
	return fanoutPoint{
		cpuMS:   max(cpu, 0) * 1000 / n,
		cpu:     cpu,
		wire:    float64(wire1-wire0) / n,
		payload: float64(payload1-payload0) / n,
		alloc:   (s1.alloc - s0.alloc - scrape) / n,
		rssMB:   fx.rssMB(),
	}, nil
}

// idleRate is the API server's CPU seconds per second over cfg.Idle with
// no change: its own work (bookmarks, compaction, leases) and the
// connected clients' keep-alives.
func (fx *fanoutCluster) idleRate() (float64, error) {
	c0, err := procCPUNS(fx.pid)
	if err != nil {
		return 0, err
	}
	time.Sleep(fx.cfg.Idle)
	c1, err := procCPUNS(fx.pid)
	return (c1 - c0) / fx.cfg.Idle.Seconds(), err
}

// scrapeAlloc is what one scrape of the API server's metrics allocates
// (subtracted from the allocations between two samples).
func (fx *fanoutCluster) scrapeAlloc(ctx context.Context) (float64, error) {
	a0, err := fx.metric(ctx, "go_memstats_alloc_bytes_total")
	if err != nil {
		return 0, err
	}
	a1, err := fx.metric(ctx, "go_memstats_alloc_bytes_total")
	return a1 - a0, err
}

// startCost is the API server's cost of one client start.
type startCost struct {
	pods                  int
	cpuS, sentMB, allocMB float64
}

// measureStarts starts cfg.StartAgents clients one after the other, each
// alone, and returns the API server's mean cost of one start with the
// pods stored now.
func (fx *fanoutCluster) measureStarts(ctx context.Context, prefix string, watches func(string) []watchRequest) (startCost, error) {
	scrape, err := fx.scrapeAlloc(ctx)
	if err != nil {
		return startCost{}, err
	}
	idle, err := fx.idleRate()
	if err != nil {
		return startCost{}, err
	}
	var cpu, wire, alloc float64
	for i := range fx.cfg.StartAgents {
		s0, err := fx.sample(ctx, true)
		if err != nil {
			return startCost{}, err
		}
		t0 := time.Now()
		c := startSimClient(ctx, fx.sim, watches(fanoutNodeName(i%fx.cfg.Nodes)))
		err = waitSynced(ctx, []*simClient{c}, 10*time.Minute)
		s1, serr := fx.sample(ctx, false)
		wire += float64(c.wire.Load())
		c.stop()
		if err != nil {
			return startCost{}, err
		}
		if serr != nil {
			return startCost{}, serr
		}
		cpu += max(s1.cpu-s0.cpu-idle*time.Since(t0).Seconds(), 0)
		alloc += s1.alloc - s0.alloc - scrape
	}
	n := float64(fx.cfg.StartAgents)
	sc := startCost{pods: len(fx.pods), cpuS: cpu / n, sentMB: wire / n / 1e6, allocMB: alloc / n / 1e6}
	fx.cfg.Logf("fanout: %s: one start at %d pods: %.3f s CPU, %.2f MB sent, %.1f MB allocated", prefix, sc.pods,
		sc.cpuS, sc.sentMB, sc.allocMB)
	return sc, nil
}

// setStartModel reports the starts measured and their line in the pods
// (kube-proxy's EndpointSlices and Services grow with the pods, in the
// same ratio), extrapolated to 150,000 pods: a model, not a measurement.
func setStartModel(res *Result, prefix string, costs []startCost) {
	xs := make([]float64, len(costs))
	cpu, sent, alloc := make([]float64, len(costs)), make([]float64, len(costs)), make([]float64, len(costs))
	for i, c := range costs {
		res.Set(fmt.Sprintf("%s_agent_start_apiserver_cpu_s_%d", prefix, c.pods), c.cpuS)
		res.Set(fmt.Sprintf("%s_agent_start_apiserver_mb_sent_%d", prefix, c.pods), c.sentMB)
		res.Set(fmt.Sprintf("%s_agent_start_apiserver_alloc_mb_%d", prefix, c.pods), c.allocMB)
		xs[i], cpu[i], sent[i], alloc[i] = float64(c.pods), c.cpuS, c.sentMB, c.allocMB
	}
	for _, m := range []struct {
		name string
		ys   []float64
	}{{"cpu_s", cpu}, {"mb_sent", sent}, {"alloc_mb", alloc}} {
		if a, b, ok := fitLine(xs, m.ys); ok {
			res.Set(fmt.Sprintf("%s_agent_start_apiserver_%s_150k", prefix, m.name), a+b*fanoutTargetPods)
		}
	}
}

// setFanoutModel fits cost = a + b*clients (least squares) to the CPU and
// bytes per change and reports the model and its value at 5,000 clients.
func setFanoutModel(res *Result, prefix string, points []fanoutPoint) {
	xs := make([]float64, len(points))
	cpu, wire := make([]float64, len(points)), make([]float64, len(points))
	for i, p := range points {
		xs[i], cpu[i], wire[i] = float64(p.clients), p.cpuMS, p.wire
	}
	for _, m := range []struct {
		name string
		ys   []float64
	}{{"apiserver_cpu_ms_per_pod_change", cpu}, {"apiserver_bytes_per_pod_change", wire}} {
		a, b, ok := fitLine(xs, m.ys)
		if !ok {
			continue
		}
		res.Set(fmt.Sprintf("%s_%s_fixed", prefix, m.name), a)
		res.Set(fmt.Sprintf("%s_%s_per_agent", prefix, m.name), b)
		res.Set(fmt.Sprintf("%s_%s_%d_agents_model", prefix, m.name, fanoutTargetNodes), a+b*fanoutTargetNodes)
	}
}

// fitLine returns the least-squares line y = a + b*x; false with fewer
// than two distinct x.
func fitLine(xs, ys []float64) (a, b float64, ok bool) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	d := n*sxx - sx*sx
	if len(xs) < 2 || d == 0 {
		return 0, 0, false
	}
	b = (n*sxy - sx*sy) / d
	return (sy - b*sx) / n, b, true
}

// waitSynced waits until every watch of every client has received its
// initial events.
func waitSynced(ctx context.Context, clients []*simClient, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for _, c := range clients {
		for _, w := range c.watches {
			for synced := false; !synced; {
				select {
				case <-w.synced:
					synced = true
				case <-w.ended:
					if err := c.err(); err != nil {
						return err
					}
					return fmt.Errorf("a simulated client's watch ended before its initial events")
				case <-deadline.C:
					return fmt.Errorf("simulated clients not synced after %v", timeout)
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
	}
	return nil
}

// waitDelivered waits until every client's first watch has received n
// MODIFIED events more than base.
func waitDelivered(ctx context.Context, clients []*simClient, base []int64, n int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for i := 0; i < len(clients); {
		if clients[i].watches[0].modified.Load() >= base[i]+n {
			i++
			continue
		}
		if err := clients[i].err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("change %d not delivered to client %d after %v", n, i, timeout)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}
