package tune

import (
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/testenv"
)

// TestLabReactsToRetransmissions blackholes an established connection under a reactive rule:
// on its first retransmission the RETRANS callback (enabled only for this profile) switches it
// to reno with a clamp of 10, counted in status.
func TestLabReactsToRetransmissions(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	testenv.Need(t, "nft")
	cg := testCgroup(t)
	_, name := applyTest(t, `
profiles:
  r: {congestion: cubic, react: {retransmissions_above: 0, congestion: reno, cwnd_clamp: 10}}
rules: [{match: {remote_port: 5801}, profile: r}]
`, cg)
	c := blackholeUntilReno(t, l, cg, "5801")
	k, _ := HostKernel()
	st, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	if !c.has("reno") || st.Counters["reacted"] != 1 || st.Counters["retrans_callbacks"] == 0 {
		t.Errorf("after a retransmission want reno and one reaction: counters %v\n  ss: %s", st.Counters, c.line)
	}
	for _, s := range st.Settings {
		if (s.Setting == "react.congestion" || s.Setting == "react.cwnd_clamp") && (len(s.Errors) > 0 || s.Applied != 1) {
			t.Errorf("%s: applied %d, refused %+v; want applied once", s.Setting, s.Applied, s.Errors)
		}
		// The callbacks are switched on at establishment and off after the reaction.
		if s.Setting == "react.callbacks" && (len(s.Errors) > 0 || s.Applied != 2) {
			t.Errorf("react.callbacks: applied %d, refused %+v; want 2 (on, then off)", s.Applied, s.Errors)
		}
	}
}

// TestLabReactsToTimeouts blackholes an established connection: after more than one
// consecutive RTO the RTO callback (enabled only for this profile) switches it to reno.
func TestLabReactsToTimeouts(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	testenv.Need(t, "nft")
	cg := testCgroup(t)
	_, name := applyTest(t, `
profiles:
  r: {congestion: cubic, rto_min: 20ms, react: {timeouts_above: 1, congestion: reno}}
rules: [{match: {remote_port: 5802}, profile: r}]
`, cg)
	c := blackholeUntilReno(t, l, cg, "5802")
	k, _ := HostKernel()
	st, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	if !c.has("reno") || st.Counters["reacted"] != 1 || st.Counters["rto_callbacks"] < 2 {
		t.Errorf("after two timeouts want reno and one reaction: counters %v\n  ss: %s", st.Counters, c.line)
	}
}

// blackholeUntilReno opens a connection h1 → h2:port from cg, checks it starts on cubic, drops
// everything h2 receives on port and returns the connection once ss shows reno (or after 10 s,
// for the caller to report).
func blackholeUntilReno(t *testing.T, l *lab.Lab, cg, port string) ssConn {
	t.Helper()
	h2 := labtest.Addr(t, l, "h2", "4")
	startHelper(t, l, "h2", cg, "hold-server", ":"+port)
	startHelper(t, l, "h1", cg, "hold-client", h2+":"+port)
	if c := ssFind(t, l, "h1", "dst "+h2+":"+port); !c.has("cubic") {
		t.Fatalf("before the blackhole: %s", c.line)
	}
	nft(t, l, "h2", "tcp dport "+port+" drop")
	var c ssConn
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if c = ssFind(t, l, "h1", "dst "+h2+":"+port); c.has("reno") {
			break
		}
	}
	return c
}
