package attach_test

// The one lifecycle every subsystem that attaches goes through, driven by one table and the real
// bin/flowplane (built once by TestMain) as a user runs it: apply → re-apply under traffic (no
// connection reset, no datagram lost, the counters go on counting) → remove → remove again
// (exit 2 naming what is absent) → a kill -9 between attach and record, and one during
// remove: status reports the leftover, the next apply or remove cleans it, and nothing stays.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/testenv"
)

var bin string // bin/flowplane, built by TestMain

// dwell is how long traffic flows between two steps of the re-apply.
const dwell = 500 * time.Millisecond

func TestMain(m *testing.M) {
	if os.Getenv("FPATTACH_HELPER") == "client" {
		os.Exit(client())
	}
	dir, err := os.MkdirTemp("", "fpattachbin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "flowplane")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/flowplane/flowplane/cmd/flowplane").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// lab is what a row runs in: traffic goes from namespace A to B's address; a cgroup for the
// sock_ops rows (the traffic's sender runs in it).
type lab struct {
	A, B, R string // namespaces; R only for conntrack
	DevA    string // A's end towards B (or R)
	RIn     string // R's interfaces (conntrack)
	ROut    string
	AddrB   string
	Cgroup  string
	Name    string // an fp-prefixed instance name
	Dir     string // config files
}

// row is one subsystem's lifecycle.
type row struct {
	name   string
	ns     func(l *lab) string // where its commands run
	config func(l *lab, second bool) string
	apply  func(l *lab, cfg string) []string
	// applied and replaced are the first words of apply's one line the first time and again.
	applied, replaced string
	removeArgs        func(l *lab) []string
	removed           string
	absent            func(l *lab) string // remove again: exit 2, stderr names it
	status            func(l *lab) []string
	counter           func(l *lab, status any) (uint64, error) // from status --json
	gone              func(t *testing.T, l *lab)               // nothing left on the hook, no pins, no record
	foreground        bool                                     // conntrack: apply is `run`
}

var rows = []row{
	{
		name: "tune",
		ns:   func(l *lab) string { return "" },
		config: func(l *lab, second bool) string {
			cwnd := map[bool]int{false: 20, true: 30}[second]
			return fmt.Sprintf("profiles:\n  p: {init_cwnd: %d}\nrules:\n  - name: lab\n    match: {remote: [198.18.0.0/15], direction: any}\n    profile: p\n", cwnd)
		},
		apply: func(l *lab, cfg string) []string {
			return []string{"tune", "apply", "--config", cfg, "--cgroup", l.Cgroup, "--name", l.Name}
		},
		applied: "tune: applied policy", replaced: "tune: replaced policy",
		removeArgs: func(l *lab) []string { return []string{"tune", "remove", "--name", l.Name} },
		removed:    "tune: removed policy",
		absent:     func(l *lab) string { return fmt.Sprintf("policy %q: not applied", l.Name) },
		status:     func(l *lab) []string { return []string{"tune", "status", "--name", l.Name} },
		counter: func(l *lab, st any) (uint64, error) {
			return num(st, "counters", "active")
		},
		gone: func(t *testing.T, l *lab) {
			noSockOps(t, l.Cgroup)
			nothingPinned(t, "tune", l.Name)
			noRecord(t, "tune", l.Name)
		},
	},
	{
		name: "prio host",
		ns:   func(l *lab) string { return "" },
		config: func(l *lab, second bool) string {
			return "advertise:\n  - remote: [" + map[bool]string{false: "198.18.0.0/15", true: "198.18.10.0/24, 198.18.12.0/24"}[second] + "]\nrefresh: 0\n"
		},
		apply: func(l *lab, cfg string) []string {
			return []string{"prio", "host", "apply", "--cgroup", l.Cgroup, "--config", cfg, "--name", l.Name}
		},
		applied: "prio host: applied", replaced: "prio host: replaced",
		removeArgs: func(l *lab) []string { return []string{"prio", "host", "remove", "--name", l.Name} },
		removed:    "prio host: removed",
		absent:     func(l *lab) string { return fmt.Sprintf("no prio host attachment %q", l.Name) },
		status:     func(l *lab) []string { return []string{"prio", "status"} },
		counter: func(l *lab, st any) (uint64, error) {
			h, err := find(st, "hosts", "name", l.Name)
			if err != nil {
				return 0, err
			}
			return num(h, "counters", "written")
		},
		gone: func(t *testing.T, l *lab) {
			noSockOps(t, l.Cgroup)
			nothingPinned(t, "prio", "host-"+l.Name)
			noRecord(t, "prio", "host-"+l.Name)
		},
	},
	{
		name: "prio router",
		ns:   func(l *lab) string { return l.A },
		config: func(l *lab, second bool) string {
			return "scheme: fair\nleaves: 2\nlimit: " + map[bool]string{false: "1000", true: "2000"}[second] + "\n"
		},
		apply: func(l *lab, cfg string) []string {
			return []string{"prio", "router", "apply", "--dev", l.DevA, "--rate", "1gbit", "--config", cfg}
		},
		applied: "prio router: applied scheme fair", replaced: "prio router: replaced scheme fair",
		removeArgs: func(l *lab) []string { return []string{"prio", "router", "remove", "--dev", l.DevA} },
		removed:    "prio router: removed from",
		absent:     func(l *lab) string { return "no prio router on " + l.DevA + " in this network namespace" },
		status:     func(l *lab) []string { return []string{"prio", "status"} },
		counter: func(l *lab, st any) (uint64, error) {
			r, err := find(st, "routers", "dev", l.DevA)
			if err != nil {
				return 0, err
			}
			return num(r, "counters", "packets")
		},
		gone: func(t *testing.T, l *lab) {
			noTCX(t, l.A, l.DevA)
			ns := netnsPin(t, l.A)
			nothingPinned(t, "prio", ns, l.DevA)
			noRecord(t, "prio", ns+"-"+l.DevA)
			if out, _ := exec.Command("ip", "netns", "exec", l.A, "tc", "qdisc", "show", "dev", l.DevA).CombinedOutput(); strings.Contains(string(out), "htb") {
				t.Errorf("an HTB qdisc is left on %s: %s", l.DevA, out)
			}
		},
	},
	{
		name: "altmark mark",
		ns:   func(l *lab) string { return l.A },
		config: func(l *lab, second bool) string {
			return "carrier: dscp\ndscp_bits: [0, 1]\nperiod: " + map[bool]string{false: "100ms", true: "200ms"}[second] + "\n"
		},
		apply: func(l *lab, cfg string) []string {
			return []string{"altmark", "mark", "apply", "--dev", l.DevA, "--config", cfg}
		},
		applied: "altmark mark: applied on", replaced: "altmark mark: replaced on",
		removeArgs: func(l *lab) []string { return []string{"altmark", "mark", "remove", "--dev", l.DevA} },
		removed:    "altmark mark: removed from",
		absent:     func(l *lab) string { return "--dev: no marker on " + l.DevA + " in this network namespace" },
		status:     func(l *lab) []string { return []string{"altmark", "mark", "status"} },
		counter: func(l *lab, st any) (uint64, error) {
			list, _ := st.([]any)
			for _, m := range list {
				if mm, _ := m.(map[string]any); mm["dev"] == l.DevA {
					return num(mm, "counters", "seen")
				}
			}
			return 0, fmt.Errorf("no marker on %s in %v", l.DevA, st)
		},
		gone: func(t *testing.T, l *lab) {
			noTCX(t, l.A, l.DevA)
			ns := netnsPin(t, l.A)
			nothingPinned(t, "altmark-mark", ns, l.DevA)
			noRecord(t, "altmark-mark", ns+"-"+l.DevA)
		},
	},
	{
		name:       "conntrack",
		foreground: true,
		ns:         func(l *lab) string { return l.R },
		apply: func(l *lab, _ string) []string {
			return []string{"conntrack", "run", "--inside", l.RIn, "--outside", l.ROut, "--hook", "tc"}
		},
		removeArgs: func(l *lab) []string { return []string{"conntrack", "remove"} },
		removed:    "conntrack: removed the tables of this network namespace",
		absent:     func(l *lab) string { return "no conntrack instance in this network namespace" },
		status:     func(l *lab) []string { return []string{"conntrack", "status"} },
		counter: func(l *lab, st any) (uint64, error) {
			f, err := num(st, "counters", "forwarded")
			if err != nil {
				return 0, err
			}
			p, err := num(st, "counters", "passed")
			return f + p, err
		},
		gone: func(t *testing.T, l *lab) {
			noTCX(t, l.R, l.RIn)
			noTCX(t, l.R, l.ROut)
			ns := netnsPin(t, l.R)
			nothingPinned(t, "conntrack", ns)
			noRecord(t, "conntrack", ns)
		},
	},
}

func TestLifecycle(t *testing.T) {
	testenv.Privileged(t)
	testenv.Need(t, "tc", "ip")
	for _, r := range rows {
		t.Run(strings.ReplaceAll(r.name, " ", "-"), func(t *testing.T) {
			l := newLab(t, r.foreground)
			if r.foreground {
				foregroundLifecycle(t, r, l)
				return
			}
			lifecycle(t, r, l)
		})
	}
}

func lifecycle(t *testing.T, r row, l *lab) {
	ns := r.ns(l)
	cfg1, cfg2 := writeConfig(t, l, "1", r.config(l, false)), writeConfig(t, l, "2", r.config(l, true))
	t.Cleanup(func() { _, _, _ = fp(ns, nil, r.removeArgs(l)...) })

	// apply
	mustLine(t, ns, r.applied, r.apply(l, cfg1)...)

	// re-apply under traffic: the counters keep counting, nothing is reset or lost.
	tr := startTraffic(t, l)
	c0 := waitCounter(t, r, l, 0)
	time.Sleep(dwell)
	mustLine(t, ns, r.replaced, r.apply(l, cfg2)...)
	c1 := waitCounter(t, r, l, c0)
	time.Sleep(dwell)
	mustLine(t, ns, r.replaced, r.apply(l, cfg1)...)
	waitCounter(t, r, l, c1)
	time.Sleep(dwell)
	tr.stop(t)

	// remove, and remove again
	mustLine(t, ns, r.removed, r.removeArgs(l)...)
	r.gone(t, l)
	removeAgain(t, r, l, ns)

	// kill -9 between attach and record: status reports it, the next apply cleans it.
	crash(t, ns, "record", r.apply(l, cfg1))
	leftoverInStatus(t, r, l, ns)
	out, errOut := mustLine(t, ns, r.applied, r.apply(l, cfg1)...)
	if !strings.Contains(errOut, "warning: cleaned what was left of") {
		t.Errorf("apply after a kill -9: stderr %q, want the warning that it cleaned the leftover (stdout %q)", errOut, out)
	}
	// kill -9 during remove (the record gone, the links not detached): the next remove cleans.
	crash(t, ns, "detach", r.removeArgs(l))
	leftoverInStatus(t, r, l, ns)
	_, errOut = mustLine(t, ns, r.removed, r.removeArgs(l)...)
	if !strings.Contains(errOut, "warning: cleaned what was left of") {
		t.Errorf("remove after a kill -9: stderr %q, want the warning that it cleaned the leftover", errOut)
	}
	r.gone(t, l)
	removeAgain(t, r, l, ns)
}

// foregroundLifecycle is conntrack's: run attaches and holds its links; a second run while
// one runs is refused (exit 2) and the first forwards on; stopping it and remove take all.
func foregroundLifecycle(t *testing.T, r row, l *lab) {
	ns := r.ns(l)
	t.Cleanup(func() { _, _, _ = fp(ns, nil, r.removeArgs(l)...) })
	run := startRun(t, ns, r.apply(l, ""))
	waitRunning(t, r, l, ns, true)
	tr := startTraffic(t, l)
	c0 := waitCounter(t, r, l, 0)
	time.Sleep(dwell)
	if _, errOut, code := fp(ns, nil, r.apply(l, "")...); code != 2 || !strings.Contains(errOut, "already attached by a running process") {
		t.Errorf("a second run: exit %d, %q; want exit 2, the first one named", code, errOut)
	}
	waitCounter(t, r, l, c0)
	tr.stop(t)
	run.stop(t)
	mustLine(t, ns, r.removed, r.removeArgs(l)...)
	r.gone(t, l)
	removeAgain(t, r, l, ns)

	// kill -9: the record outlives the run; status says so; the next run cleans it.
	run = startRun(t, ns, r.apply(l, ""))
	waitRunning(t, r, l, ns, true)
	run.kill(t)
	leftoverInStatus(t, r, l, ns)
	var st struct {
		Running  bool   `json:"running"`
		Leftover string `json:"leftover"`
	}
	statusJSON(t, r, l, ns, &st)
	if st.Running || st.Leftover == "" {
		t.Errorf("status --json after kill -9: %+v, want not running and a leftover", st)
	}
	run = startRun(t, ns, r.apply(l, ""))
	waitRunning(t, r, l, ns, true)
	run.stop(t)
	if !strings.Contains(run.stderr.String(), "cleaned what was left of conntrack run") {
		t.Errorf("run after a kill -9 did not say it cleaned the leftover: %s", run.stderr.String())
	}
	// kill -9 again, then remove cleans the record with the tables.
	run = startRun(t, ns, r.apply(l, ""))
	waitRunning(t, r, l, ns, true)
	run.kill(t)
	_, errOut := mustLine(t, ns, r.removed, r.removeArgs(l)...)
	if !strings.Contains(errOut, "warning: cleaned what was left of conntrack run") {
		t.Errorf("remove after a kill -9: stderr %q, want the warning that it cleaned the leftover", errOut)
	}
	r.gone(t, l)
	removeAgain(t, r, l, ns)
}

func removeAgain(t *testing.T, r row, l *lab, ns string) {
	t.Helper()
	if out, errOut, code := fp(ns, nil, r.removeArgs(l)...); code != 2 || !strings.Contains(errOut, r.absent(l)) || out != "" {
		t.Errorf("remove again: exit %d, stdout %q, stderr %q; want exit 2 naming %q", code, out, errOut, r.absent(l))
	}
}

// crash runs args stopped at the crash point (attach.StopEnv) and kills it there with kill -9.
func crash(t *testing.T, ns, point string, args []string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), attach.StopEnv+"="+point)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := startIn(ns, cmd); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !stopped(cmd.Process.Pid) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("%v did not reach crash point %q: %s", args, point, errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

func stopped(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] == 'T'
}

