package controller

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// EventSink wraps the sink of the agent's event broadcaster so that every
// Event the API server did not take is logged at -v=2 with the object and
// reason it was about. client-go's broadcaster logs most of these failures
// itself, but some (an Event that already exists, a namespace being
// deleted) only at -v=5, and none name the policy in nftpolicy's keys.
type EventSink struct {
	Sink   record.EventSink
	Logger klog.Logger
}

var _ record.EventSink = EventSink{}

// Create implements record.EventSink.
func (s EventSink) Create(e *corev1.Event) (*corev1.Event, error) {
	out, err := s.Sink.Create(e)
	s.logFailure("create", e, err)
	return out, err
}

// Update implements record.EventSink.
func (s EventSink) Update(e *corev1.Event) (*corev1.Event, error) {
	out, err := s.Sink.Update(e)
	s.logFailure("update", e, err)
	return out, err
}

// Patch implements record.EventSink.
func (s EventSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	out, err := s.Sink.Patch(e, data)
	s.logFailure("patch", e, err)
	return out, err
}

func (s EventSink) logFailure(op string, e *corev1.Event, err error) {
	if err == nil {
		return
	}
	s.Logger.V(2).Info("Could not write an Event", "operation", op,
		"object", klog.KRef(e.InvolvedObject.Namespace, e.InvolvedObject.Name), "kind", e.InvolvedObject.Kind,
		"reason", e.Reason, "err", err)
}
