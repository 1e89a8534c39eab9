package slim

import (
	"bytes"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Pods from the wire. The API server sends a pod as protobuf; the generated
// code decodes all of it (managed fields, annotations, containers' images,
// env, probes, volumes, statuses...) into a corev1.Pod that Pod then reads
// a few fields of and drops. At a hundred thousand pods that decoding and
// its garbage were most of the agent's start. decodePod reads only the
// fields Pod reads, into a reused scratch Pod, and hands it to Pod: the
// stored form is made by the same code either way, and a test holds the
// two paths equal on the API server's own encoding.

// scratch is a reusable Pod holding only the fields Pod reads.
type scratch struct {
	pod corev1.Pod
	// initialEventsEnd is the one annotation kept: a watch's bookmark
	// marking the end of its initial events carries it.
	initialEventsEnd string
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func (s *scratch) reset() {
	p := &s.pod
	clear(p.Labels)
	labels := p.Labels
	containers, inits, ips := p.Spec.Containers[:0], p.Spec.InitContainers[:0], p.Status.PodIPs[:0]
	*p = corev1.Pod{}
	p.Labels = labels
	p.Spec.Containers, p.Spec.InitContainers, p.Status.PodIPs = containers, inits, ips
	s.initialEventsEnd = ""
}

// decodePod reads a Pod message (without the runtime.Unknown envelope)
// into its stored form.
func decodePod(b []byte) (*compile.PodInfo, error) {
	s := scratchPool.Get().(*scratch)
	defer scratchPool.Put(s)
	s.reset()
	if err := s.readPod(b); err != nil {
		return nil, err
	}
	return podEvent(&s.pod, s.initialEventsEnd), nil
}

func (s *scratch) readPod(b []byte) error {
	p := pb{b: b}
	for !p.done() {
		f, w, err := p.key("Pod")
		if err != nil {
			return err
		}
		var m []byte
		switch f {
		case 1, 2, 3:
			if m, err = p.msg("Pod", f, w); err != nil {
				return err
			}
		default:
			if err := p.skip(w); err != nil {
				return err
			}
			continue
		}
		switch f {
		case 1:
			err = s.readMeta(m)
		case 2:
			err = s.readSpec(m)
		case 3:
			err = s.readStatus(m)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *scratch) readMeta(b []byte) error {
	const msg = "ObjectMeta"
	om := &s.pod.ObjectMeta
	p := pb{b: b}
	for !p.done() {
		f, w, err := p.key(msg)
		if err != nil {
			return err
		}
		switch f {
		case 1:
			om.Name, err = p.str(msg, f, w)
		case 3:
			om.Namespace, err = p.str(msg, f, w)
		case 6:
			om.ResourceVersion, err = p.str(msg, f, w)
		case 8:
			var m []byte
			if m, err = p.msg(msg, f, w); err == nil {
				om.CreationTimestamp.Time, err = readTime(m)
			}
		case 9:
			var m []byte
			if m, err = p.msg(msg, f, w); err == nil {
				if om.DeletionTimestamp == nil {
					om.DeletionTimestamp = &metav1.Time{}
				}
				om.DeletionTimestamp.Time, err = readTime(m)
			}
		case 11, 12:
			var m []byte
			if m, err = p.msg(msg, f, w); err != nil {
				return err
			}
			var k, v []byte
			if k, v, err = readStringEntry(m); err != nil {
				return err
			}
			if f == 11 {
				if om.Labels == nil {
					om.Labels = map[string]string{}
				}
				om.Labels[string(k)] = string(v)
			} else if string(k) == metav1.InitialEventsAnnotationKey {
				s.initialEventsEnd = string(v)
			}
		default:
			err = p.skip(w)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readTime reads a metav1.Time as its Unmarshal does: whole seconds, in
// the local zone; empty is the zero time.
func readTime(b []byte) (time.Time, error) {
	if len(b) == 0 {
		return time.Time{}, nil
	}
	var sec int64
	p := pb{b: b}
	for !p.done() {
		f, w, err := p.key("Timestamp")
		if err != nil {
			return time.Time{}, err
		}
		switch f {
		case 1, 2:
			var v uint64
			if v, err = p.num("Timestamp", f, w); f == 1 {
				sec = int64(v)
			}
		default:
			err = p.skip(w)
		}
		if err != nil {
			return time.Time{}, err
		}
	}
	return time.Unix(sec, 0).Local(), nil
}

// readStringEntry reads a map<string,string> entry as the generated code
// does: fields 1 and 2 are taken as strings whatever their wire type says,
// anything else is skipped.
func readStringEntry(b []byte) (k, v []byte, err error) {
	p := pb{b: b}
	for !p.done() {
		key, err := p.varint()
		if err != nil {
			return nil, nil, err
		}
		switch int32(key >> 3) {
		case 1:
			k, err = p.bytes()
		case 2:
			v, err = p.bytes()
		default:
			err = p.skip(int(key & 7))
		}
		if err != nil {
			return nil, nil, err
		}
	}
	return k, v, nil
}

func (s *scratch) readSpec(b []byte) error {
	const msg = "PodSpec"
	spec := &s.pod.Spec
	p := pb{b: b}
	for !p.done() {
		f, w, err := p.key(msg)
		if err != nil {
			return err
		}
		switch f {
		case 2, 20:
			var m []byte
			if m, err = p.msg(msg, f, w); err != nil {
				return err
			}
			list := &spec.Containers
			if f == 20 {
				list = &spec.InitContainers
			}
			err = readContainer(m, grow(list))
		case 10:
			spec.NodeName, err = p.str(msg, f, w)
		case 11:
			var v uint64
			v, err = p.num(msg, f, w)
			spec.HostNetwork = v != 0
		default:
			err = p.skip(w)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// grow appends a zero element to a reused slice and returns it, keeping
// the capacity of its slices.
func grow(list *[]corev1.Container) *corev1.Container {
	n := len(*list)
	if n < cap(*list) {
		*list = (*list)[:n+1]
		c := &(*list)[n]
		ports := c.Ports[:0]
		*c = corev1.Container{Ports: ports}
		return c
	}
	*list = append(*list, corev1.Container{})
	return &(*list)[n]
}

func readContainer(b []byte, c *corev1.Container) error {
	const msg = "Container"
	p := pb{b: b}
	for !p.done() {
		f, w, err := p.key(msg)
		if err != nil {
			return err
		}
		switch f {
		case 6:
			var m []byte
			if m, err = p.msg(msg, f, w); err != nil {
				return err
			}
			c.Ports = append(c.Ports, corev1.ContainerPort{})
			err = readPort(m, &c.Ports[len(c.Ports)-1])
		case 24:
			var v string
			if v, err = p.str(msg, f, w); err == nil {
				rp := corev1.ContainerRestartPolicy(v)
				c.RestartPolicy = &rp
			}
		default:
			err = p.skip(w)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func readPort(b []byte, cp *corev1.ContainerPort) error {
	const msg = "ContainerPort"
	p := pb{b: b}
	for !p.done() {
		f, w, err := p.key(msg)
		if err != nil {
			return err
		}
		switch f {
		case 1:
			cp.Name, err = p.str(msg, f, w)
		case 3:
			var v uint64
			v, err = p.num(msg, f, w)
			cp.ContainerPort = int32(v)
		case 4:
			var v string
			v, err = p.str(msg, f, w)
			cp.Protocol = corev1.Protocol(v)
		default:
			err = p.skip(w)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *scratch) readStatus(b []byte) error {
	const msg = "PodStatus"
	st := &s.pod.Status
	p := pb{b: b}
	for !p.done() {
		f, w, err := p.key(msg)
		if err != nil {
			return err
		}
		switch f {
		case 1:
			var v string
			v, err = p.str(msg, f, w)
			st.Phase = corev1.PodPhase(v)
		case 6:
			st.PodIP, err = p.str(msg, f, w)
		case 12:
			var m []byte
			if m, err = p.msg(msg, f, w); err != nil {
				return err
			}
			var ip string
			if ip, err = readPodIP(m); err == nil {
				st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip})
			}
		default:
			err = p.skip(w)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func readPodIP(b []byte) (string, error) {
	var ip string
	p := pb{b: b}
	for !p.done() {
		f, w, err := p.key("PodIP")
		if err != nil {
			return "", err
		}
		if f == 1 {
			ip, err = p.str("PodIP", f, w)
		} else {
			err = p.skip(w)
		}
		if err != nil {
			return "", err
		}
	}
	return ip, nil
}

// protobufMagic starts every protobuf-encoded Kubernetes object: the
// object is a runtime.Unknown envelope after it.
var protobufMagic = []byte{'k', '8', 's', 0}

// unwrap reads the runtime.Unknown envelope of an encoded object: its
// apiVersion, kind and raw bytes.
func unwrap(b []byte) (apiVersion, kind string, raw []byte, err error) {
	rest, ok := bytes.CutPrefix(b, protobufMagic)
	if !ok {
		return "", "", nil, fmt.Errorf("not a protobuf-encoded object (no %q prefix)", protobufMagic)
	}
	p := pb{b: rest}
	for !p.done() {
		f, w, err := p.key("Unknown")
		if err != nil {
			return "", "", nil, err
		}
		switch f {
		case 1:
			var m []byte
			if m, err = p.msg("Unknown", f, w); err == nil {
				apiVersion, kind, err = readTypeMeta(m)
			}
		case 2:
			raw, err = p.msg("Unknown", f, w)
		default:
			err = p.skip(w)
		}
		if err != nil {
			return "", "", nil, err
		}
	}
	return apiVersion, kind, raw, nil
}

func readTypeMeta(b []byte) (apiVersion, kind string, err error) {
	p := pb{b: b}
	for !p.done() {
		f, w, err := p.key("TypeMeta")
		if err != nil {
			return "", "", err
		}
		switch f {
		case 1:
			apiVersion, err = p.str("TypeMeta", f, w)
		case 2:
			kind, err = p.str("TypeMeta", f, w)
		default:
			err = p.skip(w)
		}
		if err != nil {
			return "", "", err
		}
	}
	return apiVersion, kind, nil
}
