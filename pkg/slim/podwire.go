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
	// strs holds the strings many pods repeat, read without garbage.
	strs strCache
}

var scratchPool = sync.Pool{New: func() any { return &scratch{strs: strCache{}} }}

// strCache maps the bytes of strings that many pods repeat (namespaces,
// node names, label keys and values, port names, protocols, phases) to
// their canonical copies (intern): reading one then makes no garbage.
// Every pod of the cluster is decoded when the agent starts, and small
// garbage strings between the few small strings each pod keeps leave the
// heap's spans of small objects mostly empty but resident. Bounded:
// emptied when full.
type strCache map[string]string

const maxCachedStrings = 4096

// get returns the canonical copy of the string b spells.
func (c strCache) get(b []byte) string {
	if v, ok := c[string(b)]; ok {
		return v
	}
	v := intern(string(b))
	if len(c) >= maxCachedStrings {
		clear(c)
	}
	c[v] = v
	return v
}

// shared reads the current field as a string many pods repeat.
func (p *pb) shared(c strCache) string {
	if err := want(p.msg, p.f, p.w, wireBytes); err != nil {
		p.fail(err)
		return ""
	}
	b, err := p.bytes()
	p.fail(err)
	return c.get(b)
}

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
	p := pb{b: b, msg: "Pod"}
	for p.next() {
		switch p.f {
		case 1:
			p.fail(s.readMeta(p.sub()))
		case 2:
			p.fail(s.readSpec(p.sub()))
		case 3:
			p.fail(s.readStatus(p.sub()))
		default:
			p.skipField()
		}
	}
	return p.err
}

func (s *scratch) readMeta(b []byte) error {
	om := &s.pod.ObjectMeta
	p := pb{b: b, msg: "ObjectMeta"}
	for p.next() {
		switch p.f {
		case 1:
			om.Name = p.str()
		case 3:
			om.Namespace = p.shared(s.strs)
		case 6:
			om.ResourceVersion = p.str()
		case 8:
			om.CreationTimestamp.Time = readTime(&p, p.sub())
		case 9:
			if om.DeletionTimestamp == nil {
				om.DeletionTimestamp = &metav1.Time{}
			}
			om.DeletionTimestamp.Time = readTime(&p, p.sub())
		case 11:
			k, v := readStringEntry(&p, p.sub())
			if om.Labels == nil {
				om.Labels = map[string]string{}
			}
			om.Labels[s.strs.get(k)] = s.strs.get(v)
		case 12:
			if k, v := readStringEntry(&p, p.sub()); string(k) == metav1.InitialEventsAnnotationKey {
				s.initialEventsEnd = string(v)
			}
		default:
			p.skipField()
		}
	}
	return p.err
}

// readTime reads a metav1.Time as its Unmarshal does: whole seconds, in
// the local zone; empty is the zero time. Errors go to outer.
func readTime(outer *pb, b []byte) time.Time {
	if len(b) == 0 || outer.err != nil {
		return time.Time{}
	}
	var sec int64
	p := pb{b: b, msg: "Timestamp"}
	for p.next() {
		switch p.f {
		case 1:
			sec = int64(p.num())
		case 2:
			p.num()
		default:
			p.skipField()
		}
	}
	outer.fail(p.err)
	return time.Unix(sec, 0).Local()
}

// readStringEntry reads a map<string,string> entry as the generated code
// does: fields 1 and 2 are taken as strings whatever their wire type says,
// anything else is skipped. Errors go to outer.
func readStringEntry(outer *pb, b []byte) (k, v []byte) {
	p := pb{b: b}
	for p.err == nil && p.i < len(p.b) {
		key, err := p.varint()
		if err != nil {
			p.fail(err)
			break
		}
		switch int32(key >> 3) {
		case 1:
			k, err = p.bytes()
		case 2:
			v, err = p.bytes()
		default:
			err = p.skip(int(key & 7))
		}
		p.fail(err)
	}
	outer.fail(p.err)
	return k, v
}

func (s *scratch) readSpec(b []byte) error {
	spec := &s.pod.Spec
	p := pb{b: b, msg: "PodSpec"}
	for p.next() {
		switch p.f {
		case 2:
			p.fail(readContainer(p.sub(), grow(&spec.Containers), s.strs))
		case 20:
			p.fail(readContainer(p.sub(), grow(&spec.InitContainers), s.strs))
		case 10:
			spec.NodeName = p.shared(s.strs)
		case 11:
			spec.HostNetwork = p.num() != 0
		default:
			p.skipField()
		}
	}
	return p.err
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

func readContainer(b []byte, c *corev1.Container, strs strCache) error {
	p := pb{b: b, msg: "Container"}
	for p.next() {
		switch p.f {
		case 6:
			c.Ports = append(c.Ports, corev1.ContainerPort{})
			p.fail(readPort(p.sub(), &c.Ports[len(c.Ports)-1], strs))
		case 24:
			rp := corev1.ContainerRestartPolicy(p.shared(strs))
			c.RestartPolicy = &rp
		default:
			p.skipField()
		}
	}
	return p.err
}

func readPort(b []byte, cp *corev1.ContainerPort, strs strCache) error {
	p := pb{b: b, msg: "ContainerPort"}
	for p.next() {
		switch p.f {
		case 1:
			cp.Name = p.shared(strs)
		case 3:
			cp.ContainerPort = int32(p.num())
		case 4:
			cp.Protocol = corev1.Protocol(p.shared(strs))
		default:
			p.skipField()
		}
	}
	return p.err
}

func (s *scratch) readStatus(b []byte) error {
	st := &s.pod.Status
	p := pb{b: b, msg: "PodStatus"}
	for p.next() {
		switch p.f {
		case 1:
			st.Phase = corev1.PodPhase(p.shared(s.strs))
		case 6:
			st.PodIP = p.str()
		case 12:
			ip, err := readOneString(p.sub(), "PodIP", 1)
			p.fail(err)
			st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip})
		default:
			p.skipField()
		}
	}
	return p.err
}

// readOneString reads one string field of a message, skipping the others.
func readOneString(b []byte, msg string, field int32) (string, error) {
	var out string
	p := pb{b: b, msg: msg}
	for p.next() {
		if p.f == field {
			out = p.str()
		} else {
			p.skipField()
		}
	}
	return out, p.err
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
	p := pb{b: rest, msg: "Unknown"}
	for p.next() {
		switch p.f {
		case 1:
			m := p.sub()
			apiVersion, err = readOneString(m, "TypeMeta", 1)
			p.fail(err)
			kind, err = readOneString(m, "TypeMeta", 2)
			p.fail(err)
		case 2:
			raw = p.sub()
		default:
			p.skipField()
		}
	}
	return apiVersion, kind, raw, p.err
}
