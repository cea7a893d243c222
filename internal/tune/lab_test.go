package tune

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/testenv"
)

// The test binary doubles as the helper processes the lab tests start inside namespaces and
// the tuned cgroup (sockets belong to the cgroup of the process that creates them).
const helperEnv = "FPTUNE_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		if err := helper(mode, os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helper(mode string, args []string) error {
	switch mode {
	case "hold-server": // echo every connection on each address given
		for _, a := range args {
			// KeepAlive -1: Go would otherwise set its own keepalive after accept and connect,
			// and the application's setsockopt wins over the policy's.
			ln, err := (&net.ListenConfig{KeepAlive: -1}).Listen(context.Background(), "tcp", a)
			if err != nil {
				return err
			}
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() { _, _ = io.Copy(c, c) }()
				}
			}()
		}
		fmt.Println("listening")
		select {}
	case "hold-client": // connect to each address and keep a trickle going so RTTs are sampled
		for _, a := range args {
			c, err := (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: -1}).Dial("tcp", a)
			if err != nil {
				return err
			}
			go func() {
				buf := make([]byte, 100)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}()
		}
		fmt.Println("connected")
		select {}
	case "connect-loop": // open and close connections until killed
		fmt.Println("looping")
		for {
			c, err := net.DialTimeout("tcp", args[0], 3*time.Second)
			if err == nil {
				c.Close()
			}
		}
	case "connect": // one connection attempt, whatever its outcome
		c, err := net.DialTimeout("tcp", args[0], 3*time.Second)
		if err == nil {
			c.Close()
		}
		return nil
	}
	return fmt.Errorf("unknown helper mode %q", mode)
}

// testCgroup creates a cgroup fp<unique> under the v2 root, removed at cleanup once empty.
func testCgroup(t *testing.T) string {
	t.Helper()
	root, err := cgroup.Mount()
	if err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	cg := filepath.Join(root, testenv.Name("tune"))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Helpers were killed in earlier cleanups; removeCgroup waits for them to leave.
		if err := cgroup.Remove(cg); err != nil {
			t.Error(err)
		}
	})
	return cg
}

// applyTest applies src as a policy instance of its own, removed at cleanup.
func applyTest(t *testing.T, src, cgroup string) (*Policy, string) {
	t.Helper()
	k, err := HostKernel()
	if err != nil {
		t.Fatal(err)
	}
	pol, err := Parse(t.Name()+".yaml", []byte(src), k)
	if err != nil {
		t.Fatal(err)
	}
	name := testenv.Name("tune")
	if _, err := Apply(pol, []byte(src), ApplyOptions{Name: name, Cgroup: cgroup}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Remove(name); err != nil {
			t.Error(err)
		}
	})
	return pol, name
}

// startHelper starts the test binary as a helper on node, inside cgroup, and waits for its
// first line of output; it is killed at cleanup.
func startHelper(t *testing.T, l *lab.Lab, node, cg, mode string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd, err := l.Command(ctx, node, os.Args[0], args...)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(cmd.Env, helperEnv+"="+mode)
	fd, err := cgroup.Into(cmd.Cmd, cg)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s helper on %s: %v", mode, node, err)
	}
	fd.Close()
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	line := make([]byte, 64)
	if _, err := out.Read(line); err != nil {
		t.Fatalf("%s helper on %s: %v", mode, node, err)
	}
}

const verifyPolicy = `
profiles:
  t:
    congestion: reno
    cwnd_clamp: 50
    rto_min: 20ms
    snd_buf: 90000
    rcv_buf: 100000
    mss: 1200
    init_cwnd: 20
    keepalive: {idle: 30s, interval: 5s, count: 3}
rules:
  - name: out
    match: {remote_port: 5001, direction: active}
    profile: t
  - name: in
    match: {local_port: 5002, direction: passive}
    profile: t
`

// waitStatus reads policy name's status until done says it holds what the test waits for (the
// kernel's callbacks run after the connections are up), for at most 10 s; it returns the last.
func waitStatus(t *testing.T, name string, done func(*Status) bool) *Status {
	t.Helper()
	k, err := HostKernel()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := ReadStatus(name, k)
		if err != nil {
			t.Fatal(err)
		}
		if done(st) || time.Now().After(deadline) {
			return st
		}
	}
}

// ssConn is one connection's `ss -tinmo` record.
type ssConn struct{ line string }

func (c ssConn) has(word string) bool {
	return regexp.MustCompile(`(^|[\s(,])` + regexp.QuoteMeta(word) + `($|[\s),])`).MatchString(c.line)
}

