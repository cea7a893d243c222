package altmark

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/config"
)

func TestExamplesParse(t *testing.T) {
	files, _ := filepath.Glob("../../examples/altmark-*.yaml")
	if len(files) < 3 {
		t.Fatalf("examples: %v", files)
	}
	for _, f := range files {
		if _, err := LoadConfig(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestConfigSpec(t *testing.T) {
	cfg, err := LoadConfig("../../examples/altmark-probe.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := ProbeSpec{
		Points:   []Point{{"eth0", "in"}, {"eth0", "out"}, {"eth1", "in"}, {"eth1", "out"}},
		PeriodNs: int64(time.Second), Carrier: "dscp", DSCPBits: [2]uint8{0, 1},
		HashRef: 0x5a5a5a5a, HashBits: 8, NMax: 1000, Protocols: []uint8{6, 17},
	}
	if got := cfg.Spec(); !reflect.DeepEqual(got, want) {
		t.Errorf("spec %+v\nwant %+v", got, want)
	}
	if cfg.IPFIX == nil || cfg.IPFIX.Collector != "198.18.0.10:4739" || cfg.IPFIX.Enterprise != 32473 {
		t.Errorf("ipfix %+v", cfg.IPFIX)
	}
	flag, err := LoadConfig("../../examples/altmark-ipv4-flag.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s := flag.Spec(); len(s.Backbone) != 1 || s.Backbone[0] != netip.MustParsePrefix("198.18.255.0/24") || s.DSCPBits != [2]uint8{} {
		t.Errorf("ipv4-flag spec %+v", s)
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig("t.yaml", []byte("probe_id: p\ninterfaces: [{name: veth0}]\ncarrier: ipv6-altmark\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Period != Duration(time.Second) || cfg.HashBits != 8 || cfg.NMax != 1000 || cfg.DataDir != DefaultDataDir ||
		cfg.Interfaces[0].Direction != "both" || cfg.DSCPBits != nil || cfg.Periods != 0 {
		t.Errorf("defaults: %+v", cfg)
	}
}

// A short period is accepted with the warning the docs promise (probe run prints it).
func TestConfigShortPeriodWarns(t *testing.T) {
	cfg, err := ParseConfig("t.yaml", []byte("probe_id: p\ninterfaces: [{name: veth0}]\ncarrier: dscp\nperiod: 50ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 1 || !strings.HasPrefix(cfg.Warnings[0], "t.yaml:4: period: 50ms is short") {
		t.Errorf("warnings = %q", cfg.Warnings)
	}
}

// Every bad field is named, with its line, all at once.
func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		yaml   string
		fields []string
	}{
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nperiod: 5ms\n", []string{"period"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nperiod: soon\n", []string{"period"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nperiod: 3000000h\n", []string{"period"}},
		{"interfaces: [{name: eth0, direction: sideways}]\ncarrier: dscp\n", []string{"interfaces[0].direction"}},
		{"interfaces: [{name: eth0}, {name: eth0}]\ncarrier: dscp\n", []string{"interfaces[1].name"}},
		{"interfaces: [{direction: in}]\ncarrier: dscp\n", []string{"interfaces[0].name"}},
		{"interfaces: []\ncarrier: dscp\n", []string{"interfaces"}},
		{"carrier: dscp\n", []string{"interfaces"}},
		{"interfaces: [{name: eth0}]\n", []string{"carrier"}},
		{"interfaces: [{name: eth0}]\ncarrier: ecn\n", []string{"carrier"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\ndscp_bits: [1, 1]\n", []string{"dscp_bits"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\ndscp_bits: [0, 6]\n", []string{"dscp_bits[1]"}},
		{"interfaces: [{name: eth0}]\ncarrier: ipv6-altmark\ndscp_bits: [0, 1]\n", []string{"dscp_bits"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nbackbone: [198.18.0.0/24]\n", []string{"backbone"}},
		{"interfaces: [{name: eth0}]\ncarrier: ipv4-flag\nbackbone: [fd00::/8]\n", []string{"backbone[0]"}},
		{"interfaces: [{name: eth0}]\ncarrier: ipv4-flag\nbackbone: [198.18.0.0/24, 198.18.1.5/24]\n", []string{"backbone[1]"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nstart_color: 2\n", []string{"start_color"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nhash_ref: 0x100000000\n", []string{"hash_ref"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nhash_bits: 33\n", []string{"hash_bits"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nnmax: 1\n", []string{"nmax"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nperiods: -1\n", []string{"periods"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nprotocols: [tcp, quic]\n", []string{"protocols[1]"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nprobe_id: a/b\n", []string{"probe_id"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nipfix: {transport: sctp}\n", []string{"ipfix.transport", "ipfix.collector"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nipfix: {collector: 'host:port'}\n", []string{"ipfix.collector"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\ncolour: 1\n", []string{"colour"}},
		{"interfaces: [{name: eth0, dir: in}]\ncarrier: dscp\nperiod: 1\nnmax: x\n", []string{"interfaces[0].dir", "period", "nmax"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nflowmon_ids: [7]\n", []string{"flowmon_ids"}},
		{"interfaces: [{name: eth0}]\ncarrier: dscp\nflowmon_keep: 3\n", []string{"flowmon_keep"}},
		{"interfaces: [{name: eth0}]\ncarrier: ipv6-altmark\nflowmon_ids: [7, 9-8, x, 1048576]\n", []string{"flowmon_ids[1]", "flowmon_ids[2]", "flowmon_ids[3]"}},
		{"interfaces: [{name: eth0}]\ncarrier: ipv6-altmark\nflowmon_ids: [0-4096]\n", []string{"flowmon_ids"}},
		{"interfaces: [{name: eth0}]\ncarrier: ipv6-altmark\nflowmon_ids: []\nflowmon_keep: -1\n", []string{"flowmon_ids", "flowmon_keep"}},
	} {
		_, err := ParseConfig("t.yaml", []byte(tc.yaml))
		var es config.Errors
		if !errors.As(err, &es) {
			t.Errorf("%q: error %v, want config.Errors", tc.yaml, err)
			continue
		}
		var fields []string
		for _, e := range es {
			fields = append(fields, e.Field)
			if e.Line == 0 {
				t.Errorf("%q: %v has no line", tc.yaml, e)
			}
		}
		if !reflect.DeepEqual(fields, tc.fields) {
			t.Errorf("%q: fields %v, want %v (%v)", tc.yaml, fields, tc.fields, err)
		}
	}
}

// An error about a key that belongs to another carrier points at that key's line, in the
// probe's and in the marker's configuration.
func TestOtherCarriersKeysPointAtTheirLine(t *testing.T) {
	probe := "interfaces: [{name: eth0}]\ncarrier: ipv6-altmark\nperiod: 1s\ndscp_bits: [0, 1]\nbackbone: [198.18.0.0/24]\n"
	marker := "carrier: ipv4-flag\nperiod: 1s\ndscp_bits: [0, 1]\ndouble: {packets: 2}\nflowmon_range: 1-9\n"
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"probe", func() error { _, err := ParseConfig("t.yaml", []byte(probe)); return err }(), []string{"t.yaml:4: dscp_bits", "t.yaml:5: backbone"}},
		{"marker", func() error { _, err := ParseMarkConfig("m.yaml", []byte(marker)); return err }(), []string{"m.yaml:3: dscp_bits", "m.yaml:4: double", "m.yaml:5: flowmon_range"}},
	} {
		for _, w := range tc.want {
			if tc.err == nil || !strings.Contains(tc.err.Error(), w) {
				t.Errorf("%s: %v, want %q", tc.name, tc.err, w)
			}
		}
	}
}

// flowmon_ids and flowmon_keep (ipv6-altmark): parsed, defaulted, and round-tripped as JSON.
func TestFlowMonIDsConfig(t *testing.T) {
	cfg, err := ParseConfig("t.yaml", []byte("probe_id: p\ninterfaces: [{name: eth0}]\ncarrier: ipv6-altmark\nflowmon_ids: [7, 0x10-0x11]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []IDRange{{7, 7}, {16, 17}}; !reflect.DeepEqual(cfg.FlowMonIDs, want) || cfg.FlowMonKeep == nil || *cfg.FlowMonKeep != defaultFlowMonKeep {
		t.Errorf("flowmon_ids %v keep %v", cfg.FlowMonIDs, cfg.FlowMonKeep)
	}
	if js := string(mustJSON(t, cfg)); !strings.Contains(js, `"flowmon_ids":[7,"16-17"],"flowmon_keep":10`) {
		t.Errorf("JSON %s", js)
	}
	again, err := ParseConfig("json", mustJSON(t, cfg))
	if err != nil || !reflect.DeepEqual(cfg, again) {
		t.Errorf("round trip %+v: %v", again, err)
	}
	dscp, _ := ParseConfig("t.yaml", []byte("probe_id: p\ninterfaces: [{name: eth0}]\ncarrier: dscp\n"))
	if dscp.FlowMonKeep != nil || strings.Contains(string(mustJSON(t, dscp)), "flowmon") {
		t.Errorf("dscp has FlowMonID settings: %s", mustJSON(t, dscp))
	}
}

func TestConfigJSONRoundTrip(t *testing.T) {
	cfg, err := LoadConfig("../../examples/altmark-probe.yaml")
	if err != nil {
		t.Fatal(err)
	}
	data := mustJSON(t, cfg)
	again, err := ParseConfig("json", data)
	if err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	if !reflect.DeepEqual(cfg, again) {
		t.Errorf("round trip %+v\nwant %+v", again, cfg)
	}
}

// A bad configuration file makes the command exit with code 2 naming the field, before
// anything attaches.
func TestProbeCommandBadConfigExits2(t *testing.T) {
	f := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(f, []byte("interfaces: [{name: eth0}]\ncarrier: dscp\nnmax: lots\n"), 0o644)
	for _, args := range [][]string{
		{"--config", f},
		{},
		{"--config", "../../examples/altmark-probe.yaml", "--listen", "0.0.0.0:9464"},
		{"--config", "../../examples/altmark-probe.yaml", "--idle"},
	} {
		t.Setenv(TokenEnv, "")
		_, err := runCLI(append([]string{"probe", "run"}, args...)...)
		if cli.ExitCode(err) != 2 {
			t.Errorf("%v: %v (exit %d), want exit 2", args, err, cli.ExitCode(err))
		}
		if len(args) == 2 && !strings.Contains(err.Error(), "bad.yaml:3: nmax") {
			t.Errorf("%v: %v does not name file, line and field", args, err)
		}
	}
}

// FuzzParseConfig: any input (a file, a PUT body) is accepted or refused with field errors,
// never a panic, and what is accepted survives the JSON round trip of GET/PUT /config.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		"interfaces: [{name: eth0}]\ncarrier: dscp\n",
		`{"interfaces":[{"name":"e","direction":"in"}],"carrier":"ipv4-flag","backbone":["198.18.0.0/16"],"ipfix":{"collector":"h"}}`,
		"interfaces: [{name: eth0}]\ncarrier: dscp\nprotocols: [1, tcp]\ndscp_bits: [2, 3]\nperiod: 250ms\n",
		"- a\n- b\n", "{", "interfaces: &a [*a]\n",
		"interfaces: [{name: eth0}]\ncarrier: ipv6-altmark\nflowmon_ids: [1, 5-9]\nflowmon_keep: 0\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig("fuzz", data)
		if err != nil {
			return
		}
		again, err := ParseConfig("json", mustJSON(t, cfg))
		if err != nil {
			t.Fatalf("accepted %q but not its JSON: %v", data, err)
		}
		if !reflect.DeepEqual(cfg, again) {
			t.Fatalf("round trip of %q: %+v != %+v", data, again, cfg)
		}
		cfg.Spec()
	})
}
