package bootcni

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
)

// PluginName is the plugin's executable in the CNI plugin directory and
// its type in the configuration list.
const PluginName = "nftpolicy-boot"

// SupportedVersions are the CNI spec versions the plugin speaks: those
// whose results list addresses as "ips" (0.3.0 on).
var SupportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// CNI error codes (the spec's well-known ones).
const (
	codeIncompatibleVersion = 1
	codeInvalidEnv          = 4
	codeDecode              = 6
	codeInvalidConfig       = 7
	codeTryAgainLater       = 11
)

// Holder is what the plugin asks of the kernel (Hold and Release on a
// netlink connection; a fake in tests).
type Holder interface {
	Hold(addrs []netip.Addr) (HoldState, error)
	Release(addrs []netip.Addr) error
}

// netConf is what the plugin reads of its configuration: the rest
// (name, args, runtimeConfig) it neither needs nor refuses.
type netConf struct {
	CNIVersion string          `json:"cniVersion"`
	Type       string          `json:"type"`
	PrevResult json.RawMessage `json:"prevResult"`
}

// prevAddrs is what the plugin reads of the previous plugin's result.
type prevAddrs struct {
	IPs []struct {
		Address string `json:"address"`
	} `json:"ips"`
}

// cniError is the spec's error result.
type cniError struct {
	CNIVersion string `json:"cniVersion,omitempty"`
	Code       int    `json:"code"`
	Msg        string `json:"msg"`
	Details    string `json:"details,omitempty"`
}

func (e *cniError) Error() string { return e.Msg + ": " + e.Details }

// Run is the plugin as a runtime executes it: the command in CNI_COMMAND
// (getenv), the configuration on stdin, the result or error on stdout.
// It returns the exit status (0 success, 1 error).
func Run(getenv func(string) string, stdin io.Reader, stdout io.Writer, h Holder) int {
	out, err := run(getenv, stdin, h)
	if err != nil {
		ce, ok := err.(*cniError)
		if !ok {
			ce = &cniError{Code: codeTryAgainLater, Msg: "nftpolicy-boot failed", Details: err.Error()}
		}
		if ce.CNIVersion == "" {
			ce.CNIVersion = SupportedVersions[len(SupportedVersions)-1]
		}
		b, _ := json.Marshal(ce)
		_, _ = stdout.Write(append(b, '\n'))
		return 1
	}
	if out != nil {
		_, _ = stdout.Write(append(out, '\n'))
	}
	return 0
}

func run(getenv func(string) string, stdin io.Reader, h Holder) ([]byte, error) {
	cmd := getenv("CNI_COMMAND")
	if cmd == "VERSION" {
		return json.Marshal(map[string]any{"cniVersion": SupportedVersions[len(SupportedVersions)-1], "supportedVersions": SupportedVersions})
	}
	raw, err := io.ReadAll(io.LimitReader(stdin, 16<<20))
	if err != nil {
		return nil, &cniError{Code: codeDecode, Msg: "reading the configuration", Details: err.Error()}
	}
	var conf netConf
	if err := json.Unmarshal(raw, &conf); err != nil {
		return nil, &cniError{Code: codeDecode, Msg: "decoding the configuration", Details: err.Error()}
	}
	if !slices.Contains(SupportedVersions, conf.CNIVersion) {
		return nil, &cniError{Code: codeIncompatibleVersion, Msg: "incompatible CNI version",
			Details: fmt.Sprintf("cniVersion %q; supported: %s", conf.CNIVersion, strings.Join(SupportedVersions, ", "))}
	}
	switch cmd {
	case "ADD":
		return add(conf, getenv, h)
	case "DEL":
		return nil, del(conf, h)
	case "CHECK":
		if !hasPrevResult(conf) {
			return nil, &cniError{CNIVersion: conf.CNIVersion, Code: codeInvalidConfig, Msg: "no prevResult",
				Details: PluginName + " is a chained plugin: it must follow the plugin that gives the pod its addresses"}
		}
		return nil, nil
	case "STATUS", "GC":
		// Nothing to report or collect: the hold ends with the agent's
		// first sync, not with the runtime.
		return nil, nil
	}
	return nil, &cniError{CNIVersion: conf.CNIVersion, Code: codeInvalidEnv, Msg: "unknown CNI_COMMAND", Details: fmt.Sprintf("%q", cmd)}
}

