// Package version says which flowplane this is: `flowplane version`.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/cli"
)

// Set by the release build (-ldflags -X): the tag or `git describe`, the commit, the commit's
// date. A binary built otherwise takes them from Go's build information.
var (
	Version = ""
	Commit  = ""
	Date    = ""
)

// Info is what `flowplane version` prints.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Modified  bool   `json:"modified,omitempty"` // built from a work tree with changes
	Date      string `json:"date"`               // the commit's date (UTC), not the build's: builds are reproducible
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

// Get returns the version information: the release's, else Go's build information (`go
// install …@vX.Y.Z` records the module version; a build in a checkout records the commit).
func Get() Info {
	i := Info{Version: Version, Commit: Commit, Date: Date, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if i.Commit == "" {
					i.Commit = s.Value
				}
			case "vcs.time":
				if i.Date == "" {
					i.Date = s.Value
				}
			case "vcs.modified":
				i.Modified = s.Value == "true" && Commit == ""
			}
		}
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	return i
}

// Command is `flowplane version`.
func Command() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version [--json]",
		Short: "Print the version, commit, commit date and Go version",
		Args:  cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			i := Get()
			if asJSON {
				return cli.WriteJSON(cmd.OutOrStdout(), i)
			}
			commit := i.Commit
			if commit == "" {
				commit = "unknown"
			}
			if i.Modified {
				commit += " (modified)"
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "flowplane %s\ncommit %s, %s\n%s %s\n", i.Version, commit, or(i.Date, "date unknown"), i.GoVersion, i.Platform)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