func leftoverInStatus(t *testing.T, r row, l *lab, ns string) {
	t.Helper()
	out, errOut, code := fp(ns, nil, r.status(l)...)
	ours := r.foreground || strings.Contains(out, l.Name) || strings.Contains(out, l.DevA)
	if code != 0 || !strings.Contains(out, "leftover") || !ours {
		t.Errorf("%v after kill -9: exit %d, %q %q; want the leftover reported", r.status(l), code, out, errOut)
	}
}

// mustLine runs args and wants exit 0 and one line starting with prefix.
func mustLine(t *testing.T, ns, prefix string, args ...string) (string, string) {
	t.Helper()
	out, errOut, code := fp(ns, nil, args...)
	if code != 0 || !strings.HasPrefix(out, prefix) || strings.Count(out, "\n") != 1 {
		t.Fatalf("%v: exit %d, stdout %q, stderr %q; want one line %q…", args, code, out, errOut, prefix)
	}
	return out, errOut
}

// fp runs bin/flowplane in namespace ns ("" the test's own).
func fp(ns string, env []string, args ...string) (string, string, int) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := startIn(ns, cmd)
	if err == nil {
		err = cmd.Wait()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errb.String(), ee.ExitCode()
	}
	if err != nil {
		return out.String(), errb.String() + err.Error(), -1
	}
	return out.String(), errb.String(), 0
}

