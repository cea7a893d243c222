package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The grammar (docs/cli.md): flowplane SUBSYSTEM [OBJECT] VERB [ARGS] [FLAGS]. The helpers
// below keep the old spellings working for one release as hidden aliases that print one
// notice line to stderr, and record each old spelling on its command so a test can check that
// every one is hidden and still works.

// DeprecatedKey is the annotation (on commands and flags) holding deprecated spellings, one per
// line, each "old<TAB>replacement".
const DeprecatedKey = "flowplane/deprecated"

// Notice prints the one-line deprecation notice for old to cmd's stderr:
// `flowplane: "lab up FILE" is deprecated; use "lab up --config FILE"`.
func Notice(cmd *cobra.Command, old, replacement string) {
	fmt.Fprintf(cmd.ErrOrStderr(), "%s: %q is deprecated; use %q\n", cmd.Root().Name(), old, replacement)
}

// Deprecates records on cmd that it accepts the deprecated spelling old (written as the notice
// names it, e.g. "lab up FILE"), which the command itself detects and reports with Notice.
func Deprecates(cmd *cobra.Command, old, replacement string) {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	line := old + "\t" + replacement
	if prev := cmd.Annotations[DeprecatedKey]; prev != "" {
		line = prev + "\n" + line
	}
	cmd.Annotations[DeprecatedKey] = line
}

// DeprecatedForms lists the deprecated spellings recorded on cmd: old → replacement.
func DeprecatedForms(cmd *cobra.Command) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(cmd.Annotations[DeprecatedKey], "\n") {
		if old, repl, ok := strings.Cut(l, "\t"); ok {
			out[old] = repl
		}
	}
	return out
}

// Alias turns cmd, a fresh instance of the command that replaces an old one, into that old
// command: named by use (its Use line), hidden, printing the notice before anything else
// (before its arguments are checked).
func Alias(cmd *cobra.Command, use, old, replacement string) *cobra.Command {
	cmd.Use = use
	cmd.Aliases = nil
	cmd.Hidden = true
	cmd.Short = "Deprecated: use " + replacement
	Deprecates(cmd, old, replacement)
	onArgs(cmd, func(c *cobra.Command, _ []string) error {
		Notice(c, old, replacement)
		return nil
	})
	return cmd
}

// AliasFlag adds --alias to cmd as a hidden, deprecated spelling of its flag --target (the same
// value): given, it prints the notice and counts as --target (Changed), so checks of --target
// see it. Both together are a usage error.
func AliasFlag(cmd *cobra.Command, alias, target, old, replacement string) {
	t := cmd.Flags().Lookup(target)
	if t == nil {
		panic("cli.AliasFlag: no flag --" + target + " on " + cmd.Name())
	}
	cmd.Flags().AddFlag(&pflag.Flag{Name: alias, Usage: "deprecated: use --" + target, Value: t.Value, DefValue: t.DefValue, Hidden: true,
		Annotations: map[string][]string{DeprecatedKey: {old + "\t" + replacement}}})
	Deprecates(cmd, old, replacement)
	onArgs(cmd, func(c *cobra.Command, _ []string) error {
		a, t := c.Flags().Lookup(alias), c.Flags().Lookup(target)
		if !a.Changed {
			return nil
		}
		Notice(c, old, replacement)
		if t.Changed {
			return Usagef("--%s and --%s are the same flag; give --%s", alias, target, target)
		}
		t.Changed = true
		return nil
	})
}

// onArgs runs check before cmd's own argument check: the first point after flag parsing.
func onArgs(cmd *cobra.Command, check cobra.PositionalArgs) {
	orig := cmd.Args
	cmd.Args = func(c *cobra.Command, args []string) error {
		if err := check(c, args); err != nil {
			return err
		}
		if orig != nil {
			return orig(c, args)
		}
		return nil
	}
}

// Object makes cmd an object of the grammar (`prio host`, `altmark mark`): a group of verbs
// whose bare form, called with flags, is a deprecated spelling still run by legacy. Called bare
// without flags it prints its help; a word that is no subcommand is a usage error.
func Object(cmd *cobra.Command, legacy func(cmd *cobra.Command, args []string) error) *cobra.Command {
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	cmd.Args = unknownCommand
	cmd.RunE = func(c *cobra.Command, args []string) error {
		set := false
		c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) { set = set || f.Changed })
		if !set {
			return c.Help()
		}
		return legacy(c, args)
	}
	return cmd
}

// unknownCommand refuses any word after a group: it is no subcommand of it.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	hint := ""
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		hint = "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return Usagef("unknown command %q for %q%s; run %s --help for the list", args[0], cmd.CommandPath(), hint, cmd.CommandPath())
}

// Require returns a usage error naming the flags cmd needs unless every one was given.
func Require(cmd *cobra.Command, flags ...string) error {
	for _, f := range flags {
		if fl := cmd.Flags().Lookup(f); fl == nil || !fl.Changed {
			return Usagef("%s needs %s; usage: %s", cmd.CommandPath(), joinFlags(flags), cmd.UseLine())
		}
	}
	return nil
}

// joinFlags is "--a", "--a and --b", "--a, --b and --c".
func joinFlags(flags []string) string {
	s := make([]string, len(flags))
	for i, f := range flags {
		s[i] = "--" + f
	}
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// WriteJSON writes v as indented JSON, what every --json prints.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// ConfigFlag adds --config FILE (no short form: -c is vnet exec's command) to cmd, bound to
// file. A non-empty old is the deprecated spelling that gave FILE as the command's only
// positional argument ("lab up FILE"): still accepted with the notice, as if given with
// --config; cmd takes no other positional argument.
func ConfigFlag(cmd *cobra.Command, file *string, usage, old, replacement string) {
	cmd.Flags().StringVar(file, "config", "", usage)
	if old == "" {
		return
	}
	Deprecates(cmd, old, replacement)
	cmd.Args = func(c *cobra.Command, args []string) error {
		if len(args) != 1 {
			return ExactArgs(0)(c, args)
		}
		Notice(c, old, replacement)
		f := c.Flags().Lookup("config")
		if f.Changed {
			return Usagef("%s: give the file once, with --config", c.CommandPath())
		}
		*file, f.Changed = args[0], true
		return nil
	}
}
