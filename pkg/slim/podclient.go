package slim

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// NewPodClient returns a REST client of the core/v1 API that asks for
// protobuf, for the pod store's watch (podstore.RESTSource), which reads
// the watch's events with an EventReader.
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
	c.Dial = gatheringDial(c.Dial)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	c.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	return rest.RESTClientFor(c)
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
