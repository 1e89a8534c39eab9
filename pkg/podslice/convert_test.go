package podslice

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

func pod(name string, ips ...string) *compile.PodInfo {
	p := &compile.PodInfo{
		Labels: map[string]string{"app": "web"}, Eligible: true, Node: "node-a",
		CreationTimestamp: metav1.NewTime(time.Date(2026, 12, 8, 1, 0, 0, 0, time.UTC)),
		Ports:             []compile.ContainerPort{{Name: "http", Protocol: compile.ProtoTCP, Port: 8080}},
	}
	for _, s := range ips {
		p.IPs = append(p.IPs, netip.MustParseAddr(s))
	}
	p.SetKey("ns", name)
	return p
}

// A pod published and read back, through JSON as the API server keeps
// it, is the pod the agent would have read from the Pod.
func TestRoundTrip(t *testing.T) {
	in := []*compile.PodInfo{pod("a", "10.0.0.1", "fd00::1"), pod("b", "10.0.0.2")}
	in[1].DeletionTimestamp = &in[1].CreationTimestamp
	s := &PodAddressSlice{PodLabels: in[0].Labels}
	s.Namespace, s.Name = "ns", "web-1"
	for _, p := range in {
		e, ok := Entry(p)
		if !ok {
			t.Fatalf("no entry for %s", p.Key)
		}
		s.Pods = append(s.Pods, e)
	}
	SharePorts(s)
	if len(s.Ports) != 1 || s.Pods[0].Ports != nil {
		t.Fatalf("ports not shared: %+v", s)
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back PodAddressSlice
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	out, err := PodInfos(&back)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 {
		t.Fatalf("got %d pods", len(out))
	}
	for i, p := range out {
		w := in[i]
		if p.Key != w.Key || p.Node != w.Node || !p.CreationTimestamp.Equal(&w.CreationTimestamp) ||
			(p.DeletionTimestamp != nil) != (w.DeletionTimestamp != nil) || !p.Eligible ||
			len(p.IPs) != len(w.IPs) || p.Labels["app"] != "web" || len(p.Ports) != 1 || p.Ports[0] != w.Ports[0] {
			t.Errorf("pod %d: got %+v, want %+v", i, p, w)
		}
		for j := range p.IPs {
			if p.IPs[j] != w.IPs[j] {
				t.Errorf("pod %d: address %d: %s, want %s", i, j, p.IPs[j], w.IPs[j])
			}
		}
	}
}

// Pods the agent cannot select have no entry.
func TestEntryOnlyEligible(t *testing.T) {
	p := pod("a")
	if _, ok := Entry(p); ok {
		t.Error("a pod without an address has an entry")
	}
	p = pod("b", "10.0.0.1")
	p.Eligible = false
	if _, ok := Entry(p); ok {
		t.Error("an ineligible pod has an entry")
	}
}

// A bad entry is left out (its pod stays unknown), the others are read.
func TestBadEntriesLeftOut(t *testing.T) {
	good := PodEntry{Name: "ok", IPs: []string{"10.0.0.9"}}
	cases := map[string]PodEntry{
		"no name":      {IPs: []string{"10.0.0.1"}},
		"no address":   {Name: "x"},
		"three":        {Name: "x", IPs: []string{"10.0.0.1", "fd00::1", "10.0.0.2"}},
		"not an IP":    {Name: "x", IPs: []string{"10.0.0.0/8"}},
		"zone":         {Name: "x", IPs: []string{"fe80::1%eth0"}},
		"unspecified":  {Name: "x", IPs: []string{"0.0.0.0"}},
		"one family":   {Name: "x", IPs: []string{"10.0.0.1", "10.0.0.2"}},
		"bad protocol": {Name: "x", IPs: []string{"10.0.0.1"}, Ports: []ContainerPort{{Protocol: "ICMP", Port: 1}}},
		"port range":   {Name: "x", IPs: []string{"10.0.0.1"}, Ports: []ContainerPort{{Protocol: "TCP", Port: 70000}}},
		"listed twice": {Name: "ok", IPs: []string{"10.0.0.1"}},
	}
	for name, e := range cases {
		s := &PodAddressSlice{Pods: []PodEntry{good, e}}
		s.Namespace, s.Name = "ns", "s"
		out, err := PodInfos(s)
		if err == nil || !strings.Contains(err.Error(), "pods[1]") {
			t.Errorf("%s: error %v, want one naming pods[1]", name, err)
		}
		if len(out) != 1 || out[0].Name != "ok" {
			t.Errorf("%s: read %d pods, want the good one only", name, len(out))
		}
	}
	s := &PodAddressSlice{Pods: make([]PodEntry, MaxPods+1)}
	if out, err := PodInfos(s); err == nil || out != nil {
		t.Errorf("a slice of %d pods: %d pods read, error %v", MaxPods+1, len(out), err)
	}
}

// IPv6 first is reordered as a Pod's addresses are.
func TestIPv4First(t *testing.T) {
	s := &PodAddressSlice{Pods: []PodEntry{{Name: "a", IPs: []string{"fd00::1", "10.0.0.1"}}}}
	out, err := PodInfos(s)
	if err != nil || len(out) != 1 || !out[0].IPs[0].Is4() {
		t.Fatalf("got %+v, %v", out, err)
	}
}

// The CRD is YAML of the resource this package names, and bounds what the
// agent's reading bounds.
func TestCRD(t *testing.T) {
	var crd struct {
		Metadata struct{ Name string }
		Spec     struct {
			Group string
			Names struct{ Kind, Plural string }
		}
	}
	if err := yaml.Unmarshal([]byte(CRD), &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Metadata.Name != Resource+"."+Group || crd.Spec.Group != Group || crd.Spec.Names.Kind != Kind || crd.Spec.Names.Plural != Resource {
		t.Errorf("CRD names %+v", crd)
	}
	for _, want := range []string{"maxItems: 100", "maxItems: 64"} {
		if !strings.Contains(CRD, want) {
			t.Errorf("CRD has no %q", want)
		}
	}
}
