package scenario_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// testdata/example.yaml is the example of scenario-format.md plus the pod
// y/b, which its first probe uses but the document does not define.

func TestParseExample(t *testing.T) {
	data, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := scenario.Parse(data)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(s.Namespaces) != 1 || s.Namespaces[0].Name != "x" || s.Namespaces[0].Labels["env"] != "prod" {
		t.Errorf("namespaces: %+v", s.Namespaces)
	}
	if len(s.Pods) != 2 {
		t.Fatalf("pods: %+v", s.Pods)
	}
	a := s.Pod("x/a")
	if a == nil || a.IP != "10.244.1.10" || a.Node != "node-1" || len(a.Ports) != 2 || a.Ports[1].Name != "http" || a.Ports[1].Port != 81 {
		t.Errorf("x/a: %+v", a)
	}
	if len(s.Policies) != 1 || s.Policies[0].Namespace != "x" || s.Policies[0].Name != "deny-all" || len(s.Policies[0].Spec.PolicyTypes) != 1 {
		t.Errorf("policies: %+v", s.Policies)
	}
	if len(s.Probes) != 3 {
		t.Fatalf("probes: %+v", s.Probes)
	}
	if got := s.Probes[1]; got.From.IP != "192.0.2.10" || got.To.Pod != "x/a" || got.ProbeProtocol() != compile.ProtoUDP {
		t.Errorf("probe 1: %+v", got)
	}
	if got := s.Probes[2].ProbeProtocol(); got != compile.ProtoTCP {
		t.Errorf("probe 2: protocol %v, want TCP by default", got)
	}

	// Namespace y, used but not listed, exists with only its name label.
	prog := compile.Build(s.Input("", nil, nil))
	if len(prog.Problems) > 0 {
		t.Errorf("problems: %v", prog.Problems)
	}
	if _, ok := prog.PodByKey("y/b"); !ok {
		t.Errorf("y/b is not in the program")
	}
}

// The example exactly as scenario-format.md prints it probes from y/b, which
// it does not define.
func TestParseDocumentExampleLacksPodYB(t *testing.T) {
	data, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i, j := strings.Index(doc, "  # Not in the example"), strings.Index(doc, "policies:")
	if i < 0 || j < i {
		t.Fatal("testdata/example.yaml changed shape")
	}
	_, err = scenario.Parse([]byte(doc[:i] + doc[j:]))
	if err == nil || !strings.Contains(err.Error(), `probes[0].from: unknown pod "y/b"`) {
		t.Errorf("got %v, want the unknown pod y/b", err)
	}
}

const baseScenario = `
namespaces:
  - {name: x, labels: {env: prod}}
pods:
  - {namespace: x, name: a, labels: {pod: a}, ip: 10.244.1.1, ports: [{name: http, port: 80}]}
  - {namespace: y, name: b, labels: {pod: b}, ips: [10.244.2.2, "fd00::2:2"]}
policies:
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: p, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress:
        - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.244.0.0/16]}}]
probes:
  - {from: {pod: y/b}, to: {pod: x/a}, port: 80}
`

