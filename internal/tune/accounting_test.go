package tune

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/match"
	"github.com/flowplane/flowplane/internal/testenv"
)

const allSettingsPolicy = `
profiles:
  all:
    syn_rto: 200ms
    init_rwnd: 20
    ecn: true
    snd_buf: 100000
    rcv_buf: 100000
    init_cwnd: 16
    cwnd_clamp: 80
    congestion: cubic
    rto_min: 40ms
    delack_max: 20ms
    rto_max: 10s
    max_pacing_rate: 500mbit
    mark: 7
    priority: 2
    tos: 0x20
    notsent_lowat: 64KiB
    nodelay: true
    window_clamp: 200000
    mss: 1300
    keepalive: {idle: 40s, interval: 4s, count: 4}
    user_timeout: 30s
    react: {retransmissions_above: 1000, congestion: reno, cwnd_clamp: 10}
rules:
  - {match: {remote_port: 5701}, profile: all}
  - {match: {local_port: 5701}, profile: all}
`

// TestLabEverySettingAccounted applies every setting on active and passive opens and checks
// that each one shows up in status as applied or refused with an errno: the kernel's answer is
// never lost.
func TestLabEverySettingAccounted(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	pol, name := applyTest(t, allSettingsPolicy, cg)
	h2 := labtest.Addr(t, l, "h2", "4")
	startHelper(t, l, "h2", cg, "hold-server", ":5701")
	startHelper(t, l, "h1", cg, "hold-client", net.JoinHostPort(h2, "5701"))
	var got map[string]SettingStatus
	st := waitStatus(t, name, func(st *Status) bool {
		got = map[string]SettingStatus{}
		for _, s := range st.Settings {
			got[s.Setting] = s
		}
		for s := range pol.Profiles[0].Set {
			if _, ok := got[s.String()]; !ok && s != SetReactCongestion && s != SetReactCwndClamp {
				return false
			}
		}
		return st.Counters["matched"] >= 2
	})
	for s := range pol.Profiles[0].Set {
		if s == SetReactCongestion || s == SetReactCwndClamp {
			continue // fire only after retransmissions; the RETRANS flag is counted under react.congestion
		}
		ss, ok := got[s.String()]
		if !ok {
			t.Errorf("%s: neither applied nor refused", s)
			continue
		}
		if len(ss.Errors) > 0 {
			t.Logf("%s: applied %d, refused %+v", s, ss.Applied, ss.Errors)
		}
	}
	if st.Counters["matched"] != 2 {
		t.Errorf("counters %v, want 2 matched connections", st.Counters)
	}
}

// TestLabCoexistsWithParentProgram applies one policy to a parent cgroup and one to a child:
// the child's status names the parent's program, and the child's settings still apply.
func TestLabCoexistsWithParentProgram(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	parent := testCgroup(t)
	child := filepath.Join(parent, "fpchild")
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 100 && os.Remove(child) != nil; i++ {
			time.Sleep(50 * time.Millisecond)
		}
	})
	applyTest(t, "profiles: {p: {init_cwnd: 12}}\nrules: [{profile: p}]\n", parent)
	_, name := applyTest(t, verifyPolicy, child)
	k, _ := HostKernel()
	st, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.OtherSockOp) != 1 {
		t.Errorf("child status lists other sock_ops programs %+v, want the parent's", st.OtherSockOp)
	}
	h2 := labtest.Addr(t, l, "h2", "4")
	startHelper(t, l, "h2", child, "hold-server", ":5001")
	startHelper(t, l, "h1", child, "hold-client", net.JoinHostPort(h2, "5001"))
	c := ssFind(t, l, "h1", "dst "+h2+":5001")
	if !c.has("reno") || c.num(t, "ssthresh") != 50 {
		t.Errorf("child policy not applied under a parent program: %s", c.line)
	}
	_ = testenv.Name
}

// TestLabRefusalsCounted bypasses validation with values the kernel refuses (rto_min below
// TCP_TIMEOUT_MIN, an unknown congestion control): status counts each refusal with its errno
// and the connection still opens (the program returns 1 whatever happens).
func TestLabRefusalsCounted(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	k, err := HostKernel()
	if err != nil {
		t.Fatal(err)
	}
	pol := &Policy{File: "refused.yaml",
		Profiles: []*Profile{{Name: "bad", Set: map[Setting]bool{SetRTOMin: true, SetCongestion: true},
			RTOMin: time.Microsecond, Congestion: "nosuchcc"}},
		Rules: []*Rule{{Name: "all", RemotePort: PortRange{Lo: 5702, Hi: 5702}, LocalPort: match.AnyPort, Dir: Active, Sample: 1, Profile: "bad", profile: 0}},
	}
	// The record keeps a source that validates, so status can re-read it.
	src := "profiles: {bad: {}}\nrules: [{match: {remote_port: 5702, direction: active}, profile: bad}]\n"
	name := testenv.Name("tune")
	if _, err := Apply(pol, []byte(src), ApplyOptions{Name: name, Cgroup: cg}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Remove(name) })
	h2 := labtest.Addr(t, l, "h2", "4")
	startHelper(t, l, "h2", cg, "hold-server", ":5702")
	startHelper(t, l, "h1", cg, "hold-client", net.JoinHostPort(h2, "5702"))
	st, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	refused := map[string]string{}
	for _, s := range st.Settings {
		for _, e := range s.Errors {
			refused[s.Setting] += e.Name
		}
	}
	if refused["rto_min"] != "EINVAL" || refused["congestion"] != "ENOENT" {
		t.Errorf("refusals %v, want rto_min EINVAL and congestion ENOENT (settings %+v)", refused, st.Settings)
	}
}

// TestLabInitCwndAtDefaultCounted gives both ends init_cwnd 10, the kernel's default initial
// window: the program skips the TCP_BPF_IW call when snd_cwnd already holds the value (before
// any data), and must still count the setting as applied on each connection.
func TestLabInitCwndAtDefaultCounted(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	_, name := applyTest(t, "profiles: {p: {init_cwnd: 10}}\nrules:\n  - {match: {remote_port: 5702}, profile: p}\n  - {match: {local_port: 5702}, profile: p}\n", cg)
	h2 := labtest.Addr(t, l, "h2", "4")
	startHelper(t, l, "h2", cg, "hold-server", ":5702")
	startHelper(t, l, "h1", cg, "hold-client", net.JoinHostPort(h2, "5702"))
	st := waitStatus(t, name, func(st *Status) bool {
		for _, s := range st.Settings {
			if s.Setting == SetInitCwnd.String() && s.Applied+uint64(len(s.Errors)) >= 2 {
				return st.Counters["matched"] >= 2
			}
		}
		return false
	})
	var found bool
	for _, s := range st.Settings {
		if s.Setting != SetInitCwnd.String() {
			continue
		}
		found = true
		if s.Applied != 2 || len(s.Errors) > 0 {
			t.Errorf("init_cwnd applied %d, refused %+v; want 2 applied, none refused", s.Applied, s.Errors)
		}
	}
	if !found {
		t.Errorf("init_cwnd neither applied nor refused: %+v", st.Settings)
	}
	if st.Counters["matched"] != 2 {
		t.Errorf("counters %v, want 2 matched connections", st.Counters)
	}
}
