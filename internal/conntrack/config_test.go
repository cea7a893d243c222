package conntrack

import (
	"strings"
	"testing"
	"time"
)

func TestDecodeConfig(t *testing.T) {
	t.Parallel()
	c, err := decodeConfig("ct.yaml", []byte(`
mode: track
hook: tc
liberal: true
tcp_loose: false
timeouts: {tcp_established: 1h, udp_unreplied: "45"}
allow: {ports: [tcp/22, icmp], prefixes: [198.18.1.0/24]}
table: {confirmed: 1024, unconfirmed: 512}
`))
	if err != nil {
		t.Fatal(err)
	}
	c.Inside = []string{"in"}
	r, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if !r.trackOnly || r.hook != HookTC || !r.liberal || r.loose || r.confirmed != 1024 || r.embryonic != 512 ||
		len(r.ports) != 2 || len(r.prefixes) != 1 || r.timeouts[3] != uint32(time.Hour/time.Second) || r.timeouts[10] != 45 {
		t.Errorf("resolved %+v", r)
	}
	// A Config built in code, not read from a file, meets the same prefix rule.
	c.Allow.Prefixes = []string{"198.18.1.5/24"}
	if _, err := c.resolve(); err == nil || !strings.Contains(err.Error(), "has host bits set") {
		t.Errorf("resolve with host bits: %v", err)
	}
}

// Every problem of a file comes out at once, each with its line and field.
func TestDecodeConfigErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, yaml string
		want       []string
	}{
		{"empty", "", []string{"ct.yaml: the file is empty"}},
		{"not yaml", "mode: [", []string{"ct.yaml:1: not valid YAML"}},
		{"unknown key", "mode: track\nhooks: tc\n", []string{`ct.yaml:2: hooks: unknown key "hooks"; known keys here: allow, hook,`}},
		{"all at once", "mode: fast\nhook: nic\nliberal: maybe\n", []string{
			`ct.yaml:1: mode: "fast": want firewall or track`,
			`ct.yaml:2: hook: "nic": want auto, xdp or tc`,
			`ct.yaml:3: liberal: "maybe" is not true or false; write true, yes or on, or false, no or off`}},
		{"bool as a number", "liberal: 1\ntcp_loose: 0\n", []string{
			`ct.yaml:1: liberal: "1" is not true or false; write true, yes or on, or false, no or off`,
			`ct.yaml:2: tcp_loose: "0" is not true or false; write true, yes or on, or false, no or off`}},
		{"timeout", "timeouts:\n  tcp_established: 1.5s\n  tcp_nope: 1s\n", []string{
			"ct.yaml:2: timeouts.tcp_established: timeout tcp_established=1.5s: must be a whole number of seconds",
			`ct.yaml:3: timeouts.tcp_nope: unknown key "tcp_nope"`}},
		{"timeout range", "timeouts:\n  tcp_close: 99999999999\n  tcp_syn_sent: -5s\n  tcp_fin_wait: 2000000h\n" +
			"  udp_stream: soon\n  icmp: 999999999999999999999\n  udp_unreplied: 3000000h\n", []string{
			"ct.yaml:2: timeouts.tcp_close: timeout tcp_close=99999999999: too long; the most is 4294967295s",
			"ct.yaml:3: timeouts.tcp_syn_sent: timeout tcp_syn_sent=-5s: too short; the least is 1s",
			"ct.yaml:4: timeouts.tcp_fin_wait: timeout tcp_fin_wait=2000000h: too long; the most is 4294967295s",
			"ct.yaml:5: timeouts.udp_stream: timeout udp_stream=soon: not a duration; write e.g. 30s",
			"ct.yaml:6: timeouts.icmp: timeout icmp=999999999999999999999: too long",
			"ct.yaml:7: timeouts.udp_unreplied: timeout udp_unreplied=3000000h: too long; the most is 4294967295s"}},
		{"allow", "allow:\n  ports: [tcp/0, sctp/9, icmp/3]\n  prefixes: 198.18.0.0/15\n", []string{
			`ct.yaml:2: allow.ports[0]: allowed port "tcp/0": bad port`,
			`ct.yaml:2: allow.ports[1]: allowed port "sctp/9": want tcp/N, udp/N, icmp or icmpv6`,
			`ct.yaml:2: allow.ports[2]: allowed port "icmp/3": ICMP has no port`,
			"ct.yaml:3: allow.prefixes: must be a list"}},
		{"bad prefix", "allow: {prefixes: [198.18.0.0/33]}\n", []string{`ct.yaml:1: allow.prefixes[0]: "198.18.0.0/33" is not a prefix`}},
		{"host bits", "allow: {prefixes: [198.18.1.5/24, fd00::1/64]}\n", []string{
			"ct.yaml:1: allow.prefixes[0]: 198.18.1.5/24 has host bits set; write 198.18.1.0/24 (the network) or 198.18.1.5/32 (the address)",
			"ct.yaml:1: allow.prefixes[1]: fd00::1/64 has host bits set; write fd00::/64"}},
		{"table", "table: {confirmed: 0, unconfirmed: lots}\n", []string{
			`ct.yaml:1: table.confirmed: "0" is not a table size`,
			`ct.yaml:1: table.unconfirmed: "lots" is not a table size`}},
		{"table too large", "table: {unconfirmed: 99999999999}\n", []string{
			"ct.yaml:1: table.unconfirmed: 99999999999 entries: too many; the most is 4294967295"}},
		{"not a mapping", "- mode\n", []string{"ct.yaml:1: the top level must be a mapping"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := decodeConfig("ct.yaml", []byte(c.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(c.want) {
				t.Fatalf("got %d problems, want %d:\n%v", len(lines), len(c.want), err)
			}
			for i, w := range c.want {
				if !strings.HasPrefix(lines[i], w) {
					t.Errorf("problem %d:\n got %s\nwant %s…", i, lines[i], w)
				}
			}
		})
	}
}
