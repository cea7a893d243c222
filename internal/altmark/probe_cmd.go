package altmark

import (
	"errors"

	"github.com/spf13/cobra"
)

// probeCommand is a placeholder its owner replaces.
func probeCommand() *cobra.Command {
	return &cobra.Command{Use: "probe", Hidden: true, RunE: func(*cobra.Command, []string) error { return errors.New("altmark probe: not built yet") }}
}
