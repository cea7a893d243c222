package altmark

import (
	"errors"

	"github.com/spf13/cobra"
)

// analyzeCommand is a placeholder its owner replaces.
func analyzeCommand() *cobra.Command {
	return &cobra.Command{Use: "analyze", Hidden: true, RunE: func(*cobra.Command, []string) error { return errors.New("altmark analyze: not built yet") }}
}
