package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// chartHeader starts charts/nftpolicy/templates/install.yaml.
const chartHeader = `{{- /*
Made from install.yaml by hack/chart-sync.sh (release chart-sync): do not
edit. The DaemonSet's settings come from values.yaml; everything else is
install.yaml's text. tests/chart checks that the default values render
exactly install.yaml's objects.
*/ -}}
{{- include "nftpolicy.validate" . }}
`

// chartEdits are the replacements that turn install.yaml into the chart's
// template, in order; each must match exactly once, so a change of
// install.yaml that moves one of these lines stops the sync with the line
// to look at instead of rendering a chart that lost a value.
var chartEdits = [][2]string{
	{"#   kubectl apply -f install.yaml\n", "#   helm install nftpolicy charts/nftpolicy\n"},
	{"      nodeSelector:\n        kubernetes.io/os: linux\n",
		"      {{- with .Values.nodeSelector }}\n      nodeSelector:\n        {{- toYaml . | nindent 8 }}\n      {{- end }}\n"},
	{"      tolerations:\n        - operator: Exists\n",
		"      {{- with .Values.tolerations }}\n      tolerations:\n        {{- toYaml . | nindent 8 }}\n      {{- end }}\n"},
	// The boot plugin (values bootPlugin): its init container, the
	// agent's flags and mounts that name its directories, the volumes.
	// The init container first: the agent's container has the same image
	// lines.
	{"      initContainers:\n", "      {{- if .Values.bootPlugin.enabled }}\n      initContainers:\n"},
	{"      containers:\n        - name: nftpolicy\n", "      {{- end }}\n      containers:\n        - name: nftpolicy\n"},
	{"          image: ghcr.io/nftpolicy/nftpolicy:v0.1.0\n          imagePullPolicy: IfNotPresent\n          args: [cni-install,",
		"          image: {{ include \"nftpolicy.image\" . }}\n          imagePullPolicy: {{ .Values.image.pullPolicy }}\n          args: [cni-install,"},
	{"            - --cni-bin-dir=/host/opt/cni/bin\n            - --cni-conf-dir=/host/etc/cni/net.d\n",
		"            {{- if .Values.bootPlugin.enabled }}\n            - --cni-bin-dir=/host/opt/cni/bin\n            - --cni-conf-dir=/host/etc/cni/net.d\n            {{- end }}\n"},
	{"              mountPath: /run/nftpolicy-preview\n            - name: cni-bin\n              mountPath: /host/opt/cni/bin\n            - name: cni-conf\n              mountPath: /host/etc/cni/net.d\n",
		"              mountPath: /run/nftpolicy-preview\n            {{- if .Values.bootPlugin.enabled }}\n            - name: cni-bin\n              mountPath: /host/opt/cni/bin\n            - name: cni-conf\n              mountPath: /host/etc/cni/net.d\n            {{- end }}\n"},
	{"        - name: cni-bin\n          hostPath:\n            path: /opt/cni/bin\n            type: DirectoryOrCreate\n        - name: cni-conf\n          hostPath:\n            path: /etc/cni/net.d\n            type: DirectoryOrCreate",
		"        {{- if .Values.bootPlugin.enabled }}\n        - name: cni-bin\n          hostPath:\n            path: {{ .Values.bootPlugin.cniBinDir }}\n            type: DirectoryOrCreate\n        - name: cni-conf\n          hostPath:\n            path: {{ .Values.bootPlugin.cniConfDir }}\n            type: DirectoryOrCreate\n        {{- end }}"},
	{"          image: ghcr.io/nftpolicy/nftpolicy:v0.1.0\n          imagePullPolicy: IfNotPresent\n",
		"          image: {{ include \"nftpolicy.image\" . }}\n          imagePullPolicy: {{ .Values.image.pullPolicy }}\n"},
	{"    mode: hybrid\n",
		"    mode: {{ .Values.mode }}\n    {{- if .Values.failOpen }}\n    failOpen: true\n    {{- end }}\n"},
	{"      bindAddress: \":9402\"\n      auth: delegated\n",
		"      bindAddress: {{ .Values.metrics.bindAddress | quote }}\n      auth: {{ .Values.metrics.auth }}\n"},
	{"    logging:\n      verbosity: 1\n",
		"    logging:\n      verbosity: {{ .Values.logVerbosity }}\n    {{- with .Values.config }}\n    {{- toYaml . | nindent 4 }}\n    {{- end }}\n"},
	{"            - --config=/etc/nftpolicy/config.yaml\n",
		"            - --config=/etc/nftpolicy/config.yaml\n            {{- with .Values.extraArgs }}\n            {{- toYaml . | nindent 12 }}\n            {{- end }}\n"},
	{"          resources:\n            requests:\n              cpu: 50m\n              memory: 128Mi\n            limits:\n              memory: 768Mi\n",
		"          {{- with .Values.resources }}\n          resources:\n            {{- toYaml . | nindent 12 }}\n          {{- end }}\n"},
}

