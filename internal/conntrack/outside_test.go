package conntrack

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// Tests of conntrack outside the lab, as a user meets it: namespaces made with `ip netns add`,
// veths with `ip link`, nobody preparing anything, and the flowplane binary started by the
// usual launchers.

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// TestMain removes the binary flowplaneBin built (a 28-MB directory per run otherwise).
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// flowplaneBin builds cmd/flowplane once per test binary, into a directory TestMain removes.
func flowplaneBin(t *testing.T) string {
	t.Helper()
	testenv.Need(t, "go")
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fpctbin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "flowplane")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/flowplane/flowplane/cmd/flowplane").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// plainNet is A — R — B made by hand: three `ip netns add` namespaces, two veth pairs, IPv4
// forwarding on in R. Everything is named fp<suffix> and removed in t.Cleanup.
type plainNet struct {
	A, R, B      string // namespaces
	RA, RB       string // R's interfaces (towards A, towards B)
	PA, PB       string // the peers, in A and B
	AddrA, AddrB string
}

func newPlainNet(t *testing.T) *plainNet {
	t.Helper()
	testenv.Need(t, "ip")
	s := strings.TrimPrefix(testenv.Name(""), "fp")
	n := &plainNet{A: "fpA" + s, R: "fpR" + s, B: "fpB" + s, RA: "fpra" + s, RB: "fprb" + s, PA: "fpa" + s, PB: "fpb" + s,
		AddrA: "198.18.20.2", AddrB: "198.18.21.2"}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{n.A, n.R, n.B} {
		ip("netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		ip("-n", ns, "link", "set", "lo", "up")
	}
	ip("link", "add", n.PA, "netns", n.A, "type", "veth", "peer", "name", n.RA, "netns", n.R)
	ip("link", "add", n.PB, "netns", n.B, "type", "veth", "peer", "name", n.RB, "netns", n.R)
	for _, x := range []struct{ ns, dev, addr, gw string }{
		{n.A, n.PA, n.AddrA + "/24", "198.18.20.1"}, {n.B, n.PB, n.AddrB + "/24", "198.18.21.1"},
		{n.R, n.RA, "198.18.20.1/24", ""}, {n.R, n.RB, "198.18.21.1/24", ""},
	} {
		ip("-n", x.ns, "addr", "add", x.addr, "dev", x.dev)
		ip("-n", x.ns, "link", "set", x.dev, "up")
		if x.gw != "" {
			ip("-n", x.ns, "route", "add", "default", "via", x.gw)
		}
	}
	if err := nsrun.Do(n.R, func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
		t.Fatal(err)
	}
	return n
}

// launcher runs the flowplane binary in a network namespace the way a user would.
type launcher struct {
	name string
	argv func(bin, ns string, args ...string) []string
}

var launchers = []launcher{
	{"ip netns exec", func(bin, ns string, args ...string) []string {
		return append([]string{"ip", "netns", "exec", ns, bin}, args...)
	}},
	{"nsenter --net", func(bin, ns string, args ...string) []string {
		return append([]string{"nsenter", "--net=" + nsrun.Path(ns), bin}, args...)
	}},
	// A container runtime's view: a mount namespace of its own with a fresh /sys, so
	// /sys/fs/bpf is an empty sysfs directory.
	{"unshare -m, fresh /sys", func(bin, ns string, args ...string) []string {
		return append([]string{"nsenter", "--net=" + nsrun.Path(ns), "unshare", "-m", "--propagation", "private",
			"sh", "-c", `mount -t sysfs sysfs /sys && exec "$0" "$@"`, bin}, args...)
	}},
}

// ctl runs a short flowplane command and returns its stdout and exit code.
func ctl(t *testing.T, l launcher, bin, ns string, args ...string) (string, int) {
	t.Helper()
	argv := l.argv(bin, ns, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", l.name, err)
	}
	if code != 0 {
		t.Logf("%s flowplane %s: exit %d: %s", l.name, strings.Join(args, " "), code, stderr.String())
	}
	return stdout.String(), code
}

// ctRun is a `flowplane conntrack run` process.
type ctRun struct {
	cmd  *exec.Cmd
	log  *bytes.Buffer
	mu   sync.Mutex
	done chan error
}

// startRun starts `conntrack run` with l and waits until it is attached.
func startRun(t *testing.T, l launcher, bin, ns string, args ...string) *ctRun {
	t.Helper()
	argv := l.argv(bin, ns, append([]string{"conntrack", "run"}, args...)...)
	r := &ctRun{cmd: exec.Command(argv[0], argv[1:]...), log: &bytes.Buffer{}, done: make(chan error, 1)}
	pr, pw := io.Pipe()
	r.cmd.Stderr = pw
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready, scanned := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			r.mu.Lock()
			r.log.WriteString(sc.Text() + "\n")
			r.mu.Unlock()
			if strings.Contains(sc.Text(), "conntrack running") {
				once.Do(func() { close(ready) })
			}
		}
	}()
	go func() { r.done <- r.cmd.Wait(); pw.Close() }()
	t.Cleanup(func() { r.stop(t) })
	select {
	case <-ready:
	case err := <-r.done:
		r.done <- err
		<-scanned
		t.Fatalf("%s conntrack run exited: %v\n%s", l.name, err, r.output())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s conntrack run not attached after 60 s:\n%s", l.name, r.output())
	}
	return r
}

