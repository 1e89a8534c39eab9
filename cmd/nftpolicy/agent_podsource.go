package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/config"
	"github.com/nftpolicy/nftpolicy/pkg/podstore"
)

// podSourceSwitchedReason is the reason of the Event on the Node when the
// agent changes its source of other nodes' pods.
const podSourceSwitchedReason = "PodSourceSwitched"

// slicedPodStore returns the controller's PodStore for podSource slices
// (nil for pods: the controller's own store of every Pod): PodAddressSlices
// for other nodes' pods, the node's own Pods, and every Pod while the
// publisher's Lease is stale. Its metrics are registered on reg; each
// switch of source is an Event on the Node.
func slicedPodStore(c *config.AgentConfiguration, node string, client kubernetes.Interface, podClient rest.Interface,
	rec record.EventRecorder, reg prometheus.Registerer, log klog.Logger) (func(onChange func(string)) (podstore.Reader, error), error) {
	if c.PodSource != "slices" {
		return nil, nil
	}
	pods := podstore.ClientsetSource(client)
	if podClient != nil {
		pods = podstore.RESTSource(podClient)
	}
	metrics := podstore.NewSliceMetrics()
	if err := metrics.Register(reg); err != nil {
		return nil, fmt.Errorf("registering the pod slice metrics: %w", err)
	}
	ref := &corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}
	cfg := podstore.SlicedConfig{
		Node: node, Local: podstore.OnNode(pods, node), Pods: pods,
		Slices:     podstore.RESTSliceSource(client.CoreV1().RESTClient()),
		Lease:      podstore.InformLease(client, c.PodSlices.LeaseNamespace, c.PodSlices.LeaseName),
		StaleAfter: c.PodSlices.StaleAfter.Duration,
		Limits:     podstore.SliceLimits{Slices: c.PodSlices.MaxSlices, Pods: c.PodSlices.MaxPods},
		Metrics:    metrics,
		OnSwitch: func(source, reason string) {
			if rec != nil {
				rec.Eventf(ref, corev1.EventTypeNormal, podSourceSwitchedReason, "Other nodes' pods are read from %s: %s", source, reason)
			}
		},
	}
	return func(onChange func(string)) (podstore.Reader, error) {
		return podstore.NewSliced(cfg, onChange, log.WithName("pods"))
	}, nil
}
