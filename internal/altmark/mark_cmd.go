package altmark

import (
	"errors"

	"github.com/spf13/cobra"
)

// markCommand is a placeholder its owner replaces.
func markCommand() *cobra.Command {
	return &cobra.Command{Use: "mark", Hidden: true, RunE: func(*cobra.Command, []string) error { return errors.New("altmark mark: not built yet") }}
}