func startIn(ns string, cmd *exec.Cmd) error {
	if ns == "" {
		return cmd.Start()
	}
	return nsrun.Start(ns, cmd)
}

func statusJSON(t *testing.T, r row, l *lab, ns string, v any) {
	t.Helper()
	out, errOut, code := fp(ns, nil, append(r.status(l), "--json")...)
	if code != 0 {
		t.Fatalf("%v --json: exit %d: %s", r.status(l), code, errOut)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("%v --json: %v: %s", r.status(l), err, out)
	}
}

// waitCounter waits up to 10 s for the row's counter to pass above.
func waitCounter(t *testing.T, r row, l *lab, above uint64) uint64 {
	t.Helper()
	var last uint64
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var st any
		statusJSON(t, r, l, r.ns(l), &st)
		if last, err = r.counter(l, st); err == nil && last > above {
			return last
		}
	}
	t.Fatalf("%s's counter stays at %d (want above %d): %v", r.name, last, above, err)
	return 0
}

func num(v any, path ...string) (uint64, error) {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return 0, fmt.Errorf("no %s in %v", p, v)
		}
		v = m[p]
	}
	f, ok := v.(float64)
	if !ok {
		return 0, fmt.Errorf("%v is not a number", v)
	}
	return uint64(f), nil
}

