package altmark

import (
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

// $FLOWPLANE_ANALYTICS first, then PATH; a checkout's venv is not searched.
func TestFindAnalyticsEnvThenPath(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	want := fakeScript(t, dir, "exit 0")
	got, err := findAnalytics(func(string) string { return want }, func(string) (string, error) { return "/elsewhere", nil })
	if err != nil || got != want {
		t.Errorf("with $%s: %q, %v; want %q", analyticsEnv, got, err, want)
	}
	got, err = findAnalytics(func(string) string { return "" }, func(string) (string, error) { return want, nil })
	if err != nil || got != want {
		t.Errorf("from PATH: %q, %v; want %q", got, err, want)
	}
	if _, err := findAnalytics(func(string) string { return dir }, nil); err == nil {
		t.Error("a directory in $" + analyticsEnv + " was taken for the script")
	}
}

func TestFindAnalyticsMissingIsUsageError(t *testing.T) {
	t.Parallel()
	_, err := findAnalytics(func(string) string { return "" }, func(string) (string, error) { return "", exec.ErrNotFound })
	if err == nil || !strings.Contains(err.Error(), "pip install flowplane-analytics") {
		t.Fatalf("err = %v, want the pip command", err)
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
	if !cli.Quiet(err) || cli.ExitCode(err) != 3 {
		t.Fatalf("err = %v, want the script's exit code 3", err)
	}
	got, _ := os.ReadFile(out)
	if string(got) != "loss\n--data\nd\n--format\ncsv\n" {
		t.Fatalf("args passed: %q", got)
	}
}

// TestAnalyzeRunsRealPackage runs the package make setup installed in this checkout, found
// through $FLOWPLANE_ANALYTICS as a user of a checkout would point at it, on the RFC-style
// example graph.
func TestAnalyzeRunsRealPackage(t *testing.T) {
	t.Setenv(analyticsEnv, analyticsScriptPath(t))
	exe, err := FindAnalytics()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(exe, "clusters", "--topology", "../../analytics/tests/data/rfc_example.yaml", "--format", "csv").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", exe, err, out)
	}
	want := "cluster,label,inputs,outputs,links\nC1,\"1 → 2,3\",1,2 3,2\n"
	if !strings.HasPrefix(string(out), want) {
		t.Fatalf("output:\n%s\nwant it to start with:\n%s", out, want)
	}
}
