package status

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// TestReporterWritesAgentVersion: the NodeEnforcement a Reporter creates
// carries the agent's version (which nodes a rollout has reached).
func TestReporterWritesAgentVersion(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{GVR: Kind + "List"})
	r, err := NewReporter(ReporterConfig{Node: "node-1", Client: client, AgentVersion: "v9.8.7"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go r.Run(ctx)
	r.Programmed(Publication{Watermarks: Watermarks{NetworkPolicies: "5"}, At: time.Now()})
	for {
		u, err := client.Resource(GVR).Get(ctx, "node-1", metav1.GetOptions{})
		if err == nil {
			st, _, _ := unstructured.NestedString(u.Object, "status", "agentVersion")
			if st != "v9.8.7" {
				t.Fatalf("status.agentVersion %q, want v9.8.7", st)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no NodeEnforcement written: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