func find(v any, list, key, want string) (any, error) {
	m, _ := v.(map[string]any)
	items, _ := m[list].([]any)
	for _, it := range items {
		if im, _ := it.(map[string]any); im[key] == want {
			return im, nil
		}
	}
	return nil, fmt.Errorf("no %s with %s %q in %v", list, key, want, v)
}

// running is a `conntrack run` in the background.
type running struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan error
}

func startRun(t *testing.T, ns string, args []string) *running {
	t.Helper()
	r := &running{cmd: exec.Command(bin, args...), stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	r.cmd.Stderr = r.stderr
	if err := startIn(ns, r.cmd); err != nil {
		t.Fatal(err)
	}
	go func() { r.done <- r.cmd.Wait() }()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.done
		r.done <- nil
	})
	return r
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.done:
		r.done <- err
		if err != nil {
			t.Errorf("run ended with %v: %s", err, r.stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("run did not stop on SIGTERM: %s", r.stderr.String())
	}
}

func (r *running) kill(t *testing.T) {
	t.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	err := <-r.done
	r.done <- err
}

func waitRunning(t *testing.T, r row, l *lab, ns string, want bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out, _, code := fp(ns, nil, append(r.status(l), "--json")...)
		var st struct {
			Running bool `json:"running"`
		}
		if code == 0 && json.Unmarshal([]byte(out), &st) == nil && st.Running == want {
			return
		}
	}
	t.Fatalf("conntrack status never said running=%v", want)
}

