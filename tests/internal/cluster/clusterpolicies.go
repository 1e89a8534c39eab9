package cluster

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// ClusterPolicyCRD is the name of the ClusterNetworkPolicy CRD.
const ClusterPolicyCRD = "clusternetworkpolicies.policy.networking.k8s.io"

// PolicyClient is an admin client of the ClusterNetworkPolicy API.
func (c *Cluster) PolicyClient() (npaclient.Interface, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.policyClient == nil {
		cs, err := npaclient.NewForConfig(c.Env.RESTConfig())
		if err != nil {
			return nil, fmt.Errorf("ClusterNetworkPolicy client: %w", err)
		}
		c.policyClient = cs
	}
	return c.policyClient, nil
}

// CRDPath returns the CRD manifest hack/crd.sh names for channel
// ("standard" or "experimental"): the one of the network-policy-api
// version in go.mod.
func CRDPath(ctx context.Context, channel string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack", "crd.sh"), channel).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return "", fmt.Errorf("hack/crd.sh %s: %w: %s", channel, err, ee.Stderr)
		}
		return "", fmt.Errorf("hack/crd.sh %s: %w", channel, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// InstallClusterPolicyCRD applies the ClusterNetworkPolicy CRD of channel
// and returns once ClusterNetworkPolicies can be listed.
func (c *Cluster) InstallClusterPolicyCRD(ctx context.Context, channel string) error {
	path, err := CRDPath(ctx, channel)
	if err != nil {
		return err
	}
	if out, err := c.Env.Kubectl(c.t, "apply", "--server-side", "-f", path); err != nil {
		return fmt.Errorf("applying the %s ClusterNetworkPolicy CRD: %w\n%s", channel, err, out)
	}
	if out, err := c.Env.Kubectl(c.t, "wait", "--for=condition=Established", "--timeout=60s", "crd/"+ClusterPolicyCRD); err != nil {
		return fmt.Errorf("waiting for the ClusterNetworkPolicy CRD: %w\n%s", err, out)
	}
	return c.waitClusterPolicyAPI(ctx, true)
}

// DeleteClusterPolicyCRD deletes the ClusterNetworkPolicy CRD (and with it
// every ClusterNetworkPolicy) and returns once the API is gone.
func (c *Cluster) DeleteClusterPolicyCRD(ctx context.Context) error {
	if out, err := c.Env.Kubectl(c.t, "delete", "--wait=true", "--timeout=60s", "crd/"+ClusterPolicyCRD); err != nil {
		return fmt.Errorf("deleting the ClusterNetworkPolicy CRD: %w\n%s", err, out)
	}
	return c.waitClusterPolicyAPI(ctx, false)
}

// waitClusterPolicyAPI polls until listing ClusterNetworkPolicies works
// (served) or answers NotFound (not served).
func (c *Cluster) waitClusterPolicyAPI(ctx context.Context, served bool) error {
	cs, err := c.PolicyClient()
	if err != nil {
		return err
	}
	ctx, cancel := waitCtx(ctx, time.Minute)
	defer cancel()
	for {
		_, err := cs.PolicyV1beta1().ClusterNetworkPolicies().List(ctx, metav1.ListOptions{Limit: 1})
		if (served && err == nil) || (!served && apierrors.IsNotFound(err)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the ClusterNetworkPolicy API to be served=%v: %w (last list error: %v)", served, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ApplyClusterPolicy creates the ClusterNetworkPolicy or replaces the spec
// and annotations of the existing one, and returns it as stored.
func (c *Cluster) ApplyClusterPolicy(ctx context.Context, cnp *npav1beta1.ClusterNetworkPolicy) (*npav1beta1.ClusterNetworkPolicy, error) {
	cs, err := c.PolicyClient()
	if err != nil {
		return nil, err
	}
	api := cs.PolicyV1beta1().ClusterNetworkPolicies()
	in := cnp.DeepCopy()
	in.ResourceVersion, in.UID, in.CreationTimestamp, in.ManagedFields = "", "", metav1.Time{}, nil
	out, err := api.Create(ctx, in, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return nil, fmt.Errorf("creating ClusterNetworkPolicy %s: %w", cnp.Name, err)
		}
		return out, nil
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, cnp.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec = *cnp.Spec.DeepCopy()
		cur.Annotations = cnp.Annotations
		out, err = api.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("updating ClusterNetworkPolicy %s: %w", cnp.Name, err)
	}
	return out, nil
}

// DeleteClusterPolicy deletes a ClusterNetworkPolicy.
func (c *Cluster) DeleteClusterPolicy(ctx context.Context, name string) error {
	cs, err := c.PolicyClient()
	if err != nil {
		return err
	}
	if err := cs.PolicyV1beta1().ClusterNetworkPolicies().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("deleting ClusterNetworkPolicy %s: %w", name, err)
	}
	return nil
}

// LabelNode sets labels on a Node and removes the keys in remove.
func (c *Cluster) LabelNode(ctx context.Context, name string, set map[string]string, remove ...string) error {
	_, err := c.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, labelPatch(set, remove), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("labelling node %s: %w", name, err)
	}
	return nil
}

// listClusterInputs adds the Nodes and, while their API is served, the
// ClusterNetworkPolicies to in.
func (c *Cluster) listClusterInputs(ctx context.Context, in *compile.Input) error {
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	for i := range nodes.Items {
		in.Nodes = append(in.Nodes, &nodes.Items[i])
	}
	cs, err := c.PolicyClient()
	if err != nil {
		return err
	}
	cnps, err := cs.PolicyV1beta1().ClusterNetworkPolicies().List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil // no CRD: the agents enforce NetworkPolicy v1 only
	}
	if err != nil {
		return fmt.Errorf("listing cluster network policies: %w", err)
	}
	for i := range cnps.Items {
		in.ClusterPolicies = append(in.ClusterPolicies, &cnps.Items[i])
	}
	return nil
}