// chartTemplate returns the chart's template made from install.yaml.
func chartTemplate(install string) (string, error) {
	if strings.Contains(install, "{{") {
		return "", fmt.Errorf("install.yaml holds {{, which helm would read as a template action")
	}
	s := install
	for _, e := range chartEdits {
		if n := strings.Count(s, e[0]); n != 1 {
			return "", fmt.Errorf("install.yaml has %d copies of %q, want 1: change hack/release/chart.go's chartEdits (and values.yaml) with it", n, e[0])
		}
		s = strings.Replace(s, e[0], e[1], 1)
	}
	return chartHeader + s, nil
}

// publisherImage is deploy/publisher.yaml's image line, which the chart
// makes its image value.
const publisherImage = "          image: ghcr.io/nftpolicy/nftpolicy:v0.1.0\n          imagePullPolicy: IfNotPresent\n"

// publisherTemplate returns the chart's publisher template made from
// deploy/publisher.yaml: its objects, with the chart's image, rendered
// only with publisher.enabled (off by default: docs/scale-out.md).
func publisherTemplate(manifest string) (string, error) {
	if strings.Contains(manifest, "{{") {
		return "", fmt.Errorf("deploy/publisher.yaml holds {{, which helm would read as a template action")
	}
	if n := strings.Count(manifest, publisherImage); n != 1 {
		return "", fmt.Errorf("deploy/publisher.yaml has %d copies of %q, want 1: change hack/release/chart.go with it", n, publisherImage)
	}
	s := strings.Replace(manifest, publisherImage,
		"          image: {{ include \"nftpolicy.image\" . }}\n          imagePullPolicy: {{ .Values.image.pullPolicy }}\n", 1)
	return `{{- /*
Made from deploy/publisher.yaml by hack/chart-sync.sh (release chart-sync):
do not edit. Rendered only with publisher.enabled.
*/ -}}
{{- if .Values.publisher.enabled }}
` + s + "{{- end }}\n", nil
}

func cmdChartSync(args []string) error {
	fs := flag.NewFlagSet("chart-sync", flag.ExitOnError)
	in := fs.String("in", "install.yaml", "the manifest")
	out := fs.String("out", "charts/nftpolicy/templates/install.yaml", "the chart's template to write")
	pubIn := fs.String("publisher-in", "deploy/publisher.yaml", "the publisher's manifest")
	pubOut := fs.String("publisher-out", "charts/nftpolicy/templates/publisher.yaml", "the chart's publisher template to write")
	fs.Parse(args)
	b, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	t, err := chartTemplate(string(b))
	if err != nil {
		return err
	}
	if err := writeFileAtomic(*out, []byte(t), 0o644); err != nil {
		return err
	}
	if b, err = os.ReadFile(*pubIn); err != nil {
		return err
	}
	if t, err = publisherTemplate(string(b)); err != nil {
		return err
	}
	return writeFileAtomic(*pubOut, []byte(t), 0o644)
}
