// Package publish is the PodAddressSlice publisher (docs/scale-out.md):
// one leader-elected process watches every Pod of the cluster once and
// publishes what the agents of other nodes need of them as compact
// PodAddressSlices, so that no agent has to watch every Pod.
//
// It owns the grouping of pods into slices (a namespace's pods by their
// exact label set, at most podslice.MaxPods a slice, a pod kept in its
// slice while it lives), the batching of changes into few writes, the
// writes themselves (with the resourceVersion read, so that a deposed
// leader's late write fails on a conflict) and the leader election on a
// Lease, whose renewals tell the agents that the publisher is alive.
//
// It reads pods through pkg/podstore and writes through the API server
// only: it must not import the agent's packages (controller, sets, queue),
// and it never publishes a pod under a label set that is not the pod's.
package publish
