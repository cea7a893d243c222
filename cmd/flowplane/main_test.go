package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/testenv"
)

// The test binary doubles as flowplane: run with FLOWPLANE_MAIN=1 it is the command itself, so
// these tests check exit codes and output of the real CLI.
func TestMain(m *testing.M) {
	if os.Getenv("FLOWPLANE_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func flowplane(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "FLOWPLANE_MAIN=1")
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func TestUsageErrorsExit2(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    rate: fast\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"lab", "up", "--config", bad}, bad + `:5: links[0].rate: "fast" is not a rate`},
		{[]string{"lab", "up", "--config", filepath.Join(dir, "missing.yaml")}, "no such file or directory"},
		{[]string{"lab", "up"}, "flowplane lab up needs --config; usage: flowplane lab up --config FILE [--name N]"},
		{[]string{"lab", "up", "--config", bad, "x", "y"}, "flowplane lab up takes 0 argument(s), got 2"},
		{[]string{"lab", "down"}, "give a lab name or --all"},
		{[]string{"lab", "status", "nosuchlab"}, `lab "nosuchlab": no such lab`},
		{[]string{"lab", "up", "--bogus", "--config", bad}, "unknown flag: --bogus"},
		{[]string{"nosuch"}, `unknown command "nosuch"`},
		{[]string{"lab", "nosuch"}, `unknown command "nosuch" for "flowplane lab"`},
		{[]string{"prio", "host", "nosuch"}, `unknown command "nosuch" for "flowplane prio host"`},
		{[]string{"-v", "vnet", "exec"}, "flowplane vnet exec needs --config"},
		{[]string{"help", "lab", "nosuch"}, `help: no command "lab nosuch"`},
		{[]string{"prio", "router", "--dev", "x"}, "flowplane prio router needs --dev, --rate and --policy"},
		{[]string{"completion", "fish2"}, `unknown command "fish2" for "flowplane completion"; did you mean fish?`},
		{[]string{"completion", "bash", "extra"}, "flowplane completion bash takes 0 argument(s), got 1"},
	} {
		_, stderr, code := flowplane(t, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("flowplane %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(c.args, " "), code, stderr, c.want)
		}
	}
}

// TestVerboseIsGlobal: one -v for the whole binary, before or after the subcommand; vnet's
// protocol events (debug level) show with it and only with it.
func TestVerboseIsGlobal(t *testing.T) {
	t.Parallel()
	topology := "../../internal/vnet/testdata/line.yaml"
	script := []string{"-c", "h1 send 198.18.2.2 hi", "-c", "sleep 300ms"}
	for _, c := range []struct {
		args  []string
		debug bool
	}{
		{append([]string{"-v", "vnet", "exec", "--config", topology}, script...), true},
		{append([]string{"vnet", "exec", "--verbose", "--config", topology}, script...), true},
		{append([]string{"vnet", "exec", "--config", topology}, script...), false},
	} {
		out, stderr, code := flowplane(t, c.args...)
		if code != 0 || strings.Contains(stderr, `level=DEBUG msg="test message"`) != c.debug {
			t.Errorf("flowplane %s: exit %d, want 0 and debug messages %v\n%s%s", strings.Join(c.args, " "), code, c.debug, out, stderr)
		}
	}
}

// TestSignalStopsCleanly: SIGINT and SIGTERM, handled once in main, cancel the command's
// context; vnet up (running as a daemon once stdin is at EOF) stops and exits 0.
func TestSignalStopsCleanly(t *testing.T) {
	t.Parallel()
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGTERM} {
		cmd := exec.Command(os.Args[0], "vnet", "up", "--config", "../../internal/vnet/testdata/line.yaml", "--base-port", "-1")
		cmd.Env = append(os.Environ(), "FLOWPLANE_MAIN=1")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || !strings.Contains(line, "links up") {
			_ = cmd.Process.Kill()
			t.Fatalf("vnet up: %q, %v", line, err)
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("vnet up after %v: %v, want exit 0", sig, err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("vnet up still running 10s after %v", sig)
		}
	}
}

