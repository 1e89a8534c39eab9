// Package podslice defines PodAddressSlice (nftpolicy.io/v1alpha1): what
// an agent needs to know of the pods of other nodes, published compactly
// by one leader-elected publisher so that no agent has to watch every Pod
// of the cluster (docs/scale-out.md). A slice holds up to MaxPods pods of
// one namespace that share one label set: the labels once, then each
// pod's name, addresses, node, creation time and container ports.
//
// The package is the type, its validation and its conversion to and from
// the agent's stored form of a pod (compile.PodInfo): the publisher and
// the agent's pod source both use it, so the two agree by construction.
package podslice

import (
	_ "embed"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The API names of the resource.
const (
	Group    = "nftpolicy.io"
	Version  = "v1alpha1"
	Resource = "podaddressslices"
	Kind     = "PodAddressSlice"
)

// GVR is the resource's group, version and resource.
var GVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

// The bounds a slice is held to, by the CRD's schema and by Validate.
const (
	// MaxPods is the most pods one slice holds: a write of a slice is
	// then about the size of an EndpointSlice's.
	MaxPods = 100
	// MaxPorts is the most container ports one port list holds.
	MaxPorts = 64
)

// ManagedByLabel, set to Publisher, marks the slices the publisher owns.
const (
	ManagedByLabel = "nftpolicy.io/managed-by"
	Publisher      = "nftpolicy-publisher"
)

// CRD is the CustomResourceDefinition of PodAddressSlice, as install.yaml
// and the chart carry it.
//
//go:embed crd.yaml
var CRD string

// PodAddressSlice is a group of pods of one namespace that share one
// label set, as a ReplicaSet's pods do.
type PodAddressSlice struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// PodLabels are the labels of every pod of the slice.
	PodLabels map[string]string `json:"podLabels,omitempty"`
	// Ports are the container ports of every pod of the slice whose entry
	// has none of its own (as a pod template's pods share them), in the
	// order named ports resolve in.
	Ports []ContainerPort `json:"ports,omitempty"`
	// Pods are the slice's pods, each once.
	Pods []PodEntry `json:"pods"`
}

// PodEntry is one pod of a slice. Only pods that policies can select or
// name as peers are published: not host-network, not terminal, with at
// least one address.
type PodEntry struct {
	Name string `json:"name"`
	// IPs are the pod's addresses, IPv4 first, one of each family at most.
	IPs  []string `json:"ips"`
	Node string   `json:"node,omitempty"`
	// Created is the pod's creation time and Deleting says it has a
	// deletion time: with them an agent decides, as with Pods, which pod
	// owns an address two pods claim.
	Created  metav1.Time `json:"created"`
	Deleting bool        `json:"deleting,omitempty"`
	// Ports, when set, are this pod's container ports instead of the
	// slice's.
	Ports []ContainerPort `json:"ports,omitempty"`
}

// ContainerPort is a container port, as named ports resolve in it.
type ContainerPort struct {
	Name     string `json:"name,omitempty"`
	Protocol string `json:"protocol"`
	Port     int32  `json:"port"`
}

// PodAddressSliceList is a list of slices.
type PodAddressSliceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodAddressSlice `json:"items"`
}
