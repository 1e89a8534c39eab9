package podslice

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Entry is the slice entry of a pod, with its own ports; the publisher
// moves ports shared by every pod of a slice to the slice (SharePorts).
// Only a pod that is eligible and has an address has an entry.
func Entry(p *compile.PodInfo) (PodEntry, bool) {
	if !p.Eligible || len(p.IPs) == 0 {
		return PodEntry{}, false
	}
	e := PodEntry{Name: p.Name, Node: p.Node, Created: p.CreationTimestamp, Deleting: p.DeletionTimestamp != nil}
	e.IPs = make([]string, len(p.IPs))
	for i, ip := range p.IPs {
		e.IPs[i] = ip.String()
	}
	e.Ports = portsOf(p.Ports)
	return e, true
}

func portsOf(ports []compile.ContainerPort) []ContainerPort {
	if len(ports) == 0 {
		return nil
	}
	out := make([]ContainerPort, len(ports))
	for i, p := range ports {
		out[i] = ContainerPort{Name: p.Name, Protocol: p.Protocol.String(), Port: int32(p.Port)}
	}
	return out
}

// SharePorts moves the ports of s's pods to the slice when every pod has
// the same ones.
func SharePorts(s *PodAddressSlice) {
	if len(s.Pods) == 0 {
		return
	}
	first := s.Pods[0].Ports
	for _, e := range s.Pods[1:] {
		if !slices.Equal(e.Ports, first) {
			return
		}
	}
	s.Ports = first
	for i := range s.Pods {
		s.Pods[i].Ports = nil
	}
}

// PodInfos reads the pods of a slice into the agent's stored form. An
// entry that does not validate is left out and named in the error: its
// pod stays unknown to the agent (held, as a pod not yet seen is), never
// taken with a wrong address or labels. Labels and the slice's ports are
// shared by the pods returned, read-only as in pkg/slim.
func PodInfos(s *PodAddressSlice) ([]*compile.PodInfo, error) {
	var errs []error
	if len(s.Pods) > MaxPods {
		return nil, fmt.Errorf("slice %s/%s: %d pods, more than %d", s.Namespace, s.Name, len(s.Pods), MaxPods)
	}
	shared, err := readPorts(s.Ports)
	if err != nil {
		return nil, fmt.Errorf("slice %s/%s: ports: %w", s.Namespace, s.Name, err)
	}
	out := make([]*compile.PodInfo, 0, len(s.Pods))
	seen := make(map[string]struct{}, len(s.Pods))
	for i := range s.Pods {
		pi, err := podInfo(s, &s.Pods[i], shared)
		if err == nil {
			if _, dup := seen[pi.Name]; dup {
				err = fmt.Errorf("pod %q is listed twice", pi.Name)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("slice %s/%s: pods[%d]: %w", s.Namespace, s.Name, i, err))
			continue
		}
		seen[pi.Name] = struct{}{}
		out = append(out, pi)
	}
	return out, errors.Join(errs...)
}

func podInfo(s *PodAddressSlice, e *PodEntry, shared []compile.ContainerPort) (*compile.PodInfo, error) {
	if e.Name == "" {
		return nil, errors.New("no name")
	}
	ips, err := readIPs(e.IPs)
	if err != nil {
		return nil, err
	}
	ports := shared
	if e.Ports != nil {
		if ports, err = readPorts(e.Ports); err != nil {
			return nil, fmt.Errorf("ports: %w", err)
		}
	}
	pi := &compile.PodInfo{
		Labels: s.PodLabels, CreationTimestamp: e.Created, Node: e.Node,
		Eligible: true, IPs: ips, Ports: ports,
	}
	if e.Deleting {
		// The slice carries that the pod is being deleted, not when: any
		// time marks it, and ownership of an address compares presence.
		t := e.Created
		pi.DeletionTimestamp = &t
	}
	pi.SetKey(s.Namespace, e.Name)
	return pi, nil
}

// readIPs parses a pod's addresses: one or two, at most one of each
// family, IPv4 first, as compile.NewPodInfo orders a Pod's.
func readIPs(in []string) ([]netip.Addr, error) {
	if len(in) == 0 || len(in) > 2 {
		return nil, fmt.Errorf("%d addresses, want 1 or 2", len(in))
	}
	out := make([]netip.Addr, 0, len(in))
	for _, s := range in {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("address %q is not an IP address", s)
		}
		a = a.Unmap()
		if a.IsUnspecified() || a.IsMulticast() {
			return nil, fmt.Errorf("address %q cannot be a pod's", s)
		}
		out = append(out, a)
	}
	if len(out) == 2 {
		if out[0].Is4() == out[1].Is4() {
			return nil, fmt.Errorf("addresses %q are of one family", in)
		}
		if out[1].Is4() {
			out[0], out[1] = out[1], out[0]
		}
	}
	return out, nil
}

func readPorts(in []ContainerPort) ([]compile.ContainerPort, error) {
	if len(in) == 0 {
		return nil, nil
	}
	if len(in) > MaxPorts {
		return nil, fmt.Errorf("%d ports, more than %d", len(in), MaxPorts)
	}
	out := make([]compile.ContainerPort, len(in))
	for i, p := range in {
		proto, ok := compile.ParseProtocol(p.Protocol)
		if !ok {
			return nil, fmt.Errorf("port %d: protocol %q", i, p.Protocol)
		}
		if p.Port < 1 || p.Port > 65535 {
			return nil, fmt.Errorf("port %d: %d is out of range", i, p.Port)
		}
		out[i] = compile.ContainerPort{Name: p.Name, Protocol: proto, Port: uint16(p.Port)}
	}
	return out, nil
}
