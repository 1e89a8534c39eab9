package bootcni

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

type fakeHolder struct {
	held     []netip.Addr
	released []netip.Addr
	err      error
}

func (f *fakeHolder) Hold(addrs []netip.Addr) (HoldState, error) {
	if f.err != nil {
		return 0, f.err
	}
	f.held = append(f.held, addrs...)
	return HoldCreated, nil
}

func (f *fakeHolder) Release(addrs []netip.Addr) error {
	f.released = append(f.released, addrs...)
	return f.err
}

func env(cmd string) func(string) string {
	m := map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": "/var/run/netns/x", "CNI_PATH": "/opt/cni/bin"}
	return func(k string) string { return m[k] }
}

const prev = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],` +
	`"ips":[{"address":"10.244.1.5/24","gateway":"10.244.1.1","interface":0},{"address":"fd00::5/64","interface":0}],"dns":{}}`

func conf(version, prevResult string) string {
	s := `{"cniVersion":"` + version + `","name":"k8s","type":"nftpolicy-boot"`
	if prevResult != "" {
		s += `,"prevResult":` + prevResult
	}
	return s + "}"
}

func TestAddHoldsThePodsAddressesAndPassesPrevResultThrough(t *testing.T) {
	h := &fakeHolder{}
	var out bytes.Buffer
	if code := Run(env("ADD"), strings.NewReader(conf("1.1.0", prev)), &out, h); code != 0 {
		t.Fatalf("ADD: exit %d: %s", code, out.String())
	}
	want := []netip.Addr{netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00::5")}
	if !slices.Equal(h.held, want) {
		t.Errorf("held %v, want %v", h.held, want)
	}
	var got, in map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("result %q: %v", out.String(), err)
	}
	_ = json.Unmarshal([]byte(prev), &in)
	in["cniVersion"] = "1.1.0"
	gb, _ := json.Marshal(got)
	ib, _ := json.Marshal(in)
	if !bytes.Equal(gb, ib) {
		t.Errorf("result %s, want prevResult in the config's version %s", gb, ib)
	}
}

func TestAddFailsClosed(t *testing.T) {
	for _, tc := range []struct {
		name, stdin string
		holdErr     error
		code        int
	}{
		{"no prevResult (not chained)", conf("1.0.0", ""), nil, codeInvalidConfig},
		{"hold refused by the kernel", conf("1.0.0", prev), errors.New("netlink: operation not permitted"), codeTryAgainLater},
		{"bad address", conf("1.0.0", `{"ips":[{"address":"10.244.1.500/24"}]}`), nil, codeDecode},
		{"old version", conf("0.2.0", prev), nil, codeIncompatibleVersion},
		{"not JSON", "{", nil, codeDecode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &fakeHolder{err: tc.holdErr}
			var out bytes.Buffer
			if code := Run(env("ADD"), strings.NewReader(tc.stdin), &out, h); code != 1 {
				t.Fatalf("exit %d, want 1 (%s)", code, out.String())
			}
			var e cniError
			if err := json.Unmarshal(out.Bytes(), &e); err != nil || e.Code != tc.code || e.CNIVersion == "" {
				t.Errorf("error result %q (%v), want code %d with a cniVersion", out.String(), err, tc.code)
			}
		})
	}
}

func TestDelReleasesAndNeverFailsForWhatIsGone(t *testing.T) {
	h := &fakeHolder{}
	var out bytes.Buffer
	if code := Run(env("DEL"), strings.NewReader(conf("1.0.0", prev)), &out, h); code != 0 || out.Len() != 0 {
		t.Fatalf("DEL: exit %d, output %q", code, out.String())
	}
	if len(h.released) != 2 {
		t.Errorf("released %v, want the pod's 2 addresses", h.released)
	}
	// Without a cached result there is nothing to release.
	if code := Run(env("DEL"), strings.NewReader(conf("1.0.0", "")), &out, &fakeHolder{err: errors.New("unused")}); code != 0 {
		t.Errorf("DEL without prevResult: exit %d: %s", code, out.String())
	}
}

func TestCheckVersionAndUnknownCommands(t *testing.T) {
	var out bytes.Buffer
	if code := Run(env("CHECK"), strings.NewReader(conf("1.0.0", prev)), &out, &fakeHolder{}); code != 0 {
		t.Errorf("CHECK: exit %d: %s", code, out.String())
	}
	out.Reset()
	if code := Run(env("CHECK"), strings.NewReader(conf("1.0.0", "")), &out, &fakeHolder{}); code != 1 {
		t.Errorf("CHECK without prevResult: exit %d, want 1", code)
	}
	out.Reset()
	if code := Run(env("VERSION"), strings.NewReader(""), &out, &fakeHolder{}); code != 0 {
		t.Fatalf("VERSION: exit %d", code)
	}
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || !slices.Contains(v.Supported, "1.0.0") {
		t.Errorf("VERSION: %q (%v)", out.String(), err)
	}
	out.Reset()
	if code := Run(env("FROB"), strings.NewReader(conf("1.0.0", prev)), &out, &fakeHolder{}); code != 1 {
		t.Errorf("unknown command: exit %d, want 1", code)
	}
}

// FuzzRun: no configuration makes the plugin panic, and an ADD that
// succeeds either held every address of the result or found none.
func FuzzRun(f *testing.F) {
	for _, s := range []string{conf("1.0.0", prev), conf("1.0.0", "null"), conf("1.0.0", "5"), conf("1.0.0", `{"ips":null}`),
		conf("1.0.0", `{"ips":[{"address":"::ffff:10.0.0.1/128"}]}`), `{"cniVersion":"1.0.0","prevResult":[]}`, "null", ""} {
		f.Add("ADD", s)
		f.Add("DEL", s)
		f.Add("CHECK", s)
	}
	f.Fuzz(func(t *testing.T, cmd, stdin string) {
		h := &fakeHolder{}
		var out bytes.Buffer
		code := Run(env(cmd), strings.NewReader(stdin), &out, h)
		if code != 0 && code != 1 {
			t.Fatalf("exit %d", code)
		}
		if code == 0 && cmd == "ADD" {
			var c netConf
			_ = json.Unmarshal([]byte(stdin), &c)
			addrs, _ := resultAddrs(c.PrevResult)
			if len(h.held) != len(addrs) {
				t.Fatalf("ADD succeeded holding %v of %v", h.held, addrs)
			}
		}
	})
}
