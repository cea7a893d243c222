// Package commands is flowplane's whole command tree (docs/cli.md): cmd/flowplane runs it, and
// the release program (scripts/release) walks it for the man pages and shell completions, so
// the documentation generators are never linked into the binary.
package commands

import (
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

// Root builds a new command tree, each subsystem contributing one subcommand (cmd/flowplane's
// grammar_test.go checks it).
func Root() *cobra.Command {
	return cli.Root("flowplane", "Track, tune, prioritize and measure network flows",
		lab.Command(), conntrack.Command(), tune.Command(), vnet.Command(), prio.Command(), altmark.Command(),
		version.Command(), hostcheck.Command(altmark.FindAnalytics))
}