func TestParseRejects(t *testing.T) {
	if _, err := scenario.Parse([]byte(baseScenario)); err != nil {
		t.Fatalf("base scenario: %v", err)
	}
	checkRejects(t, baseScenario, []rejectCase{
		{"unknown top-level field", "probes:", "probe:", `unknown field "probe"`},
		{"unknown pod field", "labels: {pod: a}, ip:", "labels: {pod: a}, pip:", `unknown field "pods[0].pip"`},
		{"unknown policy field", "podSelector:", "podSelectr:", `unknown field "policies[0].spec.podSelectr"`},
		{"unknown probe field", "port: 80}\n", "port: 80, proto: UDP}\n", `unknown field "probes[0].proto"`},
		{"bad pod IP", "ip: 10.244.1.1", "ip: 10.244.1.300", `bad IP "10.244.1.300"`},
		{"bad probe IP", "from: {pod: y/b}", "from: {ip: 192.0.2.}", `bad IP "192.0.2."`},
		{"unknown pod reference", "to: {pod: x/a}", "to: {pod: x/c}", `unknown pod "x/c"`},
		{"pod reference without namespace", "to: {pod: x/a}", "to: {pod: a}", `unknown pod "a"`},
		{"duplicate pod", "pods:\n", "pods:\n  - {namespace: x, name: a, ip: 10.244.9.9}\n", "pods[1] (x/a): duplicate pod"},
		{"duplicate IP", "ips: [10.244.2.2, \"fd00::2:2\"]", "ip: 10.244.1.1", "already belongs to x/a"},
		{"except outside cidr", "except: [10.244.0.0/16]", "except: [192.168.0.0/16]", "spec.ingress[0].from[0].ipBlock.except[0]"},
		{"host bits in cidr", "cidr: 10.0.0.0/8", "cidr: 10.244.1.10/8", "spec.ingress[0].from[0].ipBlock.cidr: 10.244.1.10/8 must not have bits set beyond the prefix length"},
		{"host bits in except", "except: [10.244.0.0/16]", "except: [10.244.1.0/16]", "spec.ingress[0].from[0].ipBlock.except[0]: 10.244.1.0/16 must not have bits set"},
		{"bad selector operator", "podSelector: {matchLabels: {pod: a}}",
			"podSelector: {matchExpressions: [{key: pod, operator: Equals, values: [a]}]}", "spec.podSelector.matchExpressions[0].operator"},
		{"wrong kind", "kind: NetworkPolicy", "kind: Policy", "kind NetworkPolicy"},
		{"probe port out of range", "port: 80}\n", "port: 0}\n", "port 0 out of range"},
		{"not YAML", "probes:", "probes: [", "parsing"},
	})
}

// rejectCase turns a valid scenario into one Parse must reject: old
// replaced by new; want is part of the error message.
type rejectCase struct {
	name, old, new string
	want           string
}

func checkRejects(t *testing.T, base string, cases []rejectCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(base, c.old) {
				t.Fatalf("scenario lacks %q", c.old)
			}
			_, err := scenario.Parse([]byte(strings.Replace(base, c.old, c.new, 1)))
			if err == nil {
				t.Fatalf("accepted; want an error with %q", c.want)
			}
			var se *scenario.Error
			if !errors.As(err, &se) {
				t.Errorf("error %T is not a *scenario.Error", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

// Field names are case-sensitive, as kubectl's strict decoding has them:
// "podselector" or "IPs" are unknown fields, not podSelector and ips.
func TestParseRejectsCaseVariantFields(t *testing.T) {
	for _, c := range []struct{ old, new string }{
		{"podSelector:", "podselector:"},
		{"ips: [", "IPs: ["},
		{"probes:", "Probes:"},
	} {
		_, err := scenario.Parse([]byte(strings.Replace(baseScenario, c.old, c.new, 1)))
		if err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%q instead of %q: got %v, want an unknown field error", c.new, c.old, err)
		}
	}
}

// YAML 1.1 reads y, n, yes, no, on and off as booleans; the scenario format
// is YAML 1.2, where they are strings.
func TestParseKeepsYAMLStrings(t *testing.T) {
	s, err := scenario.Parse([]byte(`
namespaces:
  - {name: y, labels: {flag: on, answer: no}}
pods:
  - {namespace: y, name: n, labels: {pod: y}, ip: 10.244.2.1}
  - {namespace: x, name: a, ip: 10.244.1.1}
probes:
  - {from: {pod: y/n}, to: {pod: x/a}, port: 80}
`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Namespaces[0].Name != "y" || s.Namespaces[0].Labels["flag"] != "on" || s.Namespaces[0].Labels["answer"] != "no" {
		t.Errorf("namespace: %+v", s.Namespaces[0])
	}
	if p := s.Pods[0]; p.Namespace != "y" || p.Name != "n" || p.Labels["pod"] != "y" {
		t.Errorf("pod: %+v", p)
	}
	if s.Probes[0].From.Pod != "y/n" {
		t.Errorf("probe: %+v", s.Probes[0])
	}
}

func TestParseJSON(t *testing.T) {
	s, err := scenario.Parse([]byte(`{"pods":[{"namespace":"x","name":"a","ip":"10.244.1.1"}],
		"probes":[{"from":{"ip":"192.0.2.1"},"to":{"pod":"x/a"},"port":80,"protocol":"SCTP"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Probes[0].ProbeProtocol() != compile.ProtoSCTP {
		t.Errorf("probe: %+v", s.Probes[0])
	}
}
