package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/nftpolicy/nftpolicy/pkg/status"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// ServeExec lets `kubectl exec` (pods/exec through the API server) reach
// the agents' pods, as `kubectl nftpolicy preview` uses it. It starts a
// kubelet's exec endpoint (HTTPS with a throw-away certificate: the API
// server does not verify kubelets' certificates without
// --kubelet-certificate-authority) on 127.0.0.1 of the caller's namespace,
// and points every Node at it: its Hostname address becomes localhost
// (the API server's first preferred address type) and its kubelet port the
// endpoint's. An exec into kube-system/nftpolicy-<node> runs the command
// in that node's namespace, as the agent's container would: /nftpolicy is
// the agent binary, and `nftpolicy preview` finds the preview socket
// where the node's agent made it (--socket appended, as the container's
// emptyDir would put it at the default path). Stopped by t.Cleanup.
func (c *Cluster) ServeExec(ctx context.Context) error {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(c.serveExec))
	srv.Config.ReadHeaderTimeout = 10 * time.Second
	srv.StartTLS()
	c.t.Cleanup(srv.Close)
	_, portText, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return err
	}
	for _, n := range c.nodes {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("cluster: Node %s: %w", n, err)
		}
		for i := range node.Status.Addresses {
			if node.Status.Addresses[i].Type == corev1.NodeHostName {
				node.Status.Addresses[i].Address = "localhost"
			}
		}
		node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
		if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("cluster: pointing Node %s at the exec endpoint: %w", n, err)
		}
	}
	return nil
}

// serveExec answers the API server's /exec/{namespace}/{pod}/{container}.
func (c *Cluster) serveExec(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	if len(parts) != 4 || parts[0] != "exec" {
		http.NotFound(w, r)
		return
	}
	opts, err := remotecommand.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	remotecommand.ServeExec(w, r, agentExecutor{c: c, namespace: parts[1]}, parts[2], "", parts[3], r.URL.Query()["command"], opts,
		time.Minute, remotecommand.DefaultStreamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

// agentExecutor runs commands "in" the agents' containers.
type agentExecutor struct {
	c         *Cluster
	namespace string
}

func (e agentExecutor) ExecInContainer(ctx context.Context, pod, _, container string, cmd []string, in io.Reader, out, errOut io.WriteCloser,
	_ bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	node, ok := strings.CutPrefix(pod, "nftpolicy-")
	a := e.c.agents[node]
	if e.namespace != status.DefaultAgents.Namespace || !ok || a == nil || container != "nftpolicy" {
		return fmt.Errorf("cluster: no container %s in pod %s/%s", container, e.namespace, pod)
	}
	if len(cmd) == 0 || cmd[0] != "/nftpolicy" {
		return fmt.Errorf("cluster: the agent's container has only /nftpolicy, not %q", cmd)
	}
	args := cmd[1:]
	if len(args) > 0 && args[0] == "preview" {
		args = append(args, "--socket", a.PreviewSocket)
	}
	run, err := e.c.Lab.Command(ctx, netlab.Node(node), append([]string{e.c.bin}, args...)...)
	if err != nil {
		return err
	}
	run.Stdin, run.Stdout, run.Stderr = in, out, errOut
	err = run.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return utilexec.CodeExitError{Err: err, Code: exit.ExitCode()}
	}
	return err
}
