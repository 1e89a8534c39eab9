package config

import (
	"reflect"
	"strings"
)

// Field is one setting of AgentConfiguration: its path in the file
// (dotted JSON names) and the flag that sets it ("" for none).
type Field struct {
	Path  string
	Flag  string
	Index []int // reflect's index of the field in AgentConfiguration
}

// Fields lists the settings of AgentConfiguration in declaration order,
// from the struct's json and flag tags: a nested struct with a flag tag
// (the deny and staged logs) prefixes its fields' flags. The logging
// configuration, whose flags component-base adds, and TypeMeta are left
// out.
func Fields() []Field {
	var out []Field
	walk(reflect.TypeOf(AgentConfiguration{}), "", "", nil, &out)
	return out
}

func walk(t reflect.Type, path, flagPrefix string, index []int, out *[]Field) {
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if name == "" || name == "-" || sf.Name == "Logging" {
			continue
		}
		p := name
		if path != "" {
			p = path + "." + name
		}
		idx := append(append([]int(nil), index...), i)
		flag, hasFlag := sf.Tag.Lookup("flag")
		if sf.Type.Kind() == reflect.Struct && sf.Type.PkgPath() == t.PkgPath() {
			walk(sf.Type, p, flagPrefix+flag, idx, out)
			continue
		}
		if hasFlag {
			flag = flagPrefix + flag
		}
		*out = append(*out, Field{Path: p, Flag: flag, Index: idx})
	}
}

// CommandLineOnlyFlags are the agent's flags that are no setting of the
// file, with why: they name this node and pod, which differ from node to
// node while the file (a ConfigMap) is shared by every agent, they name
// the file, or they name host directories as the DaemonSet mounts them.
var CommandLineOnlyFlags = []struct{ Name, Why string }{
	{"config", "the AgentConfiguration file itself"},
	{"hostname-override", "this node's name (default: $NODE_NAME, else the host name)"},
	{"node-ip", "this node's addresses (default: from the Node object)"},
	{"pod-name", "the agent's pod (default: $POD_NAME, from the downward API)"},
	{"pod-namespace", "the agent's pod's namespace (default: $POD_NAMESPACE)"},
	{"cni-bin-dir", "the node's CNI plugin directory as the agent's container mounts it (the boot plugin's), which the DaemonSet's volumes decide"},
	{"cni-conf-dir", "the node's CNI configuration directory as the agent's container mounts it (the boot plugin's), which the DaemonSet's volumes decide"},
}

// FlagOf returns the flag that sets the setting at path (as Fields names
// it), or "".
func FlagOf(path string) string {
	for _, f := range Fields() {
		if f.Path == path {
			return f.Flag
		}
	}
	return ""
}
