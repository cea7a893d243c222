package altmark

import (
	"bytes"
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
	"github.com/flowplane/flowplane/internal/match"
)

func TestMarkExamplesParse(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("../../examples/marker-*.yaml")
	if len(files) < 3 {
		t.Fatalf("examples: %v", files)
	}
	for _, f := range files {
		if _, err := LoadMarkConfig(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestMarkConfigSpec(t *testing.T) {
	t.Parallel()
	c, err := LoadMarkConfig("../../examples/marker-ipv6-altmark.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := MarkSpec{PeriodNs: uint64(time.Second), Carrier: "ipv6-altmark", PerFlow: true, FlowMonFirst: 4096, FlowMonCount: 4096,
		DoublePackets: 4, Protocols: []uint8{6, 17}, Dst: []netip.Prefix{netip.MustParsePrefix("fd00:0:0:2::/64")},
		SrcPorts: match.AnyPort, DstPorts: match.AnyPort}
	if got := c.Spec(); !reflect.DeepEqual(got, want) {
		t.Errorf("spec %+v\nwant %+v", got, want)
	}
	c, err = ParseMarkConfig("t.yaml", []byte("carrier: dscp\ndscp_bits: [5, 3]\nperiod: 50ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	// DSCP bit 5 is the TOS byte's top bit; bit 0 would be 0x04: the ECN bits 0x03 never.
	if s := c.Spec(); s.ColorMask != 0x80 || s.DelayMask != 0x20 || s.PerFlow || s.PeriodNs != uint64(50*time.Millisecond) {
		t.Errorf("dscp spec %+v", s)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "RFC 9341") {
		t.Errorf("a 50ms period: warnings %q", c.Warnings)
	}
	c, err = ParseMarkConfig("t.yaml", []byte("carrier: ipv6-altmark\nflowmon_id: 0x12345\nheader: hop-by-hop\nmtu: 1400\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := c.Spec(); s.PerFlow || s.FlowMonID != 0x12345 || !s.HopByHop || s.MTU != 1400 || s.Carrier != "ipv6-altmark" {
		t.Errorf("fixed-ID spec %+v", s)
	}
}

// Every bad field is named, with its line, all at once.
func TestMarkConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		yaml   string
		fields []string
	}{
		{"carrier: dscp\nperiod: 9ms\n", []string{"period"}},
		{"carrier: dscp\nperiod: 1500us\n", []string{"period"}},
		{"carrier: dscp\nperiod: soon\n", []string{"period"}},
		{"period: 1s\n", []string{"carrier"}},
		{"carrier: ecn\n", []string{"carrier"}},
		{"carrier: dscp\nstart_color: 2\n", []string{"start_color"}},
		{"carrier: dscp\ndscp_bits: [1, 1]\n", []string{"dscp_bits"}},
		{"carrier: dscp\ndscp_bits: [0, 6]\n", []string{"dscp_bits[1]"}},
		{"carrier: ipv6-altmark\ndscp_bits: [0, 1]\n", []string{"dscp_bits"}},
		{"carrier: dscp\nheader: hop-by-hop\n", []string{"header"}},
		{"carrier: ipv6-altmark\nheader: routing\n", []string{"header"}},
		{"carrier: ipv6-altmark\nflowmon_id: 0x100000\n", []string{"flowmon_id"}},
		{"carrier: ipv6-altmark\nflowmon_id: 5\nflowmon_range: 1-10\n", []string{"flowmon_range"}},
		{"carrier: ipv6-altmark\nflowmon_range: 10-1\n", []string{"flowmon_range"}},
		{"carrier: ipv6-altmark\nflowmon_range: 0-10\n", []string{"flowmon_range"}},
		{"carrier: dscp\nflowmon_id: 5\n", []string{"flowmon_id"}},
		{"carrier: ipv6-altmark\nmtu: 1000\n", []string{"mtu"}},
		{"carrier: dscp\nmtu: 1500\n", []string{"mtu"}},
		{"carrier: ipv4-flag\ndouble: {packets: 2}\n", []string{"double"}},
		{"carrier: dscp\ndouble: {packets: 0}\n", []string{"double.packets"}},
		{"carrier: dscp\ndouble: {}\n", []string{"double.packets"}},
		{"carrier: dscp\ndouble: {every: 2}\n", []string{"double.every", "double.packets"}},
		{"carrier: dscp\nbackbone: [198.18.0.0/24]\n", []string{"backbone"}},
		{"carrier: ipv4-flag\nbackbone: [fd00::/8]\n", []string{"backbone"}},
		{"carrier: ipv4-flag\nbackbone: [nowhere]\n", []string{"backbone"}},
		{"carrier: ipv4-flag\nbackbone: [198.18.1.5/24]\n", []string{"backbone"}},
		{"carrier: dscp\nselect: {dst: [300.1.1.1/8]}\n", []string{"select.dst"}},
		{"carrier: dscp\nselect: {protocols: [tcp, quic]}\n", []string{"select.protocols[1]"}},
		{"carrier: dscp\nselect: {protocols: []}\n", []string{"select.protocols"}},
		{"carrier: dscp\nselect: {dst_port: 90-80}\n", []string{"select.dst_port"}},
		{"carrier: dscp\nselect: {port: 80}\n", []string{"select.port"}},
		{"carrier: dscp\ncolour: 1\n", []string{"colour"}},
		{"carrier: dscp\nperiod: 1\nstart_color: x\nselect: {src_port: y}\n", []string{"period", "start_color", "select.src_port"}},
	} {
		_, err := ParseMarkConfig("t.yaml", []byte(tc.yaml))
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

// The command refuses bad input with exit code 2 naming the field or flag, before it attaches
// anything (no device is needed to get there).
func TestMarkCommandUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(bad, []byte("carrier: dscp\nperiod: 5ms\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte("carrier: dscp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"apply", "--dev", "lo"}, "needs --dev and --config"},
		{[]string{"apply", "--config", good}, "needs --dev and --config"},
		{[]string{"apply", "--dev", "lo", "--config", bad}, "bad.yaml:2: period"},
		{[]string{"apply", "--dev", "lo", "--config", filepath.Join(dir, "missing.yaml")}, "missing.yaml"},
		{[]string{"apply", "--dev", "fpnosuchdev0", "--config", good}, "--dev: interface \"fpnosuchdev0\""},
		{[]string{"remove"}, "needs --dev"},
		{[]string{"apply", "extra"}, "takes 0 argument"},
		{[]string{"extra"}, `unknown command "extra" for "flowplane altmark mark"`},
	} {
		_, err := runCLI(append([]string{"mark"}, tc.args...)...)
		if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: exit %d, %v; want 2 and %q", tc.args, cli.ExitCode(err), err, tc.want)
		}
	}
	if out, err := runCLI("mark", "apply", "--check", "--config", good); err != nil || !strings.Contains(out, "valid") {
		t.Errorf("--check: %v %q", err, out)
	}
}

// runCLI runs `flowplane altmark args...` under the binary's root.
func runCLI(args ...string) (string, error) {
	cmd := cli.Root("flowplane", "", Command())
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"altmark"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

func TestMarkCounterNames(t *testing.T) {
	t.Parallel()
	if len(markCounterNames) != int(markerMarkReasonMARK_REASON_MAX) {
		t.Errorf("%d counter names for %d reasons", len(markCounterNames), markerMarkReasonMARK_REASON_MAX)
	}
}

// A marker example and the probe example of its carrier are one measurement: the probe reads
// the marker's colors only with the same period, start color and bits.
func TestMarkExamplesMatchProbeExamples(t *testing.T) {
	t.Parallel()
	markers, _ := filepath.Glob("../../examples/marker-*.yaml")
	probes, _ := filepath.Glob("../../examples/altmark-*.yaml")
	for _, mf := range markers {
		m, err := LoadMarkConfig(mf)
		if err != nil {
			t.Fatal(err)
		}
		paired := false
		for _, pf := range probes {
			p, err := LoadConfig(pf)
			if err != nil {
				t.Fatal(err)
			}
			if p.Carrier != m.Carrier {
				continue
			}
			paired = true
			if p.Period != m.Period || p.StartColor != m.StartColor || !reflect.DeepEqual(p.DSCPBits, m.DSCPBits) ||
				!reflect.DeepEqual(p.Spec().Backbone, m.Backbone) {
				t.Errorf("%s and %s: period %v/%v, start_color %d/%d, dscp_bits %v/%v, backbone %v/%v differ",
					mf, pf, m.Period, p.Period, m.StartColor, p.StartColor, m.DSCPBits, p.DSCPBits, m.Backbone, p.Spec().Backbone)
			}
		}
		if !paired {
			t.Errorf("%s: no probe example with carrier %s", mf, m.Carrier)
		}
	}
}
