package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/testenv"
)

// TestReleaseSmoke installs the release as a user would and runs each subsystem once: the
// tarball unpacked into an empty directory, a PATH with its flowplane and the host's tools but
// no go, no clang and nothing of the checkout, the analytics wheel installed into a fresh venv
// with pip offline. It uses the release in $FLOWPLANE_DIST (`make test` builds dist/ just
// before) or builds one. Every step is timed; with $FLOWPLANE_RELEASE_LOG the times also go to
// that file (`make test` prints it). Nothing is left behind: the test checks at the end.
func TestReleaseSmoke(t *testing.T) {
	testenv.Privileged(t)
	start := time.Now()
	ctx := context.Background()
	root := checkout(t)
	want, err := gitInfo(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wheelhouse := filepath.Join(root, "analytics/.wheelhouse")
	if _, err := os.Stat(filepath.Join(wheelhouse, ".installed")); err != nil {
		testenv.Unavailable(t, "no wheelhouse for the offline install (%v): run make setup", err)
	}
	// Everything the test makes on disk is under tmp, removed (and checked) at the end.
	tmp, err := os.MkdirTemp("", "fpsmoke-")
	if err != nil {
		t.Fatal(err)
	}
	s := &smoke{t: t, tmp: tmp}
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	defer s.report(start)

	dist := os.Getenv("FLOWPLANE_DIST")
	if dist == "" {
		s.step("build the release", func() {
			r, err := Run(ctx, Options{Out: filepath.Join(tmp, "dist"), Root: root, Arches: []string{runtime.GOARCH}})
			if err != nil {
				t.Fatal(err)
			}
			dist = r.Dir
		})
	}
	tarball := filepath.Join(dist, fmt.Sprintf("flowplane_%s_linux_%s.tar.gz", want.FileVersion(), runtime.GOARCH))
	wheel := filepath.Join(dist, fmt.Sprintf("flowplane_analytics-%s-py3-none-any.whl", want.PyVersion))
	s.step("verify SHA256SUMS", func() { verifySums(t, dist, tarball, wheel) })

	// The tools a user's machine has, one symlink each: /usr/bin also holds go or clang here.
	tools := filepath.Join(tmp, "tools")
	home := filepath.Join(tmp, "home")
	for _, d := range []string{tools, home, filepath.Join(tmp, "tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s.step("tools for the PATH", func() { linkTools(t, root, tools) })
	unpacked := filepath.Join(tmp, "unpacked")
	top := filepath.Join(unpacked, fmt.Sprintf("flowplane_%s_linux_%s", want.FileVersion(), runtime.GOARCH))
	s.path = []string{top, tools}
	s.env = []string{"HOME=" + home, "TMPDIR=" + filepath.Join(tmp, "tmp"), "LANG=C.UTF-8"}
	s.step("unpack the tarball", func() {
		if err := os.Mkdir(unpacked, 0o755); err != nil {
			t.Fatal(err)
		}
		s.run("tar", "xzf", tarball, "-C", unpacked)
		checkTree(t, top)
	})
	s.step("PATH has no go, clang or checkout", func() {
		for _, p := range []string{"go", "clang", "gofmt", "flowplane-analytics"} {
			if out, err := s.cmd("bash", "-c", "command -v "+p).CombinedOutput(); err == nil {
				t.Fatalf("%s is on the smoke test's PATH: %s", p, out)
			}
		}
		if got := strings.TrimSpace(s.run("bash", "-c", "command -v flowplane")); got != filepath.Join(top, "flowplane") {
			t.Fatalf("flowplane is %s, want the unpacked %s", got, filepath.Join(top, "flowplane"))
		}
		for _, dir := range s.path {
			if strings.HasPrefix(dir, root+"/") {
				t.Fatalf("PATH holds %s, in the checkout", dir)
			}
		}
	})

	s.step("flowplane version", func() {
		if out := s.run("flowplane", "version"); !strings.HasPrefix(out, "flowplane "+want.Version+"\n") {
			t.Fatalf("flowplane version:\n%s\nwant flowplane %s", out, want.Version)
		}
		var got struct {
			Version, Commit, Date string
			Modified              bool
		}
		if err := json.Unmarshal([]byte(s.run("flowplane", "version", "--json")), &got); err != nil {
			t.Fatal(err)
		}
		if got.Version != want.Version || got.Commit != want.Commit || got.Date != want.Date || got.Modified {
			t.Fatalf("flowplane version --json: %+v, want version %s commit %s date %s", got, want.Version, want.Commit, want.Date)
		}
	})
	s.step("flowplane check", func() {
		out := s.run("flowplane", "check")
		for _, sub := range []string{"lab", "conntrack", "tune", "prio", "altmark"} {
			if !regexpLine(out, sub+" +works") {
				t.Errorf("flowplane check: %s does not work here:\n%s", sub, out)
			}
		}
	})

	// The lab: h1 — r1 — h2.
	lab := "fpsmk" + randHex(t, 3)
	topoFile := filepath.Join(tmp, "lab.yaml")
	writeFile(t, topoFile, "name: "+lab+"\nnodes:\n  h1: {}\n  r1: {kind: router, xdp: true}\n  h2: {}\nlinks:\n  - endpoints: [h1, r1]\n  - endpoints: [r1, h2]\n")
	// Removed here whatever happens below; the steps remove them themselves and the end checks.
	finished := false
	t.Cleanup(func() {
		if finished {
			return
		}
		for _, c := range [][]string{
			{"lab", "exec", lab, "r1", "--", "flowplane", "conntrack", "remove"},
			{"tune", "--name", lab, "remove"},
			{"lab", "down", lab},
		} {
			_ = s.cmd("flowplane", c...).Run()
		}
	})
	var st labStatus
	s.step("lab up", func() {
		s.run("flowplane", "lab", "up", "--config", topoFile)
		if err := json.Unmarshal([]byte(s.run("flowplane", "lab", "status", lab, "--json")), &st); err != nil {
			t.Fatal(err)
		}
		if out := s.run("flowplane", "lab", "status", lab); !strings.Contains(out, "r1:eth1") {
			t.Fatalf("lab status:\n%s", out)
		}
	})
	r1in, r1out, h2 := st.iface(t, "r1", "eth0").Device, st.iface(t, "r1", "eth1").Device, st.iface(t, "h2", "eth0").IPv4
	h2, _, _ = strings.Cut(h2, "/")
	// r1's namespace names the pins and records of conntrack and prio: checked while it exists
	// (another test's namespace could get its inode once it is gone).
	var r1ns syscall.Stat_t
	if err := syscall.Stat("/run/netns/"+st.node(t, "r1").Netns, &r1ns); err != nil {
		t.Fatal(err)
	}
	nsTag := fmt.Sprintf("ns%d", r1ns.Ino)
	onR1 := func(args ...string) string {
		return s.run("flowplane", append([]string{"lab", "exec", lab, "r1", "--", "flowplane"}, args...)...)
	}

	s.step("conntrack run, list, stop, remove", func() {
		ct := s.cmd("flowplane", "lab", "exec", lab, "r1", "--", "flowplane", "conntrack", "run", "--inside", r1in, "--outside", r1out)
		var log bytes.Buffer
		ct.Stdout, ct.Stderr = &log, &log
		if err := ct.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- ct.Wait() }()
		exited := false
		defer func() { // on a failure below
			if !exited {
				_ = ct.Process.Signal(syscall.SIGTERM)
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					_ = ct.Process.Kill()
					<-done
				}
			}
		}()
		attached := false
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			out, _ := s.cmd("flowplane", "lab", "exec", lab, "r1", "--", "flowplane", "conntrack", "status").Output()
			if regexpLine(string(out), "interface +"+r1out) {
				attached = true
				break
			}
		}
		if !attached {
			t.Fatalf("conntrack run did not attach in 20 s:\n%s", log.String())
		}
		s.run("flowplane", "lab", "exec", lab, "h1", "--", "ping", "-c", "2", "-i", "0.2", "-W", "2", h2)
		if out := onR1("conntrack", "list"); !strings.Contains(out, "dst="+h2) {
			t.Fatalf("conntrack list has no entry for the ping to %s:\n%s", h2, out)
		}
		if err := ct.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			exited = true
			if err != nil {
				t.Fatalf("conntrack run after SIGTERM: %v\n%s", err, log.String())
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("conntrack run still running 15 s after SIGTERM:\n%s", log.String())
		}
		// The tables stay pinned after a run (conntrack list reads them); remove drops them.
		if out := onR1("conntrack", "status"); !strings.Contains(out, "no run is attached") {
			t.Fatalf("conntrack status after the run:\n%s", out)
		}
		onR1("conntrack", "remove")
	})

	s.step("tune apply, status, remove", func() {
		policy := filepath.Join(tmp, "tune.yaml")
		writeFile(t, policy, "profiles:\n  lab: {syn_rto: 12ms, rto_min: 20ms, congestion: cubic}\nrules:\n  - name: lab\n    match: {remote: [198.18.0.0/15, fd00::/8]}\n    profile: lab\n")
		s.run("flowplane", "tune", "--name", lab, "apply", "--config", policy)
		cg := filepath.Join(cgroupRoot(t), "fptune-"+lab)
		if _, err := os.Stat(cg); err != nil {
			t.Fatalf("tune apply made no cgroup: %v", err)
		}
		if out := s.run("flowplane", "tune", "--name", lab, "status"); !strings.Contains(out, "policy "+lab) {
			t.Fatalf("tune status:\n%s", out)
		}
		s.run("flowplane", "tune", "--name", lab, "remove")
		if _, err := os.Stat(cg); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("tune remove left its cgroup %s (%v)", cg, err)
		}
	})

	s.step("prio router apply, status, remove", func() {
		policy := filepath.Join(tmp, "prio.yaml")
		writeFile(t, policy, "scheme: backlog\ntrust: [198.18.0.0/15]\nthresholds: [100KB]\nleaves: 2\nlimit: 100\n")
		onR1("prio", "router", "apply", "--dev", r1out, "--rate", "100mbit", "--config", policy)
		if out := onR1("prio", "status"); !strings.Contains(out, "router "+r1out) {
			t.Fatalf("prio status:\n%s", out)
		}
		if out := s.run("flowplane", "lab", "exec", lab, "r1", "--", "tc", "qdisc", "show", "dev", r1out); !strings.Contains(out, "htb") {
			t.Fatalf("no htb on %s after prio router apply:\n%s", r1out, out)
		}
		onR1("prio", "router", "remove", "--dev", r1out)
		if out := onR1("prio", "status"); strings.Contains(out, "router "+r1out) {
			t.Fatalf("prio status after remove:\n%s", out)
		}
	})

	s.step("altmark probe run, 2 × 200ms", func() {
		cfg := filepath.Join(tmp, "probe.yaml")
		data := filepath.Join(tmp, "altmark")
		writeFile(t, cfg, fmt.Sprintf("probe_id: r1\ninterfaces: [{name: %s, direction: both}]\nperiod: 200ms\nperiods: 2\ncarrier: dscp\ndata_dir: %s\n", r1out, data))
		onR1("altmark", "probe", "run", "--config", cfg)
		files, _ := filepath.Glob(filepath.Join(data, "jsonl/r1/*.jsonl"))
		counters, _ := filepath.Glob(filepath.Join(data, "counters/probe=r1/period=*/*.parquet"))
		if len(files) != 2 || len(counters) != 2 {
			t.Fatalf("the probe wrote %d jsonl and %d counters files, want 2 each: %v %v", len(files), len(counters), files, counters)
		}
	})

	s.step("nothing left in r1's namespace", func() {
		if left := leftovers(func(name string) bool { return name == nsTag || strings.HasPrefix(name, nsTag+"-") }); len(left) > 0 {
			t.Fatalf("left behind by conntrack, prio or altmark in r1 (%s): %v", nsTag, left)
		}
	})

	venv := filepath.Join(tmp, "venv")
	s.step("venv, wheel installed offline", func() {
		s.run("python3", "-m", "venv", venv)
		s.run(filepath.Join(venv, "bin/python"), "-m", "pip", "install", "-q", "--no-cache-dir", "--no-compile", "--disable-pip-version-check",
			"--no-index", "--find-links", wheelhouse, "-c", filepath.Join(root, "analytics/constraints.txt"), wheel)
		s.path = append(s.path, filepath.Join(venv, "bin"))
		if got := strings.TrimSpace(s.run("bash", "-c", "command -v flowplane-analytics")); got != filepath.Join(venv, "bin/flowplane-analytics") {
			t.Fatalf("flowplane-analytics is %q, want the venv's", got)
		}
		if got := strings.TrimSpace(s.run("python", "-c", "import flowplane_analytics; print(flowplane_analytics.__version__)")); got != want.PyVersion {
			t.Fatalf("the installed analytics are version %s, want %s", got, want.PyVersion)
		}
	})
	s.step("flowplane-analytics synth, loss", func() {
		data := filepath.Join(tmp, "synth")
		s.run("flowplane-analytics", "synth", "--topology", topoFile, "--data", data, "--periods", "3", "--loss", "0.01")
		direct := s.run("flowplane-analytics", "loss", "--data", data, "--topology", topoFile, "--format", "csv")
		viaFlowplane := s.run("flowplane", "altmark", "analyze", "loss", "--data", data, "--topology", topoFile, "--format", "csv")
		if direct != viaFlowplane || strings.Count(direct, "\n") != 1+3*3 || !strings.Contains(direct, "e2e") {
			t.Fatalf("flowplane-analytics loss:\n%s\nflowplane altmark analyze loss:\n%s\nwant the same 3 periods × (C1, C2, e2e)", direct, viaFlowplane)
		}
		if out := s.run("flowplane", "check"); !regexpLine(out, "analytics +yes") {
			t.Fatalf("flowplane check does not find the analytics on PATH:\n%s", out)
		}
	})

	s.step("man -l renders a page", func() {
		out := s.run("man", "-l", filepath.Join(top, "man/man1/flowplane-conntrack-run.1"))
		if !strings.Contains(out, "FLOWPLANE-CONNTRACK-RUN(1)") || !strings.Contains(out, "--inside") {
			t.Fatalf("man -l:\n%s", out)
		}
	})
	s.step("bash completion", func() {
		out := s.run("bash", "-c", "source "+filepath.Join(top, "completions/flowplane.bash")+"; complete -p flowplane")
		if !strings.Contains(out, "complete") || !strings.HasSuffix(strings.TrimSpace(out), " flowplane") {
			t.Fatalf("complete -p flowplane: %q", out)
		}
		// Tab after "flowplane conntr", as bash does it with the bash-completion package loaded.
		tab := "source /usr/share/bash-completion/bash_completion; source " + filepath.Join(top, "completions/flowplane.bash") +
			`; COMP_WORDS=(flowplane conntr); COMP_CWORD=1; COMP_LINE="flowplane conntr"; COMP_POINT=${#COMP_LINE}; __start_flowplane; echo "${COMPREPLY[*]}"`
		if out := s.run("bash", "-c", tab); strings.TrimSpace(out) != "conntrack" {
			t.Fatalf("bash completion of 'flowplane conntr': %q, want conntrack", out)
		}
		if out := s.run("flowplane", "__complete", "conntrack", ""); !strings.Contains(out, "run\t") {
			t.Fatalf("flowplane __complete conntrack '':\n%s", out)
		}
	})

	s.step("lab down", func() {
		s.run("flowplane", "lab", "down", lab)
		if out := s.run("flowplane", "lab", "list"); strings.Contains(out, lab) {
			t.Fatalf("lab list after down:\n%s", out)
		}
	})
	s.step("nothing left behind", func() {
		if left := leftovers(func(name string) bool { return strings.Contains(name, lab) }); len(left) > 0 {
			t.Fatalf("left behind: %v", left)
		}
		if err := os.RemoveAll(tmp); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(tmp); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s is still there (%v)", tmp, err)
		}
		finished = true
	})
}