func writeConfig(t *testing.T, l *lab, name, text string) string {
	t.Helper()
	if text == "" {
		return ""
	}
	p := filepath.Join(l.Dir, name+".yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// newLab makes A — B (or A — R — B for a router row), a cgroup, and a name.
func newLab(t *testing.T, router bool) *lab {
	t.Helper()
	l := &lab{A: testenv.Netns(t), B: testenv.Netns(t), Name: testenv.Name("at"), Dir: t.TempDir()}
	if !router {
		a, _ := testenv.VethPair(t, l.A, l.B, netip.MustParsePrefix("198.18.10.1/24"), netip.MustParsePrefix("198.18.10.2/24"))
		l.DevA, l.AddrB = a.Name, "198.18.10.2"
	} else {
		l.R = testenv.Netns(t)
		a, ra := testenv.VethPair(t, l.A, l.R, netip.MustParsePrefix("198.18.11.1/24"), netip.MustParsePrefix("198.18.11.254/24"))
		rb, _ := testenv.VethPair(t, l.R, l.B, netip.MustParsePrefix("198.18.12.254/24"), netip.MustParsePrefix("198.18.12.2/24"))
		l.DevA, l.RIn, l.ROut, l.AddrB = a.Name, ra.Name, rb.Name, "198.18.12.2"
		for _, c := range [][]string{
			{"ip", "netns", "exec", l.R, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
			{"ip", "-n", l.A, "route", "add", "198.18.12.0/24", "via", "198.18.11.254"},
			{"ip", "-n", l.B, "route", "add", "198.18.11.0/24", "via", "198.18.12.254"},
		} {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v: %s", c, err, out)
			}
		}
	}
	root, err := cgroup.Mount()
	if err != nil {
		t.Fatal(err)
	}
	l.Cgroup = filepath.Join(root, testenv.Name("cg"))
	if err := os.Mkdir(l.Cgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cgroup.Remove(l.Cgroup); err != nil {
			t.Error(err)
		}
	})
	return l
}

func netnsPin(t *testing.T, ns string) string {
	t.Helper()
	var name string
	if err := nsrun.Do(ns, func() (err error) { name, err = attach.ThisNetns(); return err }); err != nil {
		t.Fatal(err)
	}
	return name
}

func nothingPinned(t *testing.T, parts ...string) {
	t.Helper()
	if _, err := os.Stat(pin.Path(parts...)); !errors.Is(err, os.ErrNotExist) {
		entries, _ := os.ReadDir(pin.Path(parts...))
		t.Errorf("pins left under %s: %v", pin.Path(parts...), entries)
	}
}

func noRecord(t *testing.T, subsystem, name string) {
	t.Helper()
	if _, err := os.Stat(runstate.Path(subsystem, name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record %s left", runstate.Path(subsystem, name))
	}
}

func noSockOps(t *testing.T, cg string) {
	t.Helper()
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Programs) != 0 {
		t.Errorf("%d sock_ops programs left on %s", len(q.Programs), cg)
	}
}

func noTCX(t *testing.T, ns, dev string) {
	t.Helper()
	err := nsrun.Do(ns, func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			q, err := link.QueryPrograms(link.QueryOptions{Target: ifc.Index, Attach: at})
			if err != nil {
				return err
			}
			if len(q.Programs) != 0 {
				t.Errorf("%d tcx programs (%v) left on %s", len(q.Programs), at, dev)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// traffic is a long-lived TCP connection, a TCP connection opened every 50 ms and a numbered
// UDP stream from A to B, sent by a helper process (this test binary, FPATTACH_HELPER=client)
// in A and in the lab's cgroup, received here in sockets made in B.
type traffic struct {
	cmd      *exec.Cmd
	out      bytes.Buffer
	tcp      net.Listener
	udp      *net.UDPConn
	mu       sync.Mutex
	errs     []error
	seen     map[uint64]bool
	accepted int
	wg       sync.WaitGroup
}

const trafficPort = 47011

func startTraffic(t *testing.T, l *lab) *traffic {
	t.Helper()
	tr := &traffic{seen: map[uint64]bool{}}
	addr := net.JoinHostPort(l.AddrB, strconv.Itoa(trafficPort))
	err := nsrun.Do(l.B, func() error {
		var err error
		if tr.tcp, err = net.Listen("tcp4", addr); err != nil {
			return err
		}
		ua, _ := net.ResolveUDPAddr("udp4", addr)
		tr.udp, err = net.ListenUDP("udp4", ua)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = tr.udp.SetReadBuffer(8 << 20)
	tr.wg.Add(2)
	go func() {
		defer tr.wg.Done()
		for {
			c, err := tr.tcp.Accept()
			if err != nil {
				return
			}
			tr.mu.Lock()
			tr.accepted++
			tr.mu.Unlock()
			tr.wg.Add(1)
			go func() {
				defer tr.wg.Done()
				defer c.Close()
				if _, err := io.Copy(io.Discard, c); err != nil {
					tr.fail(fmt.Errorf("receive: %w", err))
				}
			}()
		}
	}()
	go func() {
		defer tr.wg.Done()
		b := make([]byte, 64)
		for {
			n, err := tr.udp.Read(b)
			if err != nil {
				return
			}
			if n >= 8 {
				tr.mu.Lock()
				tr.seen[binary.BigEndian.Uint64(b)] = true
				tr.mu.Unlock()
			}
		}
	}()
	tr.cmd = exec.Command(os.Args[0])
	tr.cmd.Env = append(os.Environ(), "FPATTACH_HELPER=client", "FPATTACH_ADDR="+addr)
	tr.cmd.Stdout, tr.cmd.Stderr = &tr.out, &tr.out
	fd, err := cgroup.Into(tr.cmd, l.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if err := nsrun.Start(l.A, tr.cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if tr.cmd.ProcessState == nil {
			_ = tr.cmd.Process.Kill()
			_ = tr.cmd.Wait()
		}
		tr.tcp.Close()
		tr.udp.Close()
	})
	return tr
}

func (tr *traffic) fail(err error) {
	tr.mu.Lock()
	tr.errs = append(tr.errs, err)
	tr.mu.Unlock()
}

// stop ends the sender and checks: no error either side, every datagram received.
func (tr *traffic) stop(t *testing.T) {
	t.Helper()
	_ = tr.cmd.Process.Signal(syscall.SIGTERM)
	if err := tr.cmd.Wait(); err != nil {
		t.Errorf("traffic sender: %v: %s", err, tr.out.String())
	}
	var res clientResult
	if err := json.Unmarshal(tr.out.Bytes(), &res); err != nil {
		t.Fatalf("traffic sender's report: %v: %s", err, tr.out.String())
	}
	time.Sleep(300 * time.Millisecond) // the last datagrams in flight
	tr.tcp.Close()
	tr.udp.Close()
	tr.wg.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(res.Errors) > 0 || len(tr.errs) > 0 {
		t.Errorf("connections broke: sender %v, receiver %v", res.Errors, tr.errs)
	}
	if res.UDPSent == 0 || res.TCPBytes == 0 || res.Short == 0 {
		t.Errorf("too little traffic: %+v", res)
	}
	if uint64(len(tr.seen)) != res.UDPSent {
		t.Errorf("%d of %d datagrams received: %d lost", len(tr.seen), res.UDPSent, res.UDPSent-uint64(len(tr.seen)))
	}
	t.Logf("traffic: %d datagrams, all received; %d bytes on the long connection, %d short connections, none reset", res.UDPSent, res.TCPBytes, res.Short)
}

type clientResult struct {
	UDPSent  uint64   `json:"udp_sent"`
	TCPBytes uint64   `json:"tcp_bytes"`
	Short    uint64   `json:"short"`
	Errors   []string `json:"errors"`
}

// client is the traffic helper's main: it sends until SIGTERM and reports on stdout.
func client() int {
	addr := os.Getenv("FPATTACH_ADDR")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	var res clientResult
	var mu sync.Mutex
	fail := func(err error) { mu.Lock(); res.Errors = append(res.Errors, err.Error()); mu.Unlock() }
	done := make(chan struct{})
	var wg sync.WaitGroup
	long, err := net.Dial("tcp4", addr)
	if err != nil {
		fmt.Println(`{"errors":["dial: ` + err.Error() + `"]}`)
		return 1
	}
	udp, err := net.Dial("udp4", addr)
	if err != nil {
		fmt.Println(`{"errors":["dial udp: ` + err.Error() + `"]}`)
		return 1
	}
	wg.Add(3)
	go func() { // the long connection: 1 KiB a millisecond
		defer wg.Done()
		b := make([]byte, 1024)
		for {
			select {
			case <-done:
				if err := long.Close(); err != nil {
					fail(err)
				}
				return
			case <-time.After(time.Millisecond):
			}
			if _, err := long.Write(b); err != nil {
				fail(fmt.Errorf("long connection: %w", err))
				return
			}
			mu.Lock()
			res.TCPBytes += uint64(len(b))
			mu.Unlock()
		}
	}()
	go func() { // numbered datagrams, one every 500 µs
		defer wg.Done()
		b := make([]byte, 64)
		for seq := uint64(0); ; seq++ {
			select {
			case <-done:
				return
			case <-time.After(500 * time.Microsecond):
			}
			binary.BigEndian.PutUint64(b, seq)
			if _, err := udp.Write(b); err != nil {
				fail(fmt.Errorf("udp: %w", err))
				return
			}
			mu.Lock()
			res.UDPSent = seq + 1
			mu.Unlock()
		}
	}()
	go func() { // a new connection every 50 ms
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
			if err != nil {
				fail(fmt.Errorf("short connection: %w", err))
				continue
			}
			if _, err := c.Write(make([]byte, 100)); err != nil {
				fail(fmt.Errorf("short connection: %w", err))
			}
			c.Close()
			mu.Lock()
			res.Short++
			mu.Unlock()
		}
	}()
	<-stop
	close(done)
	wg.Wait()
	data, _ := json.Marshal(&res)
	fmt.Println(string(data))
	return 0
}

// TestLifecycleProbe: the altmark probe attaches with attach.Attach and pins nothing: it runs
// in the foreground and its links are its own. Under traffic, a kill -9 leaves no program on
// the device and nothing pinned or recorded, and the next run attaches again.
func TestLifecycleProbe(t *testing.T) {
	testenv.Privileged(t)
	l := newLab(t, false)
	cfg := writeConfig(t, l, "probe", fmt.Sprintf("probe_id: p1\ninterfaces:\n  - {name: %s, direction: both}\nperiod: 100ms\nperiods: 0\ncarrier: dscp\ndscp_bits: [0, 1]\nhash_bits: 8\nnmax: 1000\ndata_dir: %s\n",
		l.DevA, filepath.Join(l.Dir, "data")))
	programs := func() int {
		n := 0
		err := nsrun.Do(l.A, func() error {
			ifc, err := net.InterfaceByName(l.DevA)
			if err != nil {
				return err
			}
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				q, err := link.QueryPrograms(link.QueryOptions{Target: ifc.Index, Attach: at})
				if err != nil {
					return err
				}
				n += len(q.Programs)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	attached := func(run *running) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); programs() != 2; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the probe did not attach to both directions of %s: %s", l.DevA, run.stderr.String())
			}
		}
	}
	tr := startTraffic(t, l)
	run := startRun(t, l.A, []string{"altmark", "probe", "run", "--config", cfg})
	attached(run)
	time.Sleep(dwell)
	run.kill(t)
	if n := programs(); n != 0 {
		t.Errorf("%d tcx programs left on %s after kill -9", n, l.DevA)
	}
	nothingPinned(t, "altmark-probe")
	run = startRun(t, l.A, []string{"altmark", "probe", "run", "--config", cfg})
	attached(run)
	time.Sleep(dwell)
	run.stop(t)
	tr.stop(t)
	if n := programs(); n != 0 {
		t.Errorf("%d tcx programs left on %s after the probe stopped", n, l.DevA)
	}
}
