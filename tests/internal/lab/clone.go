package lab

import (
	"encoding/json"
	"fmt"

	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// CloneScenario returns a deep copy of s.
func CloneScenario(s *scenario.Scenario) *scenario.Scenario {
	data, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("marshalling a scenario: %v", err)) // only plain data: cannot fail
	}
	var out scenario.Scenario
	if err := json.Unmarshal(data, &out); err != nil {
		panic(fmt.Sprintf("unmarshalling a scenario: %v", err))
	}
	return &out
}

// Revalidate returns a copy of s as scenario.Parse reads it back, or the
// reason the API server would reject it.
func Revalidate(s *scenario.Scenario) (*scenario.Scenario, error) {
	data, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return scenario.Parse(data)
}

// MarshalScenario writes s in the scenario format (YAML), with a leading
// comment.
func MarshalScenario(s *scenario.Scenario, comment string) ([]byte, error) {
	data, err := yaml.Marshal(s)
	if err != nil {
		return nil, err
	}
	var head []byte
	for _, line := range splitLines(comment) {
		head = append(head, "# "+line+"\n"...)
	}
	return append(head, data...), nil
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}
