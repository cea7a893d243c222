// Command flowplane tracks, tunes, prioritizes and measures network flows. Each subsystem lives
// in internal/<name> and contributes one subcommand; internal/commands wires them into one tree
// and main runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/commands"
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
		if !cli.Quiet(err) {
			fmt.Fprintf(os.Stderr, "flowplane: %v\n", err)
		}
		os.Exit(cli.ExitCode(err))
	}
}

// run runs the command line args until done or ctx is cancelled.
func run(ctx context.Context, args []string) error {
	root := commands.Root()
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}