// smoke runs commands as a user would: only its PATH and a few variables.
type smoke struct {
	t     *testing.T
	tmp   string
	path  []string
	env   []string
	steps []Step
}

// step runs f as one timed step (a failure inside stops the test through t).
func (s *smoke) step(name string, f func()) {
	s.t.Helper()
	t0 := time.Now()
	s.t.Logf("step %s", name)
	f()
	s.steps = append(s.steps, Step{name, time.Since(t0).Seconds()})
}

// report logs each step's time and the total, also to $FLOWPLANE_SMOKE_LOG.
func (s *smoke) report(start time.Time) {
	var b strings.Builder
	status := "passed"
	if s.t.Failed() {
		status = "FAILED"
	}
	fmt.Fprintf(&b, "release smoke test %s in %.1fs:\n", status, time.Since(start).Seconds())
	for _, st := range s.steps {
		fmt.Fprintf(&b, "  %6.1fs  %s\n", st.Seconds, st.Name)
	}
	s.t.Log(b.String())
	appendLog(s.t, b.String())
}

func (s *smoke) cmd(name string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	s.t.Cleanup(cancel)
	path := strings.Join(s.path, ":")
	cmd := exec.CommandContext(ctx, name, args...)
	if !strings.Contains(name, "/") {
		// Look the program up in the smoke PATH, not the test's.
		cmd = exec.CommandContext(ctx, lookPath(s.t, name, s.path), args...)
		cmd.Args[0] = name
	}
	cmd.Env = append([]string{"PATH=" + path}, s.env...)
	cmd.Dir = s.tmp
	return cmd
}

