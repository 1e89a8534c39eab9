package redteam

// Unknown addresses that are never held (issue 43, item 4): on a bridge CNI
// the pods of a node share a subnet routed through the bridge, so a pod
// that adds an unused address of that subnet passes source validation.
// That address is no known pod: no policy selects it, so the pod's own
// deny-all egress policy does not apply to it. Where the agent knows the
// pod ranges it holds the connection until the pod is programmed, which
// never happens; where it does not (no Node spec.podCIDRs, no --pod-cidrs)
// the connection was not even queued, and with --fail-open a held one was
// admitted at the wait's bound. The defences: without ranges an unknown
// source on a pod interface is dropped in the kernel
// (pkg/compile render_unknown.go), and --fail-open never admits an unknown
// source (pkg/evaluate unknown.go).

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// unknownSrcScenario: the attacker's namespace denies all egress; the
// victim has no policy (admits anything). %s is node-1's podCIDRs entry.
const unknownSrcScenario = `
namespaces:
  - {name: victim}
  - {name: attacker}
nodes:
  - {name: node-1, ips: [192.168.7.1, "fd00:192:168:7::1"]%s}
  - {name: node-2, ips: [192.168.7.2, "fd00:192:168:7::2"]}
pods:
  - {namespace: victim, name: v1, labels: {app: v}, ips: [10.244.1.10], node: node-1}
  - {namespace: attacker, name: a, labels: {app: a}, ips: [10.244.1.66], node: node-1}
policies:
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: deny-egress, namespace: attacker}
    spec:
      podSelector: {}
      policyTypes: [Egress]
probes:
  - {from: {pod: attacker/a}, to: {pod: victim/v1}, port: 9000, protocol: UDP}
`

// takenAddr is the unused address of the "bridge subnet" the attacker
// takes.
const takenAddr = "10.244.1.77"

// takeAddress makes the lab's ptp pod interface of the attacker behave as a
// bridge port for the attack: the node routes a subnet (10.244.1.64/26)
// through it, as a bridge CNI routes the node's whole pod subnet through
// the bridge, and the attacker adds an unused address of it.
func takeAddress(t *testing.T, l *spoofLab) {
	t.Helper()
	info, err := l.lab.Info(l.pod(t, "attacker/a"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := l.lab.NodeExec("node-1", "ip", "route", "add", "10.244.1.64/26", "dev", info.HostIface); err != nil {
		t.Fatalf("route: %v\n%s", err, out)
	}
	if out, err := l.lab.Exec(l.pod(t, "attacker/a"), "ip", "addr", "add", takenAddr+"/32", "dev", "eth0"); err != nil {
		t.Fatalf("address: %v\n%s", err, out)
	}
}

// sendFrom sends one UDP datagram from inside the attacker, from src (an
// address of its own, so a plain socket), to the victim's listener.
func sendFrom(t *testing.T, l *spoofLab, src netip.Addr, dst netip.AddrPort, payload string) {
	t.Helper()
	err := l.lab.InNetns(l.pod(t, "attacker/a"), func() error {
		c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
	if err != nil {
		t.Fatalf("send from %s: %v", src, err)
	}
}

// TestRedTeamUnknownLocalSource: the attacker, whose namespace denies all
// egress, sends from an address it took to a victim that admits anything:
// without pod ranges (fail-closed and --fail-open) and with them under
// --fail-open, in hybrid and queue mode. Nothing arrives, neither from the
// taken address nor (the policy's own doing) from the pod's address.
func TestRedTeamUnknownLocalSource(t *testing.T) {
	spoofRequireRoot(t)
	const wait = 300 * time.Millisecond
	for _, c := range []struct {
		name     string
		podCIDRs string
		failOpen bool
		mode     compile.Mode
	}{
		{name: "no ranges", mode: compile.ModeHybrid},
		{name: "no ranges, fail-open", failOpen: true, mode: compile.ModeHybrid},
		{name: "no ranges, queue mode, fail-open", failOpen: true, mode: compile.ModeQueue},
		{name: "ranges, fail-open", podCIDRs: ", podCIDRs: [10.244.1.0/24]", failOpen: true, mode: compile.ModeHybrid},
		{name: "ranges, queue mode, fail-open", podCIDRs: ", podCIDRs: [10.244.1.0/24]", failOpen: true, mode: compile.ModeQueue},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newScenarioLab(t, fmt.Sprintf(unknownSrcScenario, c.podCIDRs), lab.Config{Mode: c.mode, FailOpen: c.failOpen, UnknownPodWait: wait})
			takeAddress(t, l)
			v1 := spoofListen(t, l.lab, l.pod(t, "victim/v1"), "udp4", spoofVictimPort)
			dst := netip.AddrPortFrom(l.addr(t, "victim/v1", true), spoofVictimPort)
			for i := range 3 {
				sendFrom(t, l, netip.MustParseAddr(takenAddr), dst, fmt.Sprintf("TAKEN-%d", i))
				sendFrom(t, l, l.addr(t, "attacker/a", true), dst, fmt.Sprintf("OWN-%d", i))
			}
			time.Sleep(wait + time.Second)
			if got := v1.seen("TAKEN-"); len(got) > 0 {
				t.Errorf("from the taken address %s, the victim got %q", takenAddr, got)
			}
			if got := v1.seen("OWN-"); len(got) > 0 {
				t.Errorf("from the pod's own address (its egress denies all), the victim got %q", got)
			}
			if t.Failed() {
				t.Logf("node-1:\n%s", l.c.ListTable("node-1"))
			}
		})
	}
	t.Run("legitimate traffic without ranges", func(t *testing.T) {
		// An outside host's traffic to the victim comes in through the
		// lab's external interface (an uplink): it still flows, and every
		// probe gets the evaluator's verdict.
		l := newScenarioLab(t, fmt.Sprintf(unknownSrcScenario, "")+
			"  - {from: {ip: 192.0.2.10}, to: {pod: victim/v1}, port: 9000, protocol: UDP}\n", lab.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rep, err := l.c.Probe(ctx, l.s, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tab := rep.Table(); tab != "" {
			t.Errorf("%s", tab)
		}
		connected := 0
		for _, o := range rep.Outcomes {
			if o.Err != nil {
				t.Errorf("probe %d: %v", o.Index, o.Err)
			}
			if o.Connected {
				connected++
			}
		}
		if connected != 1 {
			t.Errorf("%d probes connected, want 1 (the outside host's)", connected)
		}
	})
}
