package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftpolicy/nftpolicy/pkg/status"
)

// ClusterFlags are the flags every live-cluster command shares: kubectl's
// connection flags (--kubeconfig, --context, --cluster, --user, -n, --as,
// --as-group, --request-timeout, --server, --token, ...), where the agents
// run, and the command's time limit.
//
// The connection flags are client-go's clientcmd override flags, the ones
// k8s.io/cli-runtime's ConfigFlags binds for kubectl: with the same names
// and meaning, they leave out cli-runtime's dependencies (kustomize,
// OpenAPI), which would double the plugin's size.
type ClusterFlags struct {
	Kubeconfig string
	Overrides  clientcmd.ConfigOverrides
	Agents     status.Agents
	Timeout    time.Duration
}

// Add registers the flags on fs; timeoutHelp describes --timeout.
func (f *ClusterFlags) Add(fs *pflag.FlagSet, timeoutHelp string) {
	f.AddConnection(fs)
	fs.StringVar(&f.Agents.Namespace, "agent-namespace", status.DefaultAgents.Namespace, "namespace of the agents' DaemonSet")
	fs.StringVar(&f.Agents.Selector, "agent-selector", status.DefaultAgents.Selector, "label selector of the agents' pods")
	fs.DurationVar(&f.Timeout, "timeout", 30*time.Second, timeoutHelp)
}

// AddConnection registers the connection flags only, for a command that
// does not look for the agents.
func (f *ClusterFlags) AddConnection(fs *pflag.FlagSet) {
	fs.StringVar(&f.Kubeconfig, clientcmd.RecommendedConfigPathFlag, "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	clientcmd.BindOverrideFlags(&f.Overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
}

// loader is the kubeconfig as kubectl loads it: --kubeconfig, else
// $KUBECONFIG, else ~/.kube/config, else the in-cluster configuration;
// then the flags' overrides.
func (f *ClusterFlags) loader() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.Kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &f.Overrides)
}

// ExplicitNamespace is -n's value, "" when not given.
func (f *ClusterFlags) ExplicitNamespace() string { return f.Overrides.Context.Namespace }

// Namespace is -n, else the kubeconfig context's namespace, else default.
func (f *ClusterFlags) Namespace() string {
	if ns := f.ExplicitNamespace(); ns != "" {
		return ns
	}
	if ns, _, err := f.loader().Namespace(); err == nil && ns != "" {
		return ns
	}
	return "default"
}

// RESTConfig loads the client configuration. Its errors are bad input
// (exit 2).
func (f *ClusterFlags) RESTConfig() (*rest.Config, error) {
	if err := checkKubeconfigEnv(f.Kubeconfig); err != nil {
		return nil, err
	}
	cfg, err := f.loader().ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, errors.New("no kubeconfig: pass --kubeconfig or set $KUBECONFIG, or put one at ~/.kube/config")
	}
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "kubectl-nftpolicy"
	return cfg, nil
}

// checkKubeconfigEnv names the files of $KUBECONFIG when none of them
// exists: client-go skips missing files and would then report no
// configuration at all, as if the variable were not set.
func checkKubeconfigEnv(explicit string) error {
	env := os.Getenv(clientcmd.RecommendedConfigPathEnvVar)
	if explicit != "" || env == "" {
		return nil
	}
	paths := filepath.SplitList(env)
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
	}
	if len(paths) == 1 {
		return fmt.Errorf("$KUBECONFIG names %s, which does not exist", paths[0])
	}
	return fmt.Errorf("$KUBECONFIG names %q, none of which exists", paths)
}

// Clients connects to the API server: one dynamic client (pkg/status
// reads everything through it, which keeps the typed clientsets, and
// every API group's types with them, out of the plugin).
func (f *ClusterFlags) Clients() (status.Clients, error) {
	cfg, err := f.RESTConfig()
	if err != nil {
		return status.Clients{}, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	return status.Clients{Dynamic: dyn}, err
}