func (c ssConn) num(t *testing.T, key string) int {
	m := regexp.MustCompile(`(?:^|[\s(,])` + key + `:?(\d+)`).FindStringSubmatch(c.line)
	if m == nil {
		t.Fatalf("no %s in ss output: %s", key, c.line)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// rtt is ss's "rtt:SRTT/RTTVAR" in milliseconds.
func (c ssConn) rtt() (srtt, rttvar float64, ok bool) {
	m := regexp.MustCompile(`(?:^|\s)rtt:([0-9.]+)/([0-9.]+)`).FindStringSubmatch(c.line)
	if m == nil {
		return 0, 0, false
	}
	srtt, _ = strconv.ParseFloat(m[1], 64)
	rttvar, _ = strconv.ParseFloat(m[2], 64)
	return srtt, rttvar, true
}

// ssAll returns node's established connections matching filter (e.g. "dport = :5001"), one
// record per connection (ss prints a state line and an indented info line).
func ssAll(t *testing.T, l *lab.Lab, node, filter string) []ssConn {
	t.Helper()
	out := labtest.Run(t, l, node, "ss", "-Htinmo", "state", "established", filter)
	var conns []ssConn
	for _, line := range strings.Split(out, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		if line[0] != ' ' && line[0] != '\t' || len(conns) == 0 {
			conns = append(conns, ssConn{strings.Join(strings.Fields(line), " ")})
			continue
		}
		conns[len(conns)-1].line += " " + strings.Join(strings.Fields(line), " ")
	}
	return conns
}

// ssFind returns the one established connection on node matching filter.
func ssFind(t *testing.T, l *lab.Lab, node, filter string) ssConn {
	t.Helper()
	conns := ssAll(t, l, node, filter)
	if len(conns) != 1 {
		t.Fatalf("%d established connections on %s for %s, want 1: %v", len(conns), node, filter, conns)
	}
	return conns[0]
}

// TestLabAppliesSettings checks in `ss -tinmo` that connections a rule selects carry the
// requested congestion control, cwnd clamp, rto_min, buffers, MSS and keepalive, on active and
// passive opens, over IPv4 and IPv6, and that connections no rule selects are untouched.
func TestLabAppliesSettings(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	// The policy's congestion control must differ from the namespaces' default (the host's:
	// a namespace may set only the allowed ones): reno, or cubic where reno is the default.
	defaultCC := func(node string) string {
		return strings.TrimSpace(labtest.Run(t, l, node, "cat", "/proc/sys/net/ipv4/tcp_congestion_control"))
	}
	ccH1, ccH2 := defaultCC("h1"), defaultCC("h2")
	policyCC := "reno"
	if ccH1 == "reno" || ccH2 == "reno" {
		policyCC = "cubic"
	}
	cg := testCgroup(t)
	_, name := applyTest(t, strings.Replace(verifyPolicy, "congestion: reno", "congestion: "+policyCC, 1), cg)
	h2v4, h2v6 := labtest.Addr(t, l, "h2", "4"), labtest.Addr(t, l, "h2", "6")
	// Resolve IPv6 neighbours first: a SYN held up by neighbour discovery inflates the first
	// RTT estimate for seconds, and with it the RTO the rto_min check reads.
	labtest.Run(t, l, "h1", "ping", "-6", "-c1", "-W5", h2v6)
	startHelper(t, l, "h2", cg, "hold-server", ":5001", ":5002")
	startHelper(t, l, "h1", cg, "hold-client", net.JoinHostPort(h2v4, "5001"), net.JoinHostPort(h2v4, "5002"),
		net.JoinHostPort(h2v6, "5001"), net.JoinHostPort(h2v6, "5002"))
	tuned := func(c ssConn, active bool) (p []string) {
		if !c.has(policyCC) {
			p = append(p, "congestion control is not "+policyCC)
		}
		if got := c.num(t, "ssthresh"); got != 50 {
			p = append(p, fmt.Sprintf("ssthresh %d, want 50 (cwnd_clamp sets it)", got))
		}
		if rb, tb := c.num(t, "rb"), c.num(t, "tb"); rb != 200000 || tb != 180000 {
			p = append(p, fmt.Sprintf("buffers rb %d tb %d, want 200000 and 180000 (twice rcv_buf and snd_buf)", rb, tb))
		}
		// RTO = srtt + max(4·rttvar, rto_min). On a loaded machine srtt and rttvar alone can pass
		// 200ms (ss then may even omit rto, at 3s); only a connection whose own estimate stays
		// below 200ms can show whether the 20ms floor is in force: until it does, the poll below
		// goes on (RTT samples keep coming), and a connection that never does fails.
		if srtt, rttvar, ok := c.rtt(); ok && srtt+4*rttvar < 180 {
			if rto := c.num(t, "rto"); rto < 20 || rto >= 200 {
				p = append(p, fmt.Sprintf("rto %dms, want at least rto_min 20ms and below the default 200ms", rto))
			}
		} else {
			p = append(p, fmt.Sprintf("rtt %.1f/%.1f ms: too high to see the rto_min floor", srtt, rttvar))
		}
		if !strings.Contains(c.line, "timer:(keepalive,") {
			p = append(p, "no keepalive timer")
		} else if m := regexp.MustCompile(`keepalive,(\d+)sec`).FindStringSubmatch(c.line); m == nil || atoi(m[1]) <= 15 {
			p = append(p, "keepalive timer is not from idle 30s")
		}
		if active {
			// advmss is the MSS minus the timestamp option when timestamps are on.
			if mss := c.num(t, "advmss"); mss > 1200 || mss < 1188 {
				p = append(p, fmt.Sprintf("advmss %d, want 1200 (less 12 with timestamps)", mss))
			}
		}
		return p
	}
	untouched := func(cc string) func(c ssConn, _ bool) []string {
		return func(c ssConn, _ bool) (p []string) {
			if !c.has(cc) {
				p = append(p, "congestion control is not the default "+cc)
			}
			if strings.Contains(c.line, "ssthresh:50") || strings.Contains(c.line, "keepalive") || strings.Contains(c.line, "rb200000") {
				p = append(p, "tuned although no rule selects it")
			}
			if rto := c.num(t, "rto"); rto < 200 {
				p = append(p, fmt.Sprintf("rto %dms below the default minimum", rto))
			}
			return p
		}
	}
	h1v4 := labtest.Addr(t, l, "h1", "4")
	checks := []struct {
		what, node, filter string
		check              func(ssConn, bool) []string
		active             bool
	}{
		{"h1→h2:5001 active IPv4 (rule out)", "h1", "dst " + h2v4 + ":5001", tuned, true},
		{"h1→h2:5001 active IPv6 (rule out)", "h1", "dst [" + h2v6 + "]:5001", tuned, true},
		{"h2:5001 passive (no rule)", "h2", "sport = :5001 and dst " + h1v4, untouched(ccH2), false},
		{"h1→h2:5002 active (no rule)", "h1", "dst " + h2v4 + ":5002", untouched(ccH1), true},
		{"h2:5002 passive IPv4 (rule in)", "h2", "sport = :5002 and dst " + h1v4, tuned, false},
		{"h2:5002 passive IPv6 (rule in)", "h2", "sport = :5002 and dst [" + labtest.Addr(t, l, "h1", "6") + "]", tuned, false},
	}
	// RTO and timers settle as RTT samples arrive; poll each connection for up to 10 s.
	for _, c := range checks {
		var problems []string
		var last ssConn
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			last = ssFind(t, l, c.node, c.filter)
			if problems = c.check(last, c.active); len(problems) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(problems) > 0 {
			t.Errorf("%s: %s\n  ss: %s", c.what, strings.Join(problems, "; "), last.line)
		}
	}

	k, _ := HostKernel()
	st, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rules[0].Treated != 2 || st.Rules[1].Treated != 2 {
		t.Errorf("rule hits %+v, want out=2 in=2", st.Rules)
	}
	for _, s := range st.Settings {
		if len(s.Errors) > 0 {
			t.Errorf("kernel refused %s: %+v", s.Setting, s.Errors)
		}
	}
	t.Logf("status: %+v", st.Settings)
}

// TestLabReapplySwaps re-applies a changed policy: the attached program stays (same program and
// link), the generation flips, and new connections get the new values.
func TestLabReapplySwaps(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	_, name := applyTest(t, verifyPolicy, cg)
	k, _ := HostKernel()
	before, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(strings.Replace(verifyPolicy, "congestion: reno", "congestion: cubic", 1), "cwnd_clamp: 50", "cwnd_clamp: 40", 1)
	pol, err := Parse("v2.yaml", []byte(src), k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(pol, []byte(src), ApplyOptions{Name: name, Cgroup: cg}); err != nil {
		t.Fatal(err)
	}
	after, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	if after.ProgramID != before.ProgramID || after.LinkID != before.LinkID || after.Generation == before.Generation {
		t.Errorf("re-apply: program %d→%d link %d→%d generation %d→%d; want the same program and link, a new generation",
			before.ProgramID, after.ProgramID, before.LinkID, after.LinkID, before.Generation, after.Generation)
	}
	h2 := labtest.Addr(t, l, "h2", "4")
	startHelper(t, l, "h2", cg, "hold-server", ":5001")
	startHelper(t, l, "h1", cg, "hold-client", net.JoinHostPort(h2, "5001"))
	c := ssFind(t, l, "h1", "dst "+h2+":5001")
	// cubic's HyStart may lower ssthresh below the clamp, never raise it.
	if !c.has("cubic") || !strings.Contains(c.line, "ssthresh:") || c.num(t, "ssthresh") > 40 {
		t.Errorf("after re-apply want cubic with the new clamp 40: %s", c.line)
	}
}

func TestLabExplainMatchesKernel(t *testing.T) {
	testenv.Privileged(t)
	k, err := HostKernel()
	if err != nil {
		t.Fatal(err)
	}
	pol, err := Parse("v.yaml", []byte(verifyPolicy), k)
	if err != nil {
		t.Fatal(err)
	}
	e := Explain(pol, Flow{Remote: mustAddr("198.18.1.2"), RemotePort: 5001, Dir: Active}, k)
	if e.Rule == nil || e.Rule.Name != "out" {
		t.Fatalf("explain picked %+v", e.Rule)
	}
	var b strings.Builder
	e.Print(&b, false)
	for _, want := range []string{"rule 0 (out", "TCP_CONGESTION \"reno\"", "TCP_BPF_RTO_MIN 20000 µs = 5 jiffies", "sk_sndbuf = 180000"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("explain output lacks %q:\n%s", want, b.String())
		}
	}
	if e := Explain(pol, Flow{Remote: mustAddr("198.18.1.2"), RemotePort: 5001, Dir: Passive}, k); e.Rule != nil {
		t.Errorf("passive to port 5001 should match nothing, got %s", e.Rule.Name)
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// TestLabReapplyNoUntunedWindow re-applies two alternating policies (both select every
// connection) 20 times while connections open continuously: no connection may fall between
// them (unmatched stays 0), the program is never detached, and the last swap leaves no prefix
// of the policy it replaced in the tries (b's 10.0.0.0/8).
func TestLabReapplyNoUntunedWindow(t *testing.T) {
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	a := "profiles: {a: {init_cwnd: 12}}\nrules: [{profile: a}]\n"
	b := "profiles: {b: {init_cwnd: 14, syn_rto: 200ms}, c: {}}\nrules: [{match: {remote: 10.0.0.0/8}, profile: c}, {profile: b}]\n"
	_, name := applyTest(t, a, cg)
	k, _ := HostKernel()
	first, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	startHelper(t, l, "h2", cg, "hold-server", ":5003")
	startHelper(t, l, "h1", cg, "connect-loop", net.JoinHostPort(labtest.Addr(t, l, "h2", "4"), "5003"))
	opened := func(st *Status) uint64 { return st.Counters["active"] + st.Counters["passive"] }
	var opens uint64
	for i := 0; i < 20; i++ {
		src := []string{b, a}[i%2]
		pol, err := Parse("swap.yaml", []byte(src), k)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Apply(pol, []byte(src), ApplyOptions{Name: name, Cgroup: cg}); err != nil {
			t.Fatal(err)
		}
		// Let a connection open under this policy before the next swap, however slow the machine.
		since := opens
		opens = opened(waitStatus(t, name, func(st *Status) bool { return opened(st) > since }))
	}
	st, err := ReadStatus(name, k)
	if err != nil {
		t.Fatal(err)
	}
	if st.ProgramID != first.ProgramID || st.LinkID != first.LinkID {
		t.Errorf("program or link changed across re-applies")
	}
	if st.Counters["unmatched"] != 0 || opened(st) < 20 {
		t.Errorf("counters %v: want no unmatched connection among many", st.Counters)
	}
	// after each swap the old policy's prefixes leave the tries: only the live one's remain
	m, err := openPinned(name)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var key tuneTuneLpmKey
	var v tuneTuneRuleset
	for _, trie := range []*ebpf.Map{m.TuneRemote, m.TuneLocal} {
		for it := trie.Iterate(); it.Next(&key, &v); {
			if uint32(key.Gen) != st.Generation {
				t.Errorf("trie %s holds a prefix of generation %d; %d is live", trie, key.Gen, st.Generation)
			}
		}
	}
	t.Logf("%d opens across 20 re-applies, none untuned", opened(st))
}
