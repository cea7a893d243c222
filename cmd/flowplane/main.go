// Command flowplane tracks, tunes, prioritizes and measures network flows. Each subsystem lives
// in internal/<name> and contributes one subcommand; main only wires them together.
package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/altmark"
	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/conntrack"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/tune"
	"github.com/flowplane/flowplane/internal/vnet"
)

func main() {
	root := &cobra.Command{
		Use:           "flowplane",
		Short:         "Track, tune, prioritize and measure network flows",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	verbose := root.PersistentFlags().BoolP("verbose", "v", false, "log debug messages")
	root.PersistentPreRun = func(*cobra.Command, []string) {
		level := slog.LevelInfo
		if *verbose {
			level = slog.LevelDebug
		}
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return cli.Usage(err) })
	root.AddCommand(lab.Command())
	root.AddCommand(conntrack.Command())
	root.AddCommand(tune.Command())
	root.AddCommand(vnet.Command())
	root.AddCommand(altmark.Command())
	if err := root.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "flowplane: %v\n", err)
		code := cli.ExitCode(err)
		if strings.HasPrefix(err.Error(), "unknown command") { // cobra's, not typed
			code = 2
		}
		os.Exit(code)
	}
}
