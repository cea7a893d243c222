// Command flowplane tracks, tunes, prioritizes and measures network flows. Each subsystem lives
// in internal/<name> and contributes one subcommand; main only wires them together.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/altmark"
	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/conntrack"
	"github.com/flowplane/flowplane/internal/hostcheck"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/prio"
	"github.com/flowplane/flowplane/internal/tune"
	"github.com/flowplane/flowplane/internal/version"
	"github.com/flowplane/flowplane/internal/vnet"
)

func main() {
	// The one place signals are handled: SIGINT and SIGTERM cancel the context every
	// subcommand gets from cmd.Context(). After the first, the default comes back, so a second
	// Ctrl-C kills a process that is slow to stop.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }()
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "flowplane: %v\n", err)
		os.Exit(cli.ExitCode(err))
	}
}

// run runs the command line args until done or ctx is cancelled.
func run(ctx context.Context, args []string) error {
	root := newRoot()
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

// newRoot is the whole command tree (docs/cli.md; grammar_test.go checks it).
func newRoot() *cobra.Command {
	return cli.Root("flowplane", "Track, tune, prioritize and measure network flows",
		lab.Command(), conntrack.Command(), tune.Command(), vnet.Command(), prio.Command(), altmark.Command(),
		version.Command(), hostcheck.Command(altmark.FindAnalytics))
}
