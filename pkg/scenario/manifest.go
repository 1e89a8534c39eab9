package scenario

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
	networkingv1 "k8s.io/api/networking/v1"
	kjson "sigs.k8s.io/json"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Manifest is the policies of a kubectl-style manifest (`kubectl apply -f`):
// what `nftpolicy preview` applies, or deletes, in thought.
type Manifest struct {
	Policies               []networkingv1.NetworkPolicy      `json:"policies,omitempty"`
	ClusterNetworkPolicies []npav1beta1.ClusterNetworkPolicy `json:"clusterNetworkPolicies,omitempty"`
}

// ParseManifest decodes YAML or JSON documents separated by "---", each a
// NetworkPolicy, a ClusterNetworkPolicy or a List of them. A
// NetworkPolicy without a namespace gets namespace, as kubectl gives it
// the context's. Fields are decoded strictly and every policy is
// validated as Parse validates a scenario's (the API server's checks, and
// what nftpolicy cannot enforce as written); another kind is an error.
func ParseManifest(data []byte, namespace string) (*Manifest, error) {
	var m Manifest
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for i := 0; ; i++ {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("invalid manifest: document %d: parsing: %w", i, err)
		}
		if doc == nil { // an empty document ("---" twice)
			continue
		}
		if err := m.add(fmt.Sprintf("document %d", i), doc, namespace, true); err != nil {
			return nil, fmt.Errorf("invalid manifest: %w", err)
		}
	}
	if len(m.Policies) == 0 && len(m.ClusterNetworkPolicies) == 0 {
		return nil, errors.New("invalid manifest: no NetworkPolicy or ClusterNetworkPolicy")
	}
	s := Scenario{Policies: m.Policies, ClusterNetworkPolicies: m.ClusterNetworkPolicies}
	v := &validator{s: &s}
	v.policies()
	cnps := map[string]bool{}
	for i := range s.ClusterNetworkPolicies {
		v.errs = append(v.errs, validateCNP(i, &s.ClusterNetworkPolicies[i], cnps)...)
	}
	if err := errors.Join(v.errs...); err != nil {
		return nil, fmt.Errorf("invalid manifest: %w", err)
	}
	return &m, nil
}

// add decodes one object (a List's items too, when list is set).
func (m *Manifest) add(where string, doc any, namespace string, list bool) error {
	obj, ok := doc.(map[string]any)
	if !ok {
		return fmt.Errorf("%s: not an object", where)
	}
	kind, _ := obj["kind"].(string)
	if list && strings.HasSuffix(kind, "List") {
		items, _ := obj["items"].([]any)
		for i, it := range items {
			if err := m.add(fmt.Sprintf("%s items[%d]", where, i), it, namespace, false); err != nil {
				return err
			}
		}
		return nil
	}
	data, err := json.Marshal(obj)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	switch kind {
	case "NetworkPolicy":
		var np networkingv1.NetworkPolicy
		if err := strictJSON(data, &np); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if np.Namespace == "" {
			np.Namespace = namespace
		}
		m.Policies = append(m.Policies, np)
	case "ClusterNetworkPolicy":
		var cnp npav1beta1.ClusterNetworkPolicy
		if err := strictJSON(data, &cnp); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		m.ClusterNetworkPolicies = append(m.ClusterNetworkPolicies, cnp)
	default:
		return fmt.Errorf("%s: kind %q: want NetworkPolicy or ClusterNetworkPolicy", where, kind)
	}
	return nil
}

// strictJSON decodes as kubectl does: strict and case-sensitive.
func strictJSON(data []byte, into any) error {
	strictErrs, err := kjson.UnmarshalStrict(data, into)
	if err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	if len(strictErrs) > 0 {
		return fmt.Errorf("decoding: %w", errors.Join(strictErrs...))
	}
	return nil
}
