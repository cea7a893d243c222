// Package cli holds what every subcommand shares: usage errors that exit with code 2 and
// argument checks that produce them.
package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/attach"
)

// ExitCoder is an error that chooses the process's exit code.
type ExitCoder interface {
	error
	ExitCode() int
}

// UsageError is bad input from the user: a wrong flag, argument or configuration file. It
// exits with code 2, before anything was changed.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }
func (e *UsageError) ExitCode() int { return 2 }

// Usage marks err as a usage error (nil stays nil).
func Usage(err error) error {
	if err == nil {
		return nil
	}
	return &UsageError{Err: err}
}

// Usagef formats a usage error.
func Usagef(format string, args ...any) error { return Usage(fmt.Errorf(format, args...)) }

// ExitCode is the code the process should exit with for err.
func ExitCode(err error) int {
	var ec ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

// ExactArgs is cobra.ExactArgs returning a usage error that shows the command's use line.
func ExactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return Usagef("%s takes %d argument(s), got %d; usage: %s", cmd.CommandPath(), n, len(args), cmd.UseLine())
		}
		return nil
	}
}

// RangeArgs is cobra.RangeArgs returning a usage error.
func RangeArgs(min, max int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || len(args) > max {
			return Usagef("%s takes %d to %d arguments, got %d; usage: %s", cmd.CommandPath(), min, max, len(args), cmd.UseLine())
		}
		return nil
	}
}

// StatusCommand is a subsystem's `status [--json]`: read the state, then print it as text or
// as indented JSON.
func StatusCommand[T any](short string, read func() (T, error), print func(io.Writer, T)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [--json]",
		Short: short,
		Args:  ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := read()
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			print(cmd.OutOrStdout(), st)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// Cleaned tells stderr, as a warning, what a crash had left that the command cleaned before
// its work (internal/attach); stdout keeps its one line. Nothing when p is nil.
func Cleaned(cmd *cobra.Command, p *attach.Problem) {
	if p != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: cleaned what was left of %s: %s\n", p.What, p.Why)
	}
}

// Warn prints each warning of a configuration on cmd's stderr: "warning: file:line: field: …".
func Warn(cmd *cobra.Command, warnings ...string) {
	for _, w := range warnings {
		fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
	}
}

// PrintLeftovers lists, after a status, what a crash left (internal/attach) and which command
// cleans it.
func PrintLeftovers(w io.Writer, ps []attach.Problem, cleaner string) {
	for _, p := range ps {
		fmt.Fprintf(w, "leftover: %s: %s (the next %s cleans it)\n", p.What, p.Why, cleaner)
	}
}

// Applied reports an apply through internal/attach: what it cleaned first (Cleaned) and the
// verb of its one line, "applied" or "replaced". An error matching one of usage is a usage
// error (exit 2).
func Applied(cmd *cobra.Command, res attach.Result, err error, usage ...error) (string, error) {
	Cleaned(cmd, res.Cleaned)
	if err != nil {
		return "", usageIf(err, usage)
	}
	if res.Replaced {
		return "replaced", nil
	}
	return "applied", nil
}

// Removed reports a remove through internal/attach: what it cleaned (Cleaned); nothing to
// remove (os.ErrNotExist, or an error matching one of usage) is a usage error naming it.
func Removed(cmd *cobra.Command, res attach.Result, err error, usage ...error) error {
	Cleaned(cmd, res.Cleaned)
	return usageIf(err, append(usage, os.ErrNotExist))
}

func usageIf(err error, usage []error) error {
	for _, u := range usage {
		if errors.Is(err, u) {
			return Usage(err)
		}
	}
	return err
}

// Count is "1 link", "2 links": n and the noun, plural with an s unless n is 1, or the
// plural given ("leaves").
func Count(n int, noun string, plural ...string) string {
	switch {
	case n == 1:
		return "1 " + noun
	case len(plural) > 0:
		return fmt.Sprintf("%d %s", n, plural[0])
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
