package altmark

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/spf13/cobra"
)

// analyticsScript is the console script of the Python package flowplane-analytics (analytics/;
// make setup installs it into analytics/.venv/bin).
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
		Long: "Runs flowplane-analytics (the Python package; $" + analyticsEnv + ", else PATH): " +
			"collect, compact, clusters, loss, delay, paths, report, synth. `analyze --help` shows its help.",
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
func FindAnalytics() (string, error) { return findAnalytics(os.Getenv, exec.LookPath) }

// findAnalytics looks for the console script: $FLOWPLANE_ANALYTICS, then PATH; never in a
// checkout, so an installed binary runs the analytics that are installed.
func findAnalytics(getenv func(string) string, lookPath func(string) (string, error)) (string, error) {
	if p := getenv(analyticsEnv); p != "" {
		if isExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("$%s=%s is not an executable file", analyticsEnv, p)
	}
	if p, err := lookPath(analyticsScript); err == nil {
		return p, nil
	}
	return "", errors.New("altmark analyze: flowplane-analytics is not installed (not on PATH, $" + analyticsEnv + " unset): " +
		"pip install flowplane-analytics (with Spark: pip install 'flowplane-analytics[spark]'), or set $" + analyticsEnv +
		" to its path; in a flowplane checkout `make setup` installs it in analytics/.venv/bin")
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

func runAnalytics(ctx context.Context, exe string, args []string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	c := exec.CommandContext(ctx, exe, args...)
	// flowplane's SIGINT or SIGTERM passed on as SIGTERM: the analytics stop their Spark cleanly
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cli.Run(c)
	if err != nil && !cli.Quiet(err) {
		return fmt.Errorf("altmark analyze: run %s: %w", exe, err)
	}
	return err
}
