package tune

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/flowplane/flowplane/internal/lab/labtest"
)

// TestLabSampleArms opens 24 connections under a 50% sampled rule: each connection is tuned
// exactly when explain's flow hash puts it in the treated arm, and status counts both arms.
func TestLabSampleArms(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	pol, name := applyTest(t, `
profiles: {r: {congestion: reno}}
rules: [{match: {remote_port: 5901, direction: active, sample: 50%}, profile: r}]
`, cg)
	h1, h2 := labtest.Addr(t, l, "h1", "4"), labtest.Addr(t, l, "h2", "4")
	startHelper(t, l, "h2", cg, "hold-server", ":5901")
	const n = 24
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = net.JoinHostPort(h2, "5901")
	}
	startHelper(t, l, "h1", cg, "hold-client", addrs...)
	conns := ssAll(t, l, "h1", "dst "+h2+":5901")
	if len(conns) != n {
		t.Fatalf("%d connections, want %d", len(conns), n)
	}
	treated := 0
	for _, c := range conns {
		f := strings.Fields(c.line) // Recv-Q Send-Q local peer …
		local, err := netip.ParseAddrPort(f[2])
		if err != nil {
			t.Fatalf("local address in %q: %v", c.line, err)
		}
		m := pol.Match(Flow{Remote: netip.MustParseAddr(h2), RemotePort: 5901, Local: netip.MustParseAddr(h1), LocalPort: local.Port(), Dir: Active})
		if m.Treated != c.has("reno") {
			t.Errorf("port %d: explain says treated=%v, kernel applied reno=%v", local.Port(), m.Treated, c.has("reno"))
		}
		if m.Treated {
			treated++
		}
	}
	k, _ := HostKernel()
	st, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	if r := st.Rules[0]; int(r.Treated) != treated || int(r.SampledOut) != n-treated {
		t.Errorf("status arms treated %d sampled out %d, want %d and %d", r.Treated, r.SampledOut, treated, n-treated)
	}
	t.Logf("%d of %d connections treated", treated, n)
}

// TestLabManyRules puts the matching rule behind 999 that do not match (its bit lies in the
// last word of the rule set) and checks the kernel finds it, and that the rules with its
// address but another port, the set's first rule (word 0) and the one before it in the same
// word, are skipped: the scan goes from the first word to the last.
func TestLabManyRules(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	var b strings.Builder
	b.WriteString("profiles: {r: {congestion: reno}, n: {cwnd_clamp: 3}}\nrules:\n")
	b.WriteString("  - {match: {remote: 198.18.0.0/15, remote_port: 9998}, profile: n}\n")
	for i := 1; i < 998; i++ {
		fmt.Fprintf(&b, "  - {match: {remote: 10.%d.%d.0/24}, profile: n}\n", i/250, i%250)
	}
	b.WriteString("  - {match: {remote: 198.18.0.0/15, remote_port: 9999}, profile: n}\n")
	b.WriteString("  - {match: {remote: 198.18.0.0/15, remote_port: 5004}, profile: r}\n")
	_, name := applyTest(t, b.String(), cg)
	h2 := labtest.Addr(t, l, "h2", "4")
	startHelper(t, l, "h2", cg, "hold-server", ":5004")
	startHelper(t, l, "h1", cg, "hold-client", net.JoinHostPort(h2, "5004"))
	if c := ssFind(t, l, "h1", "dst "+h2+":5004"); !c.has("reno") || strings.Contains(c.line, "ssthresh:3 ") {
		t.Errorf("rule 999 not applied: %s", c.line)
	}
	k, _ := HostKernel()
	st, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rules[999].Treated != 1 || st.Counters["unmatched"] != 1 { // the passive side matches no rule
		t.Errorf("rule 999 hits %d, counters %v", st.Rules[999].Treated, st.Counters)
	}
}

