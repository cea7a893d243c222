package tune

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/testenv"
)

// runCLI runs `flowplane tune args...` under the binary's root (its flags and usage errors).
func runCLI(args ...string) (string, error) {
	cmd := cli.Root("flowplane", "", Command())
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"tune"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

// TestApplyBadInputAttachesNothing: a bad policy exits 2 naming the field, and leaves no
// record, pin or cgroup behind.
func TestApplyBadInputAttachesNothing(t *testing.T) {
	if _, err := HostKernel(); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	file := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(file, []byte("profiles:\n  a:\n    cwnd_clamp: 0\nrules: [{profile: a}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	name := testenv.Name("tune")
	_, err := runCLI("--name", name, "apply", "--config", file)
	if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "bad.yaml:3: profiles.a.cwnd_clamp") {
		t.Fatalf("apply bad policy: exit %d, %v", cli.ExitCode(err), err)
	}
	for _, p := range []string{runstate.Path(subsystem, name), pin.Path(pinParts(name)...)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists after a rejected apply", p)
		}
	}
	if root, err := cgroup.Mount(); err == nil {
		if _, err := os.Stat(filepath.Join(root, "fptune-"+name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup created for a rejected apply")
		}
	}
}

func TestCLIUsageErrors(t *testing.T) {
	if _, err := HostKernel(); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	good := filepath.Join(t.TempDir(), "good.yaml")
	if err := os.WriteFile(good, []byte("profiles: {a: {cwnd_clamp: 10}}\nrules: [{profile: a}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := cgroup.Mount()
	if err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"apply"}, "needs --config"},
		{[]string{"apply", "--config", "/nonexistent.yaml"}, "no such file"},
		{[]string{"apply", "--config", good, "--cgroup", root}, "is the root cgroup"},
		{[]string{"apply", "--config", good, "--cgroup", "/tmp"}, "not on a cgroup v2 file system"},
		{[]string{"explain", "not-an-address", "--config", good}, "REMOTE"},
		{[]string{"exec"}, "needs a command"},
		{[]string{"--name", "fpnosuchpolicy", "remove"}, `policy "fpnosuchpolicy": not applied`},
		{[]string{"--name", "fpnosuchpolicy", "status"}, `policy "fpnosuchpolicy": not applied`},
	} {
		_, err := runCLI(tc.args...)
		if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: exit %d, %v; want 2 and %q", tc.args, cli.ExitCode(err), err, tc.want)
		}
	}
}

func TestExplainCLI(t *testing.T) {
	if _, err := HostKernel(); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	out, err := runCLI("explain", "198.18.1.2:443", "--config", "../../examples/tune-dc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rule 0 (intra-dc", "TIMEOUT_INIT reply 3 jiffies", "TCP_BPF_SNDCWND_CLAMP 100"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}
	out, err = runCLI("explain", "192.0.2.1:8080", "--config", "../../examples/tune-dc.yaml", "--passive")
	if err != nil || !strings.Contains(out, "no rule matches") {
		t.Errorf("passive to 8080: %v\n%s", err, out)
	}
}

// TestRemoveMovesProcesses: remove takes down the cgroup apply created even while a process
// started in it (`tune exec`) still runs: the process is moved to the parent cgroup first.
func TestRemoveMovesProcesses(t *testing.T) {
	root, good := cgroupAndPolicy(t)
	name := testenv.Name("tune")
	if out, err := runCLI("--name", name, "apply", "--config", good); err != nil || !strings.HasPrefix(out, "tune: applied policy "+name+" on cgroup ") || strings.Count(out, "\n") != 1 {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = Remove(name) }) // in case the test fails before its own remove
	// Applying again swaps the policy atomically, and says so.
	if out, err := runCLI("--name", name, "apply", "--config", good); err != nil || !strings.HasPrefix(out, "tune: replaced policy "+name+" on cgroup ") {
		t.Errorf("second apply: %v\n%s", err, out)
	}
	cg := filepath.Join(root, "fptune-"+name)
	sleep := exec.Command("sleep", "60")
	fd, err := cgroup.Into(sleep, cg)
	if err != nil {
		t.Fatal(err)
	}
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	if out, err := runCLI("--name", name, "remove"); err != nil || out != "tune: removed policy "+name+"\n" {
		t.Fatalf("remove with a process in the cgroup: %v\n%s", err, out)
	}
	if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s still exists after remove", cg)
	}
	procs, err := os.ReadFile(filepath.Join(root, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(sleep.Process.Pid)) {
		t.Errorf("process %d was not moved to the parent cgroup %s", sleep.Process.Pid, root)
	}
}

// TestRunInStopsOnCancel: `tune exec` passes flowplane's SIGINT/SIGTERM (its context ending) on
// to the command as SIGTERM and returns once the command has ended.
func TestRunInStopsOnCancel(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	cg := testCgroup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- RunIn(ctx, cg, []string{"sleep", "60"}, nil, io.Discard, io.Discard) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		procs, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		if len(strings.Fields(string(procs))) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command never appeared in the cgroup")
		}
	}
	cancel()
	select {
	case err := <-done:
		if code := cli.ExitCode(err); code != 128+int(syscall.SIGTERM) {
			t.Errorf("RunIn after cancel: %v (exit code %d), want the command ended by SIGTERM (143)", err, code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RunIn still running 10 s after its context ended")
	}
}

// TestStatusAfterCgroupRemoved: a tuned cgroup removed under the policy (rmdir) leaves a status
// that still reads (the program lives on with the cgroup's sockets, or its link is gone: a
// leftover), and remove still takes it away.
func TestStatusAfterCgroupRemoved(t *testing.T) {
	root, good := cgroupAndPolicy(t)
	name := testenv.Name("tune")
	cg := filepath.Join(root, name)
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Remove(name); _ = os.Remove(cg) })
	if out, err := runCLI("--name", name, "apply", "--config", good, "--cgroup", cg); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	if err := os.Remove(cg); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI("--name", name, "status")
	if err != nil || !(strings.Contains(out, "is gone") || strings.Contains(out, "leftover")) {
		t.Errorf("status after the cgroup was removed: %v\n%s", err, out)
	}
	if out, err := runCLI("--name", name, "remove"); err != nil {
		t.Errorf("remove after the cgroup was removed: %v\n%s", err, out)
	}
}

// cgroupAndPolicy is the cgroup v2 mount and a valid policy file, for a privileged test.
func cgroupAndPolicy(t *testing.T) (root, file string) {
	t.Helper()
	testenv.Privileged(t)
	root, err := cgroup.Mount()
	if err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	file = filepath.Join(t.TempDir(), "good.yaml")
	if err := os.WriteFile(file, []byte("profiles: {a: {cwnd_clamp: 10}}\nrules: [{profile: a}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, file
}