// run runs a command and returns its standard output; it fails the test on an error.
func (s *smoke) run(name string, args ...string) string {
	s.t.Helper()
	cmd := s.cmd(name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		s.t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

func lookPath(t *testing.T, name string, path []string) string {
	for _, dir := range path {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	t.Fatalf("%s is not on the smoke test's PATH %v", name, path)
	return ""
}

// linkTools fills dir with symlinks to the host tools the smoke test and the release need: the
// interpreter of analytics/.venv as python3 (so the wheelhouse fits it).
func linkTools(t *testing.T, root, dir string) {
	tools := []string{
		"bash", "sh", "tar", "gzip", // unpacking, completion
		"ping", "tc", // traffic in the lab; prio router apply runs tc
		"man", "nroff", "groff", "troff", "grotty", "tbl", "preconv", "col", "locale", // man -l
	}
	for _, name := range tools {
		p, err := exec.LookPath(name)
		if err != nil {
			testenv.Unavailable(t, "%s is not installed: run make setup", name)
		}
		if err := os.Symlink(p, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(filepath.Join(root, "analytics/.venv/bin/python"), "-c", "import sys; print(sys._base_executable)").Output()
	if err != nil {
		testenv.Unavailable(t, "analytics/.venv has no python (%v): run make setup", err)
	}
	if err := os.Symlink(strings.TrimSpace(string(out)), filepath.Join(dir, "python3")); err != nil {
		t.Fatal(err)
	}
}

// checkTree checks what the unpacked tarball holds and that the binary is static.
func checkTree(t *testing.T, top string) {
	t.Helper()
	for _, f := range []string{"flowplane", "README.md", "LICENSE", "man/man1/flowplane.1", "man/man1/flowplane-conntrack-run.1",
		"man/man1/flowplane-lab-up.1", "completions/flowplane.bash", "completions/_flowplane", "completions/flowplane.fish"} {
		if _, err := os.Stat(filepath.Join(top, f)); err != nil {
			t.Errorf("the tarball has no %s: %v", f, err)
		}
	}
	st, err := os.Stat(filepath.Join(top, "flowplane"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o755 {
		t.Errorf("flowplane has mode %v, want 0755", st.Mode().Perm())
	}
	f, err := elf.Open(filepath.Join(top, "flowplane"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("flowplane has an ELF interpreter: not a static binary")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("flowplane needs shared libraries %v", libs)
	}
}

// verifySums checks SHA256SUMS as sha256sum -c does, and that it lists the files the test uses.
func verifySums(t *testing.T, dist string, need ...string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatalf("%v (is %s a release? make release writes one)", err, dist)
	}
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS: bad line %q", sc.Text())
		}
		f, err := os.ReadFile(filepath.Join(dist, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := sha256.Sum256(f); hex.EncodeToString(got[:]) != sum {
			t.Fatalf("SHA256SUMS: %s does not match", name)
		}
		listed[name] = true
	}
	for _, f := range need {
		if !listed[filepath.Base(f)] {
			t.Fatalf("%s has no %s: not this commit's release? (make release)", dist, filepath.Base(f))
		}
	}
}

// leftovers lists the paths of flowplane's state, the named namespaces and the top cgroups
// whose names are ours.
func leftovers(ours func(name string) bool) []string {
	var left []string
	for _, dir := range []string{"/run/flowplane", "/sys/fs/bpf/flowplane", "/run/netns"} {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && ours(d.Name()) {
				left = append(left, p)
			}
			return nil
		})
	}
	if ents, err := os.ReadDir(cgroupRootOr("")); err == nil {
		for _, e := range ents {
			if ours(e.Name()) {
				left = append(left, e.Name())
			}
		}
	}
	return left
}

func cgroupRoot(t *testing.T) string {
	r := cgroupRootOr("")
	if r == "" {
		t.Fatal("no cgroup2 mount")
	}
	return r
}

// cgroupRootOr returns the first cgroup2 mount point, or def.
func cgroupRootOr(def string) string {
	data, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return def
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	return def
}

// labStatus is what `flowplane lab status --json` says, the parts the test reads.
type labStatus struct {
	Nodes []labNode
}

type labNode struct {
	Name       string
	Netns      string
	Interfaces []labIface
}

type labIface struct{ Name, Device, IPv4 string }

func (st labStatus) node(t *testing.T, name string) labNode {
	t.Helper()
	i := slices.IndexFunc(st.Nodes, func(n labNode) bool { return n.Name == name })
	if i < 0 {
		t.Fatalf("lab status has no node %s", name)
	}
	return st.Nodes[i]
}

func (st labStatus) iface(t *testing.T, node, name string) labIface {
	t.Helper()
	for _, i := range st.node(t, node).Interfaces {
		if i.Name == name {
			return i
		}
	}
	t.Fatalf("lab status has no %s:%s", node, name)
	return labIface{}
}

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func randHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// regexpLine tells whether a line of text starts with the pattern.
func regexpLine(text, pattern string) bool {
	return regexp.MustCompile("(?m)^" + pattern).MatchString(text)
}
