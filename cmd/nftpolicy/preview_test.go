package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftpolicy/nftpolicy/pkg/status"
)

func agentPod(name, node string, phase corev1.PodPhase, ready bool, labels map[string]string) *corev1.Pod {
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, Labels: labels},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: phase, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: cond}}}}
}

// TestPreviewCluster: the plugin asks one running agent pod per node (the
// ready one while a DaemonSet update runs two), feeds it the file, and
// prints the answers per node in node order; a node that fails is named
// with its error.
func TestPreviewCluster(t *testing.T) {
	agent := map[string]string{"app.kubernetes.io/name": "nftpolicy"}
	kube := fake.NewClientset(
		agentPod("nftpolicy-0-old", "node-1", corev1.PodRunning, false, agent),
		agentPod("nftpolicy-a", "node-1", corev1.PodRunning, true, agent),
		agentPod("nftpolicy-b", "node-2", corev1.PodRunning, true, agent),
		agentPod("nftpolicy-c", "node-3", corev1.PodPending, false, agent),
		agentPod("other", "node-3", corev1.PodRunning, true, map[string]string{"app": "other"}),
	)
	answer := PreviewResult{Node: "node-1", Revocation: true, Cut: 3, AffectedAddresses: 1, DumpedEntries: 7, DurationSeconds: 0.0097,
		Flows: []PreviewFlow{
			{Change: "cut", Protocol: "TCP", Source: "10.244.1.11:52676", Destination: "10.244.1.10:8080", Policy: "x/web", Reason: "x/web isolates x/web for ingress; no rule matched"},
			{Change: "allow", Protocol: "UDP", Source: "10.244.1.12:47701", Destination: "10.244.1.10:9090", Reason: "allowed by x/web ingress[0]"},
		}}
	var asked []string
	exec := func(_ context.Context, pod status.AgentPod, argv []string, stdin []byte) ([]byte, []byte, error) {
		asked = append(asked, pod.Name)
		if want := []string{"/nftpolicy", "preview", "--local", "-o", "json"}; !slices.Equal(argv[:5], want) || string(stdin) != "FILE" {
			t.Errorf("%s: ran %q with %q", pod.Name, argv, stdin)
		}
		if pod.Node == "node-2" {
			return nil, []byte("nftpolicy preview: the agent: another preview is running on this node; try again\n"), errors.New("command terminated with exit code 1")
		}
		out, err := json.Marshal([]PreviewResult{answer})
		return out, nil, err
	}
	args := []string{"/nftpolicy", "preview", "--local", "-o", "json", "-n", "x"}
	results, err := previewCluster(context.Background(), kube, status.DefaultAgents, "", args, []byte("FILE"), exec)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(asked)
	if !slices.Equal(asked, []string{"nftpolicy-a", "nftpolicy-b"}) {
		t.Errorf("asked %v, want the ready agent pod of node-1 and node-2's", asked)
	}
	var out bytes.Buffer
	if err := printPreview(&out, results, "text"); err != nil {
		t.Fatal(err)
	}
	want := `node node-1: 3 would cut, 0 would allow (pod addresses affected: 1, conntrack entries read: 7, 9.7ms)
  would cut    TCP 10.244.1.11:52676 -> 10.244.1.10:8080  x/web: x/web isolates x/web for ingress; no rule matched
  would allow  UDP 10.244.1.12:47701 -> 10.244.1.10:9090  allowed by x/web ingress[0]
  and 1 more
node node-2: ERROR: pod kube-system/nftpolicy-b: command terminated with exit code 1: nftpolicy preview: the agent: another preview is running on this node; try again
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}

	// -o yaml: the JSON's field names.
	out.Reset()
	if err := printPreview(&out, results, "yaml"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"  node: node-1\n", "  cut: 3\n", "  node: node-2\n", "  error: 'pod kube-system/nftpolicy-b: command terminated"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-o yaml lacks %q:\n%s", want, out.String())
		}
	}

	asked = nil
	if _, err := previewCluster(context.Background(), kube, status.DefaultAgents, "node-3", args, []byte("FILE"), exec); err == nil ||
		!strings.Contains(err.Error(), "no running agent pod on node node-3") || len(asked) != 0 {
		t.Errorf("node-3 (agent pod pending): %v, asked %v", err, asked)
	}
}

func TestPreviewBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"preview"}, "-f FILE is required"},
		{[]string{"preview", "-f", "testdata/cluster.yaml"}, `kind "": want NetworkPolicy or ClusterNetworkPolicy`},
		{[]string{"preview", "-f", "x", "-o", "wide"}, "--output"},
		{[]string{"preview", "-f", "x", "--max-flows", "0"}, "--max-flows 0"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != exitBadInput || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %d and %q", tc.args, code, errb.String(), exitBadInput, tc.want)
		}
	}
}