func (r *ctRun) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.String()
}

// stop sends SIGINT (as Ctrl-C) and waits for the process to detach and exit.
func (r *ctRun) stop(t *testing.T) {
	if r.cmd.ProcessState != nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("conntrack run: %v\n%s", err, r.output())
		}
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		t.Errorf("conntrack run did not exit on SIGINT:\n%s", r.output())
	}
}

// udpFrom sends one datagram from namespace ns to addr.
func udpFrom(t *testing.T, ns, addr string) {
	t.Helper()
	if err := nsrun.Do(ns, func() error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("fp"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func listJSON(t *testing.T, l launcher, bin, ns string) []Entry {
	t.Helper()
	out, code := ctl(t, l, bin, ns, "conntrack", "list", "--json")
	if code != 0 {
		t.Fatalf("%s conntrack list: exit %d", l.name, code)
	}
	var es []Entry
	if err := json.Unmarshal([]byte(out), &es); err != nil {
		t.Fatalf("%s conntrack list --json: %v\n%s", l.name, err, out)
	}
	return es
}

func udpPorts(es []Entry) map[uint16]bool {
	m := map[uint16]bool{}
	for _, e := range es {
		if e.Proto == "udp" {
			m[e.Orig.Dport] = true
		}
	}
	return m
}

// TestLaunchers: one instance per network namespace whoever starts it, on hand-made
// namespaces (see launcherRounds).
func TestLaunchers(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "nsenter", "unshare")
	bin := flowplaneBin(t)
	n := newPlainNet(t)
	launcherRounds(t, bin, launchers, n.R, n.A, []string{"--inside", n.RA, "--outside", n.RB},
		func(port int) { udpFrom(t, n.A, fmt.Sprintf("%s:%d", n.AddrB, port)) })
}

// TestLaunchersLab adds `flowplane lab exec` to the launchers, on a lab's router (whose
// namespace is a named one like any other).
func TestLaunchersLab(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "nsenter", "unshare")
	bin := flowplaneBin(t)
	l := labtest.Up(t, labtest.HostRouterHost)
	r1, h1 := l.Topology.Node("r1"), l.Topology.Node("h1")
	labExec := launcher{"flowplane lab exec", func(bin, ns string, args ...string) []string {
		node := strings.TrimPrefix(ns, "fp-"+l.Name()+"-")
		return append([]string{bin, "lab", "exec", l.Name(), node, "--", bin}, args...)
	}}
	ls := append([]launcher{labExec}, launchers...)
	h2 := labtest.Addr(t, l, "h2", "4")
	launcherRounds(t, bin, ls, l.Netns("r1"), l.Netns(h1.Name), []string{"--inside", l.IfName(r1.Ifaces[0]), "--outside", l.IfName(r1.Ifaces[1])},
		func(port int) { udpFrom(t, l.Netns("h1"), fmt.Sprintf("%s:%d", h2, port)) })
}

// launcherRounds: round i starts `run` in namespace r with launcher i, opens a UDP flow
// (send), lists with launcher i+1 (which must see the flows of every earlier round: the table
// survived each restart), reads status with launcher i+2 and stops `run`, after which the
// table is still listed. Then status says no run is attached, timeout sets two timeouts, flush
// from one launcher empties the table another lists, list in namespace empty (no instance)
// exits 2 from every launcher, remove removes the tables and a second remove exits 2.
func launcherRounds(t *testing.T, bin string, ls []launcher, r, empty string, args []string, send func(port int)) {
	t.Cleanup(func() {
		_ = nsrun.Do(r, func() error {
			inst, err := Instance()
			if err != nil {
				return err
			}
			return unpinInstance(inst)
		})
	})
	want := map[uint16]bool{}
	for i, l := range ls {
		other, third := ls[(i+1)%len(ls)], ls[(i+2)%len(ls)]
		runArgs, mode := append(args, "--timeout", "udp_unreplied=10m"), "firewall"
		if i == len(ls)-1 { // status shows the run's mode
			runArgs, mode = append(runArgs, "--mode", "track"), "track"
		}
		run := startRun(t, l, bin, r, runArgs...)
		port := uint16(7000 + i)
		send(int(port))
		want[port] = true
		var got map[uint16]bool
		deadline := time.Now().Add(5 * time.Second)
		for got = udpPorts(listJSON(t, other, bin, r)); len(got) < len(want) && time.Now().Before(deadline); got = udpPorts(listJSON(t, other, bin, r)) {
			time.Sleep(100 * time.Millisecond)
		}
		for p := range want {
			if !got[p] {
				t.Errorf("round %d (run by %s): list by %s misses the flow to port %d (got %v)", i, l.name, other.name, p, got)
			}
		}
		out, code := ctl(t, third, bin, r, "conntrack", "status", "--json")
		var st struct {
			Running    bool        `json:"running"`
			Mode       string      `json:"mode"`
			Interfaces []IfaceHook `json:"interfaces"`
			Entries    map[string]int
			Capacity   map[string]int
		}
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("round %d: status by %s: exit %d, %s", i, third.name, code, out)
		}
		if !st.Running || st.Mode != mode || len(st.Interfaces) != 2 || st.Entries["unconfirmed"] < len(want) ||
			st.Capacity["confirmed"] <= 0 || st.Capacity["unconfirmed"] <= 0 {
			t.Errorf("round %d: status by %s: %s", i, third.name, out)
		}
		if i == 0 { // remove under a run is refused, its tables kept
			if _, code := ctl(t, third, bin, r, "conntrack", "remove"); code != 2 {
				t.Errorf("remove by %s under a run: exit %d, want 2", third.name, code)
			}
			if _, code := ctl(t, other, bin, r, "conntrack", "status"); code != 0 {
				t.Errorf("status after a refused remove: exit %d", code)
			}
		}
		run.stop(t)
		if got := udpPorts(listJSON(t, third, bin, r)); len(got) != len(want) {
			t.Errorf("round %d: after run (%s) stopped, list by %s: %v, want %v", i, l.name, third.name, got, want)
		}
	}
	out, code := ctl(t, ls[1], bin, r, "conntrack", "status", "--json")
	var st Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Running {
		t.Errorf("status with no run attached: exit %d, %s", code, out)
	}
	if out, code := ctl(t, ls[0], bin, r, "conntrack", "timeout", "udp_stream=2m", "icmp=10s"); code != 0 || out != "conntrack: set timeout udp_stream=2m0s icmp=10s\n" {
		t.Errorf("timeout: exit %d, %q", code, out)
	}
	if out, code := ctl(t, ls[2], bin, r, "conntrack", "flush"); code != 0 || out != fmt.Sprintf("conntrack: flushed %d connections\n", len(want)) {
		t.Errorf("flush: exit %d, %q", code, out)
	}
	if es := listJSON(t, ls[0], bin, r); len(es) != 0 {
		t.Errorf("list after flush: %v", es)
	}
	for _, l := range ls {
		if _, code := ctl(t, l, bin, empty, "conntrack", "list"); code != 2 {
			t.Errorf("%s: list in a namespace without an instance: exit %d, want 2", l.name, code)
		}
	}
	if out, code := ctl(t, ls[1], bin, r, "conntrack", "remove"); code != 0 || !strings.HasPrefix(out, "conntrack: removed the tables of this network namespace") {
		t.Errorf("remove: exit %d, %q", code, out)
	}
	if _, code := ctl(t, ls[2], bin, r, "conntrack", "remove"); code != 2 {
		t.Errorf("second remove: exit %d, want 2", code)
	}
}