// TestLabFirstByteSkip checks the path where the program answers without the trie: the
// rules' prefixes cover other first bytes than the lab's addresses (198.18.0.0/15, fd00::/8),
// so both ends of IPv4 and IPv6 connections get the catch-all rule, and a prefix shorter than
// /8 that covers the first byte still wins over it.
func TestLabFirstByteSkip(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	_, name := applyTest(t, `profiles: {r: {congestion: reno}, n: {cwnd_clamp: 3}}
rules:
  - {match: {remote: 10.0.0.0/8}, profile: n}
  - {match: {remote: "2001:db8::/32"}, profile: n}
  - {match: {remote: 192.0.0.0/5, remote_port: 5006}, profile: n}
  - {profile: r}
`, cg)
	h2v4, h2v6 := labtest.Addr(t, l, "h2", "4"), labtest.Addr(t, l, "h2", "6")
	startHelper(t, l, "h2", cg, "hold-server", ":5005", ":5006")
	startHelper(t, l, "h1", cg, "hold-client", net.JoinHostPort(h2v4, "5005"), net.JoinHostPort(h2v6, "5005"), net.JoinHostPort(h2v4, "5006"))
	for _, c := range []struct{ dst, want string }{{h2v4 + ":5005", "reno"}, {"[" + h2v6 + "]:5005", "reno"}, {h2v4 + ":5006", " cwnd:3 "}} {
		if got := ssFind(t, l, "h1", "dst "+c.dst); !strings.Contains(got.line, c.want) {
			t.Errorf("connection to %s: want %q: %s", c.dst, c.want, got.line)
		}
	}
	k, _ := HostKernel()
	st, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	// both ends of the two 5005 connections, and the passive end of the 5006 one (its remote
	// port is h1's)
	if st.Rules[3].Treated != 5 || st.Rules[2].Treated != 1 {
		t.Errorf("catch-all hits %d (want 5), 192.0.0.0/5 hits %d (want 1); counters %v", st.Rules[3].Treated, st.Rules[2].Treated, st.Counters)
	}
}

// TestLabMatchBothSides matches on remote and local prefixes at once, where the program may
// skip the bit-set scan: when both trie entries start with the same rule and it selects the
// flow, that rule wins at once; otherwise the scan must find the rule. The four connections
// take each path (h1 and h2 are the lab's hosts):
//
//	active  h1→h2:5011  entries start with rules 1 and 2 (differ): scan finds rule 2
//	active  h1→h2:5012  differ: scan passes rule 2 (port), finds rule 3
//	passive h2:5011     both start with rule 0, which selects: no scan
//	passive h2:5012     both start with rule 0, which does not (port): scan finds rule 4
func TestLabMatchBothSides(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	h1, h2 := labtest.Addr(t, l, "h1", "4"), labtest.Addr(t, l, "h2", "4")
	src := fmt.Sprintf(`
profiles: {r: {congestion: reno}, n: {cwnd_clamp: 7}, c: {cwnd_clamp: 3}}
rules:
  - {match: {remote: %[1]s/32, local: %[2]s/32, local_port: 5011, direction: passive}, profile: r}
  - {match: {remote: %[2]s/32, local: 10.9.0.0/16}, profile: c}
  - {match: {remote: %[2]s/32, local: %[1]s/32, remote_port: 5011}, profile: r}
  - {match: {local: %[1]s/32, remote_port: 5012}, profile: n}
  - {match: {remote: %[1]s/32, local: %[2]s/32, local_port: 5012, direction: passive}, profile: n}
`, h1, h2)
	pol, name := applyTest(t, src, cg)
	startHelper(t, l, "h2", cg, "hold-server", ":5011", ":5012")
	startHelper(t, l, "h1", cg, "hold-client", net.JoinHostPort(h2, "5011"), net.JoinHostPort(h2, "5012"))
	for _, c := range []struct {
		what, node, filter string
		flow               Flow
		rule               int
	}{
		{"active h1→h2:5011", "h1", "dst " + h2 + ":5011", Flow{Remote: mustAddr(h2), Local: mustAddr(h1), RemotePort: 5011, Dir: Active}, 2},
		{"active h1→h2:5012", "h1", "dst " + h2 + ":5012", Flow{Remote: mustAddr(h2), Local: mustAddr(h1), RemotePort: 5012, Dir: Active}, 3},
		{"passive h2:5011", "h2", "sport = :5011", Flow{Remote: mustAddr(h1), Local: mustAddr(h2), LocalPort: 5011, Dir: Passive}, 0},
		{"passive h2:5012", "h2", "sport = :5012", Flow{Remote: mustAddr(h1), Local: mustAddr(h2), LocalPort: 5012, Dir: Passive}, 4},
	} {
		if got := pol.Match(c.flow).Rule; got != c.rule {
			t.Fatalf("%s: explain matches rule %d, the test expects %d", c.what, got, c.rule)
		}
		conn := ssFind(t, l, c.node, c.filter)
		// the clamp holds cwnd (ss omits ssthresh under bbr)
		reno, cwnd := c.rule == 0 || c.rule == 2, conn.num(t, "cwnd")
		if conn.has("reno") != reno || (cwnd == 7) == reno || cwnd == 3 {
			t.Errorf("%s: want rule %d's profile (%s): %s", c.what, c.rule, map[bool]string{true: "reno", false: "cwnd_clamp 7"}[reno], conn.line)
		}
	}
	k, _ := HostKernel()
	st, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint64{1, 0, 1, 1, 1} {
		if st.Rules[i].Treated != want {
			t.Errorf("rule %d hits %d, want %d (counters %v)", i, st.Rules[i].Treated, want, st.Counters)
		}
	}
}
