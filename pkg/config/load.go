package config

import (
	"errors"
	"fmt"
	"os"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Load reads the configuration file at path (YAML or JSON) over Default
// (see Decode).
func Load(path string) (*AgentConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the configuration: %w", err)
	}
	c, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Decode decodes a configuration (YAML or JSON) over Default: a field the
// data leaves out keeps its default. Decoding is strict: an unknown or
// misspelled field (names match case-sensitively), a field given twice, a
// value of the wrong type, and an apiVersion or kind other than
// nftpolicy.io/v1alpha1 AgentConfiguration are errors naming the field.
// Decode does not validate the values (Validate does, after flags).
func Decode(data []byte) (*AgentConfiguration, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("decoding: %w", err)
	}
	c := Default()
	c.APIVersion, c.Kind = "", ""
	strict, err := kjson.UnmarshalStrict(js, c)
	if err != nil {
		return nil, fmt.Errorf("decoding: %w", err)
	}
	if len(strict) > 0 {
		return nil, fmt.Errorf("decoding: %w", errors.Join(strict...))
	}
	if c.APIVersion != APIVersion || c.Kind != Kind {
		return nil, fmt.Errorf("apiVersion %q, kind %q: want apiVersion %s, kind %s", c.APIVersion, c.Kind, APIVersion, Kind)
	}
	return c, nil
}
