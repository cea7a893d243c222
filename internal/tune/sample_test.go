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
// last word of the rule set) and checks the kernel finds it, and that the rule before it in
// the same word, which matches the address but not the port, is skipped.
func TestLabManyRules(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	var b strings.Builder
	b.WriteString("profiles: {r: {congestion: reno}, n: {cwnd_clamp: 3}}\nrules:\n")
	for i := 0; i < 998; i++ {
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