func TestLabLifecycle(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "ping")
	name := "c" + testenv.Name("")[2:]
	file := filepath.Join(t.TempDir(), "lab.yaml")
	if err := os.WriteFile(file, []byte("nodes: {h1: {env: {X: y}}, r1: {kind: router}, h2: {}}\nlinks:\n  - endpoints: [h1, r1]\n  - endpoints: [r1, h2]\n    loss: 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, stderr, code := flowplane(t, "lab", "up", "--name", name, "--config", file); code != 0 || out != "lab "+name+": up, 3 nodes, 2 links\n" {
		t.Fatalf("lab up: exit %d: %q %s", code, out, stderr)
	}
	t.Cleanup(func() { _ = lab.Down(name) })
	// Up again: from the same file, nothing to restart (no relays); from another, refused.
	if out, stderr, code := flowplane(t, "lab", "up", "--name", name, "--config", file); code != 0 || out != "lab "+name+": already up, nothing to restart\n" {
		t.Errorf("second up: exit %d: %q %s", code, out, stderr)
	}
	other := filepath.Join(t.TempDir(), "other.yaml")
	if err := os.WriteFile(other, []byte("nodes: {h1: {}, h2: {}}\nlinks:\n  - endpoints: [h1, h2]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := flowplane(t, "lab", "up", "--name", name, "--config", other); code != 2 || !strings.Contains(stderr, "a lab of that name is running from another topology") {
		t.Errorf("up of another topology: exit %d: %s", code, stderr)
	}
	out, _, code := flowplane(t, "lab", "list")
	if code != 0 || !strings.Contains(out, name) {
		t.Errorf("lab list: exit %d:\n%s", code, out)
	}
	out, _, code = flowplane(t, "lab", "list", "--json")
	var labs []lab.ListEntry
	if err := json.Unmarshal([]byte(out), &labs); code != 0 || err != nil || !slices.ContainsFunc(labs, func(e lab.ListEntry) bool {
		return e.Name == name && e.Nodes == 3 && e.Links == 2 && e.File == file && e.Created != nil
	}) {
		t.Errorf("lab list --json: exit %d, %v:\n%s", code, err, out)
	}
	out, _, code = flowplane(t, "lab", "status", name, "--json")
	var st lab.Status
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("status --json: exit %d, %v:\n%s", code, err, out)
	}
	if len(st.Nodes) != 3 || st.Nodes[2].Ifaces[0].Loss == nil || !st.Nodes[0].Ifaces[0].Up {
		t.Errorf("status: %+v", st)
	}
	if out, _, _ := flowplane(t, "lab", "status", name); !strings.Contains(out, "r1:eth1 — h2:eth0") {
		t.Errorf("status text:\n%s", out)
	}
	for _, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"h1", "--", "sh", "-c", "echo $X $FP_NODE; exit 7"}, 7, "y h1\n"},
		{[]string{"h2", "--", "ping", "-c1", "-W2", "198.18.0.1"}, 0, "1 received"},
		{[]string{"h1", "--", "/nonexistent"}, 127, ""},
		{[]string{"nosuch", "--", "true"}, 2, ""},
	} {
		out, stderr, code := flowplane(t, append([]string{"lab", "exec", name}, c.args...)...)
		if code != c.code || !strings.Contains(out, c.out) {
			t.Errorf("lab exec %s: exit %d (want %d), out %q (want %q), stderr %q", strings.Join(c.args, " "), code, c.code, out, c.out, stderr)
		}
	}
	if out, stderr, code := flowplane(t, "lab", "down", name); code != 0 || out != "lab "+name+": down\n" {
		t.Errorf("lab down: exit %d: %q %s", code, out, stderr)
	}
	if _, _, code := flowplane(t, "lab", "down", name); code != 2 {
		t.Errorf("second down: exit %d, want 2", code)
	}
}