// add holds the pod's addresses (unless the agent enforces) and passes the
// previous result through, in the configuration's version.
func add(conf netConf, getenv func(string) string, h Holder) ([]byte, error) {
	if getenv("CNI_CONTAINERID") == "" || getenv("CNI_IFNAME") == "" {
		return nil, &cniError{CNIVersion: conf.CNIVersion, Code: codeInvalidEnv, Msg: "missing CNI_CONTAINERID or CNI_IFNAME"}
	}
	if !hasPrevResult(conf) {
		return nil, &cniError{CNIVersion: conf.CNIVersion, Code: codeInvalidConfig, Msg: "no prevResult",
			Details: PluginName + " is a chained plugin: it must follow the plugin that gives the pod its addresses"}
	}
	var res map[string]json.RawMessage
	if err := json.Unmarshal(conf.PrevResult, &res); err != nil {
		return nil, &cniError{CNIVersion: conf.CNIVersion, Code: codeDecode, Msg: "decoding prevResult", Details: err.Error()}
	}
	addrs, err := resultAddrs(conf.PrevResult)
	if err != nil {
		return nil, &cniError{CNIVersion: conf.CNIVersion, Code: codeDecode, Msg: "decoding prevResult", Details: err.Error()}
	}
	if len(addrs) > 0 {
		if _, err := h.Hold(addrs); err != nil {
			// Fail closed: the runtime retries the sandbox; the pod
			// does not run unheld.
			return nil, &cniError{CNIVersion: conf.CNIVersion, Code: codeTryAgainLater, Msg: "holding the pod's addresses", Details: err.Error()}
		}
	}
	v, _ := json.Marshal(conf.CNIVersion)
	res["cniVersion"] = v
	return json.Marshal(res)
}

// del releases the pod's addresses when the runtime still knows them (its
// cached result); a DEL never fails for what is already gone.
func del(conf netConf, h Holder) error {
	if !hasPrevResult(conf) {
		return nil
	}
	addrs, err := resultAddrs(conf.PrevResult)
	if err != nil || len(addrs) == 0 {
		return nil
	}
	if err := h.Release(addrs); err != nil {
		return &cniError{CNIVersion: conf.CNIVersion, Code: codeTryAgainLater, Msg: "releasing the pod's addresses", Details: err.Error()}
	}
	return nil
}

// hasPrevResult reports whether the configuration carries a previous
// result: a JSON object (null, or another kind, is none).
func hasPrevResult(conf netConf) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(conf.PrevResult, &m) == nil && m != nil
}

// resultAddrs returns the addresses of a result's "ips" (CIDR notation).
func resultAddrs(raw json.RawMessage) ([]netip.Addr, error) {
	var r prevAddrs
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ip := range r.IPs {
		p, err := netip.ParsePrefix(ip.Address)
		if err != nil {
			a, aerr := netip.ParseAddr(ip.Address)
			if aerr != nil {
				return nil, fmt.Errorf("address %q: %w", ip.Address, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Addr().Unmap())
	}
	return out, nil
}

// KernelHolder is the Holder of the network namespace the process runs in
// (the node's: a runtime runs its plugins there).
type KernelHolder struct{}

// Hold is Hold on a new netlink connection.
func (KernelHolder) Hold(addrs []netip.Addr) (HoldState, error) {
	conn, err := nftables.New()
	if err != nil {
		return 0, fmt.Errorf("opening netlink: %w", err)
	}
	defer conn.CloseLasting()
	return Hold(conn, addrs)
}

// Release is Release on a new netlink connection.
func (KernelHolder) Release(addrs []netip.Addr) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening netlink: %w", err)
	}
	defer conn.CloseLasting()
	return Release(conn, addrs)
}
