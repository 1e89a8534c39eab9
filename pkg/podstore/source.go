package podstore

import (
	"context"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
)

// RESTSource reads pods through a client made by slim.NewPodClient; a
// watch's pods are read into their stored form by a slim.EventReader.
func RESTSource(c rest.Interface) Source {
	timeout := func(opts metav1.ListOptions) time.Duration {
		if opts.TimeoutSeconds != nil {
			return time.Duration(*opts.TimeoutSeconds) * time.Second
		}
		return 0
	}
	return Source{
		InitialEvents: true,
		Watch: func(ctx context.Context, opts metav1.ListOptions) (Events, error) {
			opts.Watch = true
			body, err := c.Get().Resource("pods").VersionedParams(&opts, scheme.ParameterCodec).Timeout(timeout(opts)).Stream(ctx)
			if err != nil {
				return nil, err
			}
			return slim.NewEventReader(body), nil
		},
		List: func(ctx context.Context, opts metav1.ListOptions) ([]*compile.PodInfo, string, error) {
			obj, err := c.Get().Resource("pods").VersionedParams(&opts, scheme.ParameterCodec).Do(ctx).Get()
			if err != nil {
				return nil, "", err
			}
			list, ok := obj.(*corev1.PodList)
			if !ok {
				return nil, "", fmt.Errorf("listing pods returned %T", obj)
			}
			return stored(list), list.ResourceVersion, nil
		},
	}
}

// ClientsetSource reads pods through a typed clientset, decoded whole and
// then stored. It lists, then watches: client-go's fake clientset does
// not stream initial events.
func ClientsetSource(cs kubernetes.Interface) Source {
	return Source{
		Watch: func(ctx context.Context, opts metav1.ListOptions) (Events, error) {
			w, err := cs.CoreV1().Pods("").Watch(ctx, opts)
			if err != nil {
				return nil, err
			}
			return watchEvents{w}, nil
		},
		List: func(ctx context.Context, opts metav1.ListOptions) ([]*compile.PodInfo, string, error) {
			list, err := cs.CoreV1().Pods("").List(ctx, opts)
			if err != nil {
				return nil, "", err
			}
			return stored(list), list.ResourceVersion, nil
		},
	}
}

func stored(list *corev1.PodList) []*compile.PodInfo {
	out := make([]*compile.PodInfo, len(list.Items))
	for i := range list.Items {
		out[i] = slim.Pod(&list.Items[i])
	}
	return out
}

// watchEvents reads a client-go watch of pods.
type watchEvents struct{ w watch.Interface }

func (e watchEvents) Next() (watch.EventType, *compile.PodInfo, error) {
	ev, ok := <-e.w.ResultChan()
	if !ok {
		return "", nil, io.EOF
	}
	switch o := ev.Object.(type) {
	case *corev1.Pod:
		if ev.Type != watch.Error {
			return ev.Type, slim.Pod(o), nil
		}
	case *compile.PodInfo: // tests
		if ev.Type != watch.Error {
			return ev.Type, o, nil
		}
	case *metav1.Status:
		if ev.Type == watch.Error {
			return ev.Type, nil, apierrors.FromObject(o)
		}
	}
	return "", nil, fmt.Errorf("pod watch: a %s event carrying %T", ev.Type, ev.Object)
}

func (e watchEvents) Close() error {
	e.w.Stop()
	return nil
}

// OnNode narrows src to the pods of one node: a field selector on
// spec.nodeName, which the API server's watch cache indexes.
func OnNode(src Source, node string) Source {
	sel := "spec.nodeName=" + node
	narrow := func(opts metav1.ListOptions) metav1.ListOptions {
		if opts.FieldSelector != "" {
			opts.FieldSelector += "," + sel
		} else {
			opts.FieldSelector = sel
		}
		return opts
	}
	return Source{
		InitialEvents: src.InitialEvents,
		Watch: func(ctx context.Context, opts metav1.ListOptions) (Events, error) {
			return src.Watch(ctx, narrow(opts))
		},
		List: func(ctx context.Context, opts metav1.ListOptions) ([]*compile.PodInfo, string, error) {
			return src.List(ctx, narrow(opts))
		},
	}
}
