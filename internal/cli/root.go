package cli

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/attach"
)

// Root is the top command holding the subsystems' commands, with what the whole binary shares:
// one -v/--verbose flag (slog's default logger at debug level; the subcommands log through
// slog's default), bad flags and unknown commands as usage errors (exit code 2), and no usage
// text or error printed by cobra (the caller prints the error once).
func Root(use, short string, subcommands ...*cobra.Command) *cobra.Command {
	root := &cobra.Command{
		Use:           use,
		Short:         short,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	verbose := root.PersistentFlags().BoolP("verbose", "v", false, "log debug messages")
	root.PersistentPreRun = func(*cobra.Command, []string) {
		level := slog.LevelInfo
		if *verbose {
			level = slog.LevelDebug
		}
		// The process's stderr, not cmd.ErrOrStderr(): the default logger outlives the command.
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
		attach.Warn = func(msg string) { fmt.Fprintln(os.Stderr, "warning:", msg) }
	}
	// Subcommands inherit the flag error function.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return Usage(err) })
	root.SetHelpCommand(helpCommand())
	root.AddCommand(subcommands...)
	// Cobra adds its completion command when the tree runs; added here, the checks below
	// cover it too (an unknown shell was help and exit 0, an extra argument exit 1). Its shell
	// commands write to stdout whatever a later SetOut says: cobra takes the writer as it
	// builds them.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			for _, shell := range c.Commands() {
				shell.Args = ExactArgs(0)
			}
		}
	}
	requireSubcommand(root)
	return root
}

// helpCommand is `help [COMMAND]...` as cobra's, except that an unknown topic is a usage
// error (cobra's printed the usage and exited 0).
func helpCommand() *cobra.Command {
	return &cobra.Command{
		Use:                   "help [COMMAND]...",
		Short:                 "Help about any command",
		DisableFlagsInUseLine: true,
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return Usagef("help: no command %q; run %s help for the list", strings.Join(args, " "), c.Root().Name())
			}
			cmd.InitDefaultHelpFlag() // as --help shows it, -h listed
			cmd.InitDefaultVersionFlag()
			return cmd.Help()
		},
		ValidArgsFunction: func(c *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var out []cobra.Completion
			for _, s := range cmd.Commands() {
				if s.IsAvailableCommand() && strings.HasPrefix(s.Name(), toComplete) {
					out = append(out, cobra.CompletionWithDesc(s.Name(), s.Short))
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		},
	}
}

// requireSubcommand makes every command that only groups others (no Run of its own) print its
// help when called bare and refuse an unknown subcommand with a usage error. Cobra's own check
// is an untyped error on the root only; below it, an unknown word printed help and exited 0.
func requireSubcommand(cmd *cobra.Command) {
	for _, sub := range cmd.Commands() {
		requireSubcommand(sub)
	}
	cmd.DisableFlagsInUseLine = true // Use lines are the synopses of docs/cli.md, flags included
	if !cmd.HasSubCommands() || cmd.Runnable() {
		return
	}
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, which it sets only in its own check
	}
	cmd.Args = unknownCommand
	cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
}
