package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestExitCode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want int
	}{
		{errors.New("plain"), 1},
		{Usagef("bad %s", "flag"), 2},
		{fmt.Errorf("wrapped: %w", Usage(errors.New("bad"))), 2},
	} {
		if got := ExitCode(c.err); got != c.want {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
	if Usage(nil) != nil {
		t.Error("Usage(nil) is not nil")
	}
	inner := errors.New("inner")
	if err := Usage(inner); !errors.Is(err, inner) || err.Error() != "inner" {
		t.Errorf("Usage(inner) = %v: want it to wrap inner and say only its message", err)
	}
}

func TestArgChecks(t *testing.T) {
	t.Parallel()
	cmd := &cobra.Command{Use: "up FILE"}
	for _, c := range []struct {
		check cobra.PositionalArgs
		args  []string
		want  string // "" for no error
	}{
		{ExactArgs(1), []string{"a"}, ""},
		{ExactArgs(1), nil, "up takes 1 argument(s), got 0; usage: up FILE"},
		{ExactArgs(0), []string{"a"}, "takes 0 argument(s), got 1"},
		{RangeArgs(1, 2), []string{"a", "b"}, ""},
		{RangeArgs(1, 2), []string{"a", "b", "c"}, "up takes 1 to 2 arguments, got 3"},
		{RangeArgs(1, 2), nil, "got 0"},
	} {
		err := c.check(cmd, c.args)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v, want no error", c.args, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || ExitCode(err) != 2):
			t.Errorf("%v: %v (exit %d), want a usage error with %q", c.args, err, ExitCode(err), c.want)
		}
	}
}

// testRoot is a root with a group "lab" holding "up FILE" (which says whether slog's default
// logs debug messages).
func testRoot(out *bytes.Buffer) *cobra.Command {
	lab := &cobra.Command{Use: "lab", Short: "labs"}
	lab.AddCommand(&cobra.Command{
		Use:  "up FILE",
		Args: ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			debug := slog.Default().Enabled(cmd.Context(), slog.LevelDebug)
			fmt.Fprintf(cmd.OutOrStdout(), "up %s debug=%v\n", args[0], debug)
			return cmd.Context().Err()
		},
	})
	root := Root("fp", "test root", lab)
	root.SetOut(out)
	root.SetErr(out)
	return root
}

// TestRoot runs commands through Root (not in parallel: -v sets slog's default logger).
func TestRoot(t *testing.T) {
	defer slog.SetDefault(slog.Default())
	for _, c := range []struct {
		args    []string
		code    int    // exit code of the error; 0 for none
		want    string // in the error, or else in the output
		notWant string // not in the output
	}{
		{[]string{"lab", "up", "x.yaml"}, 0, "up x.yaml debug=false", ""},
		{[]string{"-v", "lab", "up", "x.yaml"}, 0, "up x.yaml debug=true", ""},
		{[]string{"lab", "up", "--verbose", "x.yaml"}, 0, "up x.yaml debug=true", ""},
		{[]string{"nosuch"}, 2, `unknown command "nosuch" for "fp"`, ""},
		{[]string{"lab", "dwon"}, 2, `unknown command "dwon" for "fp lab"`, ""},
		{[]string{"lb"}, 2, "did you mean lab?", ""},
		{[]string{"lab", "up", "--bogus", "x"}, 2, "unknown flag: --bogus", ""},
		{[]string{"-x", "lab"}, 2, "unknown shorthand flag: 'x'", ""},
		{[]string{"lab", "up"}, 2, "takes 1 argument(s)", ""},
		{[]string{"lab"}, 0, "Available Commands", ""},
		{nil, 0, "Available Commands", ""},
	} {
		var out bytes.Buffer
		root := testRoot(&out)
		root.SetArgs(c.args)
		err := root.ExecuteContext(context.Background())
		if code := exitCode(err); code != c.code {
			t.Errorf("%v: error %v (exit %d), want exit %d", c.args, err, code, c.code)
			continue
		}
		got := out.String()
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, c.want) || c.notWant != "" && strings.Contains(got, c.notWant) {
			t.Errorf("%v: got %q; want %q and not %q", c.args, got, c.want, c.notWant)
		}
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	return ExitCode(err)
}

// TestRootPassesContext: subcommands see the context the caller gave (main's, cancelled on
// SIGINT and SIGTERM).
func TestRootPassesContext(t *testing.T) {
	defer slog.SetDefault(slog.Default())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	root := testRoot(&out)
	root.SetArgs([]string{"lab", "up", "x"})
	if err := root.ExecuteContext(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("subcommand's context error %v, want context.Canceled", err)
	}
}

func TestCount(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]string{0: "0 links", 1: "1 link", 2: "2 links"} {
		if got := Count(n, "link"); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
	if got := Count(4, "leaf", "leaves"); got != "4 leaves" {
		t.Errorf("Count(4, leaf) = %q", got)
	}
}
