// Package e2enetpol is a slim build of Kubernetes' e2e.test: the same
// framework and the same NetworkPolicy specs (k8s.io/kubernetes/test/e2e/
// network/netpol, which includes "Netpol API"), without the thousands of
// other specs and their dependencies.
//
// hack/conformance/tools.sh copies this file into the wrapper module that
// hack/tools.sh keeps in $NFTPOLICY_TOOLS/src/kubernetes and runs
// `go test -c` there. The leading underscore of _gosrc keeps it out of the
// nftpolicy module's ./... patterns (it imports k8s.io/kubernetes).
package e2enetpol

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/logs"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	e2enode "k8s.io/kubernetes/test/e2e/framework/node"
	e2epod "k8s.io/kubernetes/test/e2e/framework/pod"
	netutils "k8s.io/utils/net"

	// define and freeze constants
	_ "k8s.io/kubernetes/test/e2e/feature"

	// the specs
	_ "k8s.io/kubernetes/test/e2e/network/netpol"

	// reconfigure the framework as the full e2e.test does
	_ "k8s.io/component-base/logs/testinit"
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"
)

func TestMain(m *testing.M) {
	versionFlag := flag.CommandLine.Bool("version", false, "Displays version information.")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *versionFlag {
		fmt.Printf("%s\n", version.Get())
		os.Exit(0)
	}
	if flag.CommandLine.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown additional command line arguments: %s", flag.CommandLine.Args())
		os.Exit(1)
	}
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// The suite setup of the full e2e.test, reduced to what these specs need:
// schedulable nodes, running system pods (the nftpolicy agent) and the
// cluster's IP family.
var _ = ginkgo.SynchronizedBeforeSuite(func(ctx context.Context) []byte {
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "Error loading client")
	timeouts := framework.NewTimeoutContext()
	framework.ExpectNoError(e2enode.WaitForAllNodesSchedulable(ctx, c, timeouts.NodeSchedulable))
	if err := e2epod.WaitForAlmostAllPodsReady(ctx, c, metav1.NamespaceSystem, framework.TestContext.MinStartupPods,
		framework.TestContext.AllowedNotReadyNodes, timeouts.SystemPodsStartup); err != nil {
		framework.Failf("Error waiting for all pods to be running and ready: %v", err)
	}
	framework.Logf("e2e test version: %s", version.Get().GitVersion)
	if v, err := c.DiscoveryClient.ServerVersion(); err == nil {
		framework.Logf("kube-apiserver version: %s", v.GitVersion)
	}
	return nil
}, func(ctx context.Context, _ []byte) {
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "Error loading client")
	framework.TestContext.IPFamily = "ipv4"
	var svc interface{ GetName() string }
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(time.Second) {
		s, err := c.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			continue
		}
		svc = s
		if netutils.IsIPv6String(s.Spec.ClusterIP) {
			framework.TestContext.IPFamily = "ipv6"
		}
		break
	}
	if svc == nil {
		framework.Logf("WARNING: no default/kubernetes service, assuming ipv4")
	}
	framework.Logf("Cluster IP family: %s", framework.TestContext.IPFamily)
})

func TestE2E(t *testing.T) {
	logs.InitLogs()
	defer logs.FlushLogs()
	klog.EnableContextualLogging(true)
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	klog.Infof("Starting e2e run %q on Ginkgo node %d", framework.RunID, suiteConfig.ParallelProcess)
	ginkgo.RunSpecs(t, "Kubernetes e2e suite (NetworkPolicy)", suiteConfig, reporterConfig)
}
