package altmark

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flowplane/flowplane/internal/cli"
)

func fakeScript(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "analytics", ".venv", "bin", analyticsScript)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFindAnalyticsNearBinary(t *testing.T) {
	t.Parallel()
	repo := t.TempDir()
	want := fakeScript(t, repo, "exit 0")
	bin := filepath.Join(repo, "bin", "flowplane")
	got, err := findAnalytics(func(string) string { return "" },
		func() (string, error) { return bin, nil },
		func() (string, error) { return "/", nil })
	if err != nil || got != want {
		t.Fatalf("findAnalytics = %q, %v; want %q", got, err, want)
	}
}

func TestFindAnalyticsMissingIsUsageError(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	empty := t.TempDir()
	_, err := findAnalytics(func(string) string { return "" },
		func() (string, error) { return filepath.Join(empty, "flowplane"), nil },
		func() (string, error) { return empty, nil })
	if err == nil || !strings.Contains(err.Error(), "make setup") {
		t.Fatalf("err = %v, want a message saying to run make setup", err)
	}
	if code := cli.ExitCode(cli.Usage(err)); code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
}

func TestAnalyzePassesArgsAndExitCode(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "args")
	exe := fakeScript(t, dir, `printf '%s\n' "$@" > `+out+`; exit 3`)
	t.Setenv(analyticsEnv, exe)
	cmd := analyzeCommand()
	cmd.SetArgs([]string{"loss", "--data", "d", "--format", "csv"})
	err := cmd.Execute()
	var ee *exitError
	if !errors.As(err, &ee) || cli.ExitCode(err) != 3 {
		t.Fatalf("err = %v, want the script's exit code 3", err)
	}
	got, _ := os.ReadFile(out)
	if string(got) != "loss\n--data\nd\n--format\ncsv\n" {
		t.Fatalf("args passed: %q", got)
	}
}

// TestAnalyzeRunsRealPackage runs the package make setup installed (found above the test's
// working directory, internal/altmark) on the RFC-style example graph.
func TestAnalyzeRunsRealPackage(t *testing.T) {
	t.Parallel()
	exe, err := findAnalytics(func(string) string { return "" },
		func() (string, error) { return "", errors.New("none") }, os.Getwd)
	if err != nil {
		t.Fatalf("%v (make test runs make setup first)", err)
	}
	out, err := exec.Command(exe, "clusters", "../../analytics/tests/data/rfc_example.yaml", "--format", "csv").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", exe, err, out)
	}
	want := "cluster,label,inputs,outputs,links\nC1,\"1 → 2,3\",1,2 3,2\n"
	if !strings.HasPrefix(string(out), want) {
		t.Fatalf("output:\n%s\nwant it to start with:\n%s", out, want)
	}
}
