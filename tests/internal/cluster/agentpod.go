package cluster

import (
	"context"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/status"
)

// The harness plays kubelet for the agents too: each node has the pod a
// DaemonSet would give it (kube-system/nftpolicy-<node>, host network,
// install.yaml's labels), whose Ready condition follows the agent process
// and its /readyz the way a readiness probe would, checked every
// agentProbePeriod. `nftpolicy status` and `wait` find the nodes the
// agents cover through these pods.
const agentProbePeriod = 200 * time.Millisecond

// AgentPodName is the name of a node's agent pod.
func AgentPodName(node string) string { return "nftpolicy-" + node }

// createAgentPod creates the node's agent pod, not ready.
func (c *Cluster) createAgentPod(ctx context.Context, node string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: status.DefaultAgents.Namespace, Name: AgentPodName(node),
			Labels: map[string]string{"app.kubernetes.io/name": "nftpolicy"}},
		Spec: corev1.PodSpec{NodeName: node, HostNetwork: true, ServiceAccountName: "nftpolicy",
			Containers: []corev1.Container{{Name: "nftpolicy", Image: "nftpolicy:harness"}}},
	}
	pod, err := c.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the agent pod of %s: %w", node, err)
	}
	return c.setAgentPodReady(ctx, pod, false)
}

func (c *Cluster) setAgentPodReady(ctx context.Context, pod *corev1.Pod, ready bool) error {
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: c.nodeIPs[pod.Spec.NodeName][0].String(), StartTime: &now,
		PodIP:      c.nodeIPs[pod.Spec.NodeName][0].String(),
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: cond, LastTransitionTime: now}}}
	_, err := c.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}

// probeAgentPods keeps each agent pod's Ready condition in line with its
// agent until ctx ends.
func (c *Cluster) probeAgentPods(ctx context.Context) {
	ready := map[string]bool{}
	t := time.NewTicker(agentProbePeriod)
	defer t.Stop()
	for {
		for _, n := range c.nodes {
			a := c.agents[n]
			now := a.Running()
			if now {
				code, err := a.Ready(ctx)
				now = err == nil && code == http.StatusOK
			}
			if now == ready[n] {
				continue
			}
			pod, err := c.Client.CoreV1().Pods(status.DefaultAgents.Namespace).Get(ctx, AgentPodName(n), metav1.GetOptions{})
			if err == nil {
				err = c.setAgentPodReady(ctx, pod, now)
			}
			if err == nil {
				ready[n] = now
			} else if ctx.Err() == nil {
				c.cfg.Logf("cluster: updating the agent pod of %s: %v", n, err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