// echoThrough opens a TCP connection from A to an echo server on B and checks the echo.
func (n *plainNet) echoThrough(t *testing.T, port int) error {
	t.Helper()
	var ln net.Listener
	if err := nsrun.Do(n.B, func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf("%s:%d", n.AddrB, port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	return nsrun.Do(n.A, func() error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		msg := bytes.Repeat([]byte("flowplane"), 1000)
		if _, err := c.Write(msg); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return fmt.Errorf("read echo: %w", err)
		}
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("echo differs")
		}
		return nil
	})
}

// unsolicited tries a TCP connection from B to A (nothing listens; the router must drop the
// SYN, so the dial times out instead of being refused by A's RST).
func (n *plainNet) unsolicited(t *testing.T) error {
	return nsrun.Do(n.B, func() error {
		c, err := net.DialTimeout("tcp", n.AddrA+":9", time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func hooksOf(t *testing.T, bin string, n *plainNet) map[string]string {
	t.Helper()
	out, code := ctl(t, launchers[0], bin, n.R, "conntrack", "status", "--json")
	var st struct {
		Interfaces []IfaceHook `json:"interfaces"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status: exit %d, %s", code, out)
	}
	m := map[string]string{}
	for _, h := range st.Interfaces {
		m[h.Interface] = h.Hook
	}
	return m
}

// TestHookAuto: on veths nobody prepared, the default hook forwards (tc where XDP would
// blackhole), --hook xdp is refused with exit 2 and says what to change, and as the peers are
// prepared (GRO on, tx checksum offload off) the interfaces move to XDP one by one — traffic
// passes in every mix, and stats says which hook each interface got.
func TestHookAuto(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "ethtool")
	bin := flowplaneBin(t)
	n := newPlainNet(t)
	t.Cleanup(func() {
		_ = nsrun.Do(n.R, func() error {
			inst, err := Instance()
			if err != nil {
				return err
			}
			return unpinInstance(inst)
		})
	})
	args := []string{"--inside", n.RA, "--outside", n.RB}

	argv := launchers[0].argv(bin, n.R, append([]string{"conntrack", "run", "--hook", "xdp"}, args...)...)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 ||
		!strings.Contains(string(out), fmt.Sprintf(`interface %q`, n.RA)) || !strings.Contains(string(out), "gro on") {
		t.Errorf("--hook xdp on unprepared veths: %v, %s; want exit 2 naming %s and `gro on`", err, out, n.RA)
	}

	prepare := func(ns, dev string) {
		if out, err := exec.Command("ip", "netns", "exec", ns, "ethtool", "-K", dev, "gro", "on", "tx", "off").CombinedOutput(); err != nil {
			t.Fatalf("ethtool: %v\n%s", err, out)
		}
	}
	for i, c := range []struct {
		prepare  func()
		ra, rb   string
		explicit bool
	}{
		{func() {}, HookTC, HookTC, false},
		{func() { prepare(n.A, n.PA) }, HookXDP, HookTC, false},
		{func() { prepare(n.B, n.PB) }, HookXDP, HookXDP, true},
	} {
		c.prepare()
		r := startRun(t, launchers[i%len(launchers)], bin, n.R, args...)
		if got := hooksOf(t, bin, n); got[n.RA] != c.ra || got[n.RB] != c.rb {
			t.Errorf("case %d: hooks %v, want %s=%s %s=%s\n%s", i, got, n.RA, c.ra, n.RB, c.rb, r.output())
		}
		if err := n.echoThrough(t, 8000+i); err != nil {
			t.Errorf("case %d (%s=%s, %s=%s): TCP echo through the router: %v", i, n.RA, c.ra, n.RB, c.rb, err)
		}
		udpFrom(t, n.A, fmt.Sprintf("%s:%d", n.AddrB, 7100+i))
		if err := n.unsolicited(t); err == nil || !os.IsTimeout(err) {
			t.Errorf("case %d: an outside connection attempt reached the inside host: %v (want a timeout: SYN dropped)", i, err)
		}
		if out, err := exec.Command("ip", "netns", "exec", n.A, "ping", "-c", "1", "-W", "2", n.AddrB).CombinedOutput(); err != nil {
			t.Errorf("case %d: ping through the router: %v\n%s", i, err, out)
		}
		r.stop(t)
		if c.explicit {
			r := startRun(t, launchers[0], bin, n.R, append([]string{"--hook", "xdp"}, args...)...)
			if err := n.echoThrough(t, 8100+i); err != nil {
				t.Errorf("--hook xdp on prepared veths: TCP echo: %v", err)
			}
			r.stop(t)
		}
	}
}
