package tune

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

var testKernel = Kernel{HZ: 250, Congestion: []string{"reno", "cubic"}, WmemMax: 212992, RmemMax: 212992}

func mustParse(t *testing.T, src string) *Policy {
	t.Helper()
	p, err := Parse("p.yaml", []byte(src), testKernel)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return p
}

func TestParseExample(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../examples/tune-dc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse("tune-dc.yaml", data, testKernel)
	if err != nil {
		t.Fatal(err)
	}
	dc := p.Profiles[p.ProfileIndex("dc")]
	if dc.SynRTO != 12*time.Millisecond || dc.CwndClamp != 100 || dc.SndBuf != 150000 || dc.Congestion != "cubic" {
		t.Errorf("dc profile = %+v", dc)
	}
	if len(p.Warnings) == 0 || !strings.Contains(strings.Join(p.Warnings, "\n"), "autotuning") {
		t.Errorf("fixed buffers must warn about autotuning; warnings: %q", p.Warnings)
	}
}

func TestParseAllSettings(t *testing.T) {
	t.Parallel()
	p := mustParse(t, `
profiles:
  all:
    syn_rto: 1s
    init_rwnd: 40
    ecn: true
    snd_buf: 256KiB
    rcv_buf: 1MB
    init_cwnd: 10
    cwnd_clamp: 100
    congestion: reno
    rto_min: 8ms
    delack_max: 40ms
    rto_max: 5s
    max_pacing_rate: 1gbit
    mark: 0x10
    priority: 3
    tclass: 0x28
    notsent_lowat: 16KiB
    nodelay: true
    window_clamp: 64KiB
    mss: 1200
    keepalive: {idle: 30s, interval: 5s, count: 3}
    user_timeout: 10s
    react: {retransmissions_above: 5, congestion: cubic, cwnd_clamp: 10}
rules:
  - match: {remote: 10.0.0.0/8, remote_port: 443, local_port: 1024-65535, direction: active, sample: 10%}
    profile: all
`)
	pr := p.Profiles[0]
	if n := len(pr.Set); n != int(setMax) {
		var missing []string
		for s := Setting(0); s < setMax; s++ {
			if !pr.Set[s] {
				missing = append(missing, s.String())
			}
		}
		t.Errorf("%d settings set, want all %d; missing %v", n, setMax, missing)
	}
	if pr.MaxPacingRate != 125000000 || pr.RcvBuf != 1000000 || pr.SndBuf != 256*1024 || pr.TOS != 0x28 || pr.RTOMin != 8*time.Millisecond {
		t.Errorf("profile = %+v", pr)
	}
	r := p.Rules[0]
	if r.RemotePort != (PortRange{Lo: 443, Hi: 443}) || r.LocalPort != (PortRange{Lo: 1024, Hi: 65535}) || r.Dir != Active || r.Sample != 0.1 {
		t.Errorf("rule = %+v", r)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, src, want string }{
		{"unknown key", "profiles: {a: {cwnd: 3, bogus: 1}}\nrules: []", "p.yaml:1: profiles.a.bogus: unknown key \"bogus\""},
		{"ip route initcwnd", "profiles:\n  a:\n    initcwnd: 10\nrules: []", "p.yaml:3: profiles.a.initcwnd: is ip route's name; write init_cwnd"},
		{"ip route quickack", "profiles:\n  a:\n    quickack: 1\nrules: []", "quickack: cannot be set from BPF"},
		{"ip route rtt", "profiles: {a: {rtt: 1}}\nrules: []", "closest: syn_rto"},
		{"ip route ssthresh", "profiles: {a: {ssthresh: 1}}\nrules: []", "closest: cwnd_clamp"},
		{"ip route features", "profiles: {a: {features: ecn}}\nrules: []", "write ecn: true"},
		{"ip route mtu", "profiles: {a: {mtu: 1400}}\nrules: []", "closest: mss"},
		{"host bits", "profiles: {a: {}}\nrules:\n  - {profile: a, match: {remote: [198.18.1.5/24]}}", "p.yaml:3: rules[0].match.remote: 198.18.1.5/24 has host bits set; write 198.18.1.0/24 (the network) or 198.18.1.5/32 (the address)"},
		{"rto_min below kernel", "profiles:\n  a:\n    rto_min: 1ms\nrules: []", "p.yaml:3: profiles.a.rto_min: 1ms is outside the kernel's range 8ms to 200ms (CONFIG_HZ=250)"},
		{"rto_min above kernel", "profiles: {a: {rto_min: 300ms}}\nrules: []", "outside the kernel's range 8ms to 200ms"},
		{"delack range", "profiles: {a: {delack_max: 1s}}\nrules: []", "delack_max: 1s is outside"},
		{"congestion unknown", "profiles: {a: {congestion: dctcp}}\nrules: []", "\"dctcp\" is not in tcp_available_congestion_control (reno cubic)"},
		{"mss", "profiles: {a: {mss: 40}}\nrules: []", "mss: 40 (40 bytes) is outside the kernel's range 88 to 32767"},
		{"keepcnt", "profiles: {a: {keepalive: {count: 500}}}\nrules: []", "keepalive.count: \"500\" is not a whole number from 1 to 127"},
		{"bytes", "profiles: {a: {snd_buf: lots}}\nrules: []", "not a size in bytes"},
		{"bad prefix", "profiles: {a: {}}\nrules:\n  - match: {remote: 10.0.0/8}\n    profile: a", "p.yaml:3: rules[0].match.remote: \"10.0.0/8\" is not an address or prefix"},
		{"bad port", "profiles: {a: {}}\nrules:\n  - match: {remote_port: 9-1}\n    profile: a", "rules[0].match.remote_port: \"9-1\" is not a port range"},
		{"bad direction", "profiles: {a: {}}\nrules:\n  - match: {direction: sideways}\n    profile: a", "not a direction"},
		{"bad sample", "profiles: {a: {}}\nrules:\n  - match: {sample: 0%}\n    profile: a", "sample: \"0%\" is not a share"},
		{"no profile", "profiles: {a: {}}\nrules:\n  - match: {}\n    profile: b", "rules[0].profile: no profile named \"b\"; profiles: a"},
		{"missing profile", "profiles: {a: {}}\nrules:\n  - match: {}", "rules[0].profile: missing"},
		{"families", "profiles: {a: {}}\nrules:\n  - match: {remote: 10.0.0.0/8, local: fd00::/8}\n    profile: a", "different families"},
		{"react without action", "profiles: {a: {react: {retransmissions_above: 3}}}\nrules: []", "says when but not what"},
		{"syn_rto range", "profiles: {a: {syn_rto: 500s}}\nrules: []", "syn_rto: 8m20s is outside"},
		{"syn_rto too long for Go", "profiles: {a: {syn_rto: 3000000h}}\nrules: []", `syn_rto: "3000000h" is outside`},
		{"syn_rto bare number past 32 bits", "profiles: {a: {syn_rto: 4294967296}}\nrules: []", `syn_rto: "4294967296" is outside`},
		{"not yaml", "profiles: [", "not valid YAML"},
		{"empty", "", "the file is empty"},
		{"missing rules", "profiles: {a: {}}", "rules: missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tc.src), testKernel)
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("want Errors, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

func TestSynRTOJiffyWarning(t *testing.T) {
	t.Parallel()
	p := mustParse(t, "profiles: {a: {syn_rto: 10ms}}\nrules: [{profile: a}]")
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "the kernel uses 12ms") {
		t.Errorf("warnings = %q", p.Warnings)
	}
	if j := testKernel.Jiffies(10 * time.Millisecond); j != 3 {
		t.Errorf("10ms = %d jiffies at HZ=250, want 3", j)
	}
	// rto_min and delack_max are rounded up the same way (usecs_to_jiffies).
	p = mustParse(t, "profiles: {a: {rto_min: 10ms, delack_max: 9ms}}\nrules: [{profile: a}]")
	if w := strings.Join(p.Warnings, "\n"); len(p.Warnings) != 2 || !strings.Contains(w, "rto_min: 10ms") || !strings.Contains(w, "delack_max: 9ms") || !strings.Contains(w, "the kernel uses 12ms") {
		t.Errorf("warnings = %q", p.Warnings)
	}
	if p := mustParse(t, "profiles: {a: {rto_min: 20ms}}\nrules: [{profile: a}]"); len(p.Warnings) != 0 {
		t.Errorf("20ms is 5 jiffies at HZ=250, yet warnings = %q", p.Warnings)
	}
}

// TestEmptyRulesWarning: an empty rule list loads (a policy being written) and says that it
// tunes nothing.
func TestEmptyRulesWarning(t *testing.T) {
	t.Parallel()
	if p := mustParse(t, "profiles: {}\nrules: []"); len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "p.yaml:2: rules: empty: the policy tunes no connection") {
		t.Errorf("empty rules: warnings = %q", p.Warnings)
	}
}

const matchPolicy = `
profiles: {a: {}, b: {}, c: {}, d: {}}
rules:
  - match: {remote: [10.1.0.0/16, fd00:1::/32], remote_port: 443, direction: active}
    profile: a
  - match: {remote: 10.0.0.0/8, local: 10.9.0.0/16}
    profile: b
  - match: {local_port: 8000-8999, direction: passive}
    profile: c
  - match: {remote: 10.1.2.0/24, sample: 50%}
    profile: d
`

func TestMatchFirstWins(t *testing.T) {
	t.Parallel()
	p := mustParse(t, matchPolicy)
	a := netip.MustParseAddr
	for _, tc := range []struct {
		f    Flow
		want int
	}{
		{Flow{Remote: a("10.1.2.3"), RemotePort: 443, Dir: Active}, 0},
		{Flow{Remote: a("::ffff:10.1.2.3"), RemotePort: 443, Dir: Active}, 0}, // mapped counts as v4
		{Flow{Remote: a("fd00:1::5"), RemotePort: 443, Dir: Active}, 0},
		{Flow{Remote: a("10.1.2.3"), RemotePort: 443, Dir: Passive}, 3},
		{Flow{Remote: a("10.5.0.1"), Local: a("10.9.1.1"), Dir: Passive}, 1},
		{Flow{Remote: a("192.0.2.1"), LocalPort: 8080, Dir: Passive}, 2},
		{Flow{Remote: a("192.0.2.1"), LocalPort: 8080, Dir: Active}, -1},
		{Flow{Remote: a("fd00:2::1"), RemotePort: 443, Dir: Active}, -1},
	} {
		if got := p.Match(tc.f).Rule; got != tc.want {
			t.Errorf("%+v: rule %d, want %d", tc.f, got, tc.want)
		}
	}
}

// TestCompiledTablesAgree holds the LPM-trie and bit-set tables the program uses against the
// direct first-match semantics, on random flows and random policies.
func TestCompiledTablesAgree(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	// first bytes from a few values, prefixes from /4 on: the program skips the trie for an
	// address whose first byte no prefix covers (tune_side.octets), which lookup mirrors
	v4first, v6first := []int{8, 10, 11, 172}, []int{0xfc, 0xfd, 0x20}
	pfx := func(v4 bool) string { // masked: host bits are an error
		s := fmt.Sprintf("%x00:%x::/%d", v6first[rng.IntN(3)], rng.IntN(4), 5+rng.IntN(31))
		if v4 {
			s = fmt.Sprintf("%d.%d.%d.0/%d", v4first[rng.IntN(4)], rng.IntN(4), rng.IntN(4), 4+rng.IntN(21))
		}
		return netip.MustParsePrefix(s).Masked().String()
	}
	for iter := 0; iter < 40; iter++ {
		// every fourth policy has no local prefixes, remote prefixes, or neither: the program
		// then skips that side's trie (TUNE_*_ANY), which lookup mirrors
		noRemote, noLocal := iter%4 >= 2, iter%4 == 1 || iter%4 == 3
		var b strings.Builder
		b.WriteString("profiles: {a: {}}\nrules:\n")
		for i := 0; i < 1+rng.IntN(40); i++ {
			var m []string
			v4 := rng.IntN(2) == 0
			if !noRemote && rng.IntN(3) > 0 {
				m = append(m, "remote: "+pfx(v4))
			}
			if !noLocal && rng.IntN(3) == 0 {
				m = append(m, "local: "+pfx(v4))
			}
			if rng.IntN(3) == 0 {
				lo := rng.IntN(100)
				m = append(m, fmt.Sprintf("remote_port: %d-%d", lo, lo+rng.IntN(50)))
			}
			if rng.IntN(4) == 0 {
				m = append(m, "direction: "+[]string{"active", "passive"}[rng.IntN(2)])
			}
			fmt.Fprintf(&b, "  - match: {%s}\n    profile: a\n", strings.Join(m, ", "))
		}
		p, err := Parse("r.yaml", []byte(b.String()), testKernel)
		if err != nil {
			t.Fatal(err)
		}
		c := compile(p)
		for j := 0; j < 300; j++ {
			var f Flow
			if rng.IntN(2) == 0 {
				f.Remote = netip.AddrFrom4([4]byte{byte(v4first[rng.IntN(4)] + rng.IntN(2)), byte(rng.IntN(4)), byte(rng.IntN(4)), byte(rng.IntN(256))})
				f.Local = netip.AddrFrom4([4]byte{byte(v4first[rng.IntN(4)] + rng.IntN(2)), byte(rng.IntN(4)), byte(rng.IntN(4)), 1})
			} else {
				f.Remote = netip.AddrFrom16([16]byte{byte(v6first[rng.IntN(3)] + rng.IntN(2)), 0, 0, byte(rng.IntN(4)), 5: byte(rng.IntN(256)), 15: 1})
				f.Local = netip.AddrFrom16([16]byte{byte(v6first[rng.IntN(3)] + rng.IntN(2)), 0, 0, byte(rng.IntN(4)), 15: 2})
			}
			f.RemotePort, f.Dir = uint16(rng.IntN(160)), Direction(1+rng.IntN(2))
			if got, want := c.lookup(f), p.Match(f).Rule; got != want {
				t.Fatalf("policy\n%s\nflow %+v: tables give rule %d, first match is %d", b.String(), f, got, want)
			}
		}
	}
}

func TestSampleShare(t *testing.T) {
	t.Parallel()
	p := mustParse(t, "profiles: {a: {}}\nrules:\n  - match: {sample: 10%}\n    profile: a\n")
	treated := 0
	for port := 1; port <= 10000; port++ {
		if p.Match(Flow{Remote: netip.MustParseAddr("198.18.1.2"), RemotePort: 80, LocalPort: uint16(port), Dir: Active}).Treated {
			treated++
		}
	}
	if treated < 800 || treated > 1200 {
		t.Errorf("%d of 10000 flows treated with sample 10%%", treated)
	}
}

func TestTableSizesMatchProgram(t *testing.T) {
	t.Parallel()
	spec, err := loadTune()
	if err != nil {
		t.Fatal(err)
	}
	if n := spec.Maps["tune_rules"].MaxEntries; n != 2*maxRules {
		t.Errorf("tune_rules holds %d, Go assumes %d", n, 2*maxRules)
	}
	if n := spec.Maps["tune_profiles"].MaxEntries; n != 2*maxProfiles {
		t.Errorf("tune_profiles holds %d, Go assumes %d", n, 2*maxProfiles)
	}
	if n := spec.Maps["tune_applied"].MaxEntries; n != uint32(setMax) {
		t.Errorf("tune_applied holds %d settings, Go knows %d", n, setMax)
	}
}

// TestSettingClasses: every setting is made at exactly one place: a socket option
// (TUNE_SOCKET_SETTINGS, apply_socket), an established setting (TUNE_ESTABLISHED_SETTINGS,
// apply_established), a SYN-time reply, or a reaction. A profile without any of a class skips
// that call, so a setting in no class would never be made.
func TestSettingClasses(t *testing.T) {
	t.Parallel()
	synTime := map[Setting]bool{SetSynRTO: true, SetInitRwnd: true, SetECN: true}
	reaction := map[Setting]bool{SetReactCongestion: true, SetReactCwndClamp: true}
	for s := Setting(0); s < setMax; s++ {
		var in []string
		if socketOption(s) {
			in = append(in, "TUNE_SOCKET_SETTINGS")
		}
		if established(s) {
			in = append(in, "TUNE_ESTABLISHED_SETTINGS")
		}
		if synTime[s] {
			in = append(in, "SYN time")
		}
		if reaction[s] {
			in = append(in, "reaction")
		}
		if len(in) != 1 {
			t.Errorf("%s is in %v; want exactly one class", s, in)
		}
		if (settingNeed(s) == needSocket) != socketOption(s) {
			t.Errorf("%s: need bit %#x, socket option %v", s, settingNeed(s), socketOption(s))
		}
	}
	if tuneTuneSettingTUNE_SOCKET_SETTINGS>>setMax != 0 || tuneTuneSettingTUNE_ESTABLISHED_SETTINGS>>setMax != 0 {
		t.Errorf("a mask names a bit past TUNE_SET_MAX")
	}
}

// TestStatNames: every counter of enum tune_stat has its name in status.
func TestStatNames(t *testing.T) {
	t.Parallel()
	for s := tuneTuneStat(0); s < tuneTuneStatTUNE_STAT_MAX; s++ {
		if _, ok := statNames[s]; !ok {
			t.Errorf("tune_stat %d has no name in statNames", s)
		}
	}
	if len(statNames) != int(tuneTuneStatTUNE_STAT_MAX) {
		t.Errorf("%d stat names for %d counters", len(statNames), tuneTuneStatTUNE_STAT_MAX)
	}
}

func TestTooManyRules(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("profiles: {a: {}}\nrules:\n")
	for i := 0; i < 1025; i++ {
		fmt.Fprintf(&b, "  - {match: {remote_port: %d}, profile: a}\n", i)
	}
	if _, err := Parse("big.yaml", []byte(b.String()), testKernel); err == nil || !strings.Contains(err.Error(), "at most 1024") {
		t.Errorf("1025 rules: %v", err)
	}
}
