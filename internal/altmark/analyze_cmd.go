package altmark

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/spf13/cobra"
)

// analyticsScript is the console script of the Python package analytics/ (make setup installs
// it into analytics/.venv).
const analyticsScript = "flowplane-analytics"

// analyticsEnv names the script explicitly, overriding the search.
const analyticsEnv = "FLOWPLANE_ANALYTICS"

// analyzeCommand runs the analytics package's command line with the arguments as given:
// `flowplane altmark analyze loss --data DIR --topology FILE` is
// `flowplane-analytics loss --data DIR --topology FILE`.
func analyzeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "analyze COMMAND [ARGS...]",
		Short: "Clusters, loss, delay and reports from period records (runs flowplane-analytics)",
		Long: "Runs the analytics package (analytics/, Python) installed by `make setup`: " +
			"collect, clusters, loss, delay, paths, report, synth. `analyze --help` shows its help.",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			exe, err := FindAnalytics()
			if err != nil {
				return cli.Usage(err)
			}
			return runAnalytics(cmd.Context(), exe, args)
		},
	}
}

// FindAnalytics is where `altmark analyze` finds the analytics' console script (flowplane check
// reports it).
func FindAnalytics() (string, error) { return findAnalytics(os.Getenv, os.Executable, os.Getwd) }

// findAnalytics looks for the console script: $FLOWPLANE_ANALYTICS, then analytics/.venv/bin
// in the directory of the binary or any directory above it (bin/flowplane in a checkout), then
// the same above the working directory, then PATH.
func findAnalytics(getenv func(string) string, executable func() (string, error), getwd func() (string, error)) (string, error) {
	if p := getenv(analyticsEnv); p != "" {
		if isExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("$%s=%s is not an executable file", analyticsEnv, p)
	}
	var starts []string
	if exe, err := executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		starts = append(starts, filepath.Dir(exe))
	}
	if wd, err := getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, dir := range starts {
		for d := dir; ; d = filepath.Dir(d) {
			p := filepath.Join(d, "analytics", ".venv", "bin", analyticsScript)
			if isExecutable(p) {
				return p, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if p, err := exec.LookPath(analyticsScript); err == nil {
		return p, nil
	}
	return "", errors.New("altmark analyze: the analytics package is not installed " +
		"(no analytics/.venv/bin/flowplane-analytics near the binary or the working directory, " +
		"none on PATH): run `make setup` in the flowplane checkout, or set $" + analyticsEnv)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// exitError carries the analytics' exit code out of flowplane.
type exitError struct{ code int }

func (e *exitError) Error() string {
	return fmt.Sprintf("altmark analyze: %s exited with code %d", analyticsScript, e.code)
}
func (e *exitError) ExitCode() int { return e.code }

func runAnalytics(ctx context.Context, exe string, args []string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	c := exec.CommandContext(ctx, exe, args...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := c.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee) && ee.ExitCode() > 0:
		return &exitError{code: ee.ExitCode()}
	default:
		return fmt.Errorf("altmark analyze: run %s: %w", exe, err)
	}
}
