// Package controller connects the API to the dataplane: client-go informers
// for NetworkPolicies, Namespaces and Pods (slimmed by a transform to what
// policies read), event handlers that only mark the state dirty, and one
// sync loop that compiles, applies one transaction, and then publishes the
// program to the evaluator. Nothing is written to the kernel before every
// informer has synced. It also reports invalid policies (log, metric,
// Event) and exposes the agent's metrics.
package controller
