package slim

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// NewPodClient returns a REST client of the core/v1 API that asks for
// protobuf and decodes every Pod object it receives (one per watch event,
// the way an informer's initial events and changes arrive) straight into
// a *compile.PodInfo. Everything else it receives (lists, Status errors)
// is decoded as usual. It is for PodListWatch only: a Get into a
// corev1.Pod also decodes as usual, but the objects of a watch are
// PodInfos.
//
// Over TLS it speaks HTTP/1.1, on a connection of its own: the pod watch's
// initial events are every pod of the cluster in one response, and an
// HTTP/2 client returns flow-control credit for every few kilobytes it
// reads (a TLS record written back per 4 KiB or so, a tenth of the
// start's CPU at 150k pods). HTTP/1.1 has no such credit; the TCP
// connection's own window does that job in the kernel.
func NewPodClient(cfg *rest.Config) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	c.TLSClientConfig.NextProtos = []string{"http/1.1"}
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	c.NegotiatedSerializer = podSerializers(scheme.Codecs.WithoutConversion())
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	return rest.RESTClientFor(c)
}

// podSerializers is ns with its protobuf decoder replaced by podDecoder,
// and its protobuf watch event decoder by eventDecoder.
func podSerializers(ns runtime.NegotiatedSerializer) runtime.NegotiatedSerializer {
	infos := append([]runtime.SerializerInfo(nil), ns.SupportedMediaTypes()...)
	for i := range infos {
		if infos[i].MediaType == runtime.ContentTypeJSON {
			infos[i].Serializer = jsonPodDecoder{infos[i].Serializer}
		}
		if infos[i].MediaType == runtime.ContentTypeProtobuf {
			infos[i].Serializer = podDecoder{infos[i].Serializer}
			if ss := infos[i].StreamSerializer; ss != nil {
				events := *ss
				events.Serializer = eventDecoder{ss.Serializer}
				infos[i].StreamSerializer = &events
			}
		}
	}
	return negotiated{ns, infos}
}

type negotiated struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func (n negotiated) SupportedMediaTypes() []runtime.SerializerInfo { return n.infos }

var podGVK = corev1.SchemeGroupVersion.WithKind("Pod")

// podDecoder decodes a protobuf Pod into its stored form when nothing was
// given to decode into; anything else goes to the usual serializer.
type podDecoder struct{ runtime.Serializer }

func (d podDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if into == nil {
		if apiVersion, kind, raw, err := unwrap(data); err == nil && apiVersion == "v1" && kind == "Pod" {
			pi, err := decodePod(raw)
			if err != nil {
				return nil, nil, err
			}
			gvk := podGVK
			return pi, &gvk, nil
		}
	}
	return d.Serializer.Decode(data, defaults, into)
}

// jsonPodDecoder is podDecoder's counterpart for an API server that
// answers in JSON: a Pod decoded on its own (a watch event's object) is
// stored at once; lists and decoding into a given object are left alone.
type jsonPodDecoder struct{ runtime.Serializer }

func (d jsonPodDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	obj, gvk, err := d.Serializer.Decode(data, defaults, into)
	if p, ok := obj.(*corev1.Pod); ok && err == nil && into == nil {
		return podEvent(p, p.Annotations[metav1.InitialEventsAnnotationKey]), gvk, nil
	}
	return obj, gvk, err
}

// PodListWatch lists and watches every pod through c (made by
// NewPodClient), as client-go's pod informer does, with watch events
// carrying *compile.PodInfo (the informer's example object), in protobuf
// or JSON: the client's decoders store each event's pod. Lists carry
// corev1.Pods, which go through the informer's Transform.
func PodListWatch(c rest.Interface) *cache.ListWatch {
	timeout := func(opts metav1.ListOptions) time.Duration {
		if opts.TimeoutSeconds != nil {
			return time.Duration(*opts.TimeoutSeconds) * time.Second
		}
		return 0
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return c.Get().Resource("pods").VersionedParams(&opts, scheme.ParameterCodec).Timeout(timeout(opts)).Do(ctx).Get()
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.Watch = true
			return c.Get().Resource("pods").VersionedParams(&opts, scheme.ParameterCodec).Timeout(timeout(opts)).Watch(ctx)
		},
	}
}

// podEvent is a watch event's pod in its stored form. A bookmark is a pod
// without a name whose metadata carries a resourceVersion and, at the end
// of a watch's initial events, the annotation the reflector looks for:
// that annotation is kept.
func podEvent(p *corev1.Pod, initialEventsEnd string) *compile.PodInfo {
	pi := Pod(p)
	if pi.Name == "" && initialEventsEnd != "" {
		pi.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: initialEventsEnd}
	}
	return pi
}
