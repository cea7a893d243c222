// Package altmark measures packet loss and delay on live traffic by alternate marking (RFC
// 9341, 9342, 9343): a marker colors packets by period, probes count them per color and sample
// them by hash, and period records feed the analytics (analytics/, `altmark analyze`).
package altmark

import "github.com/spf13/cobra"

// Command is `flowplane altmark`.
func Command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "altmark",
		Short: "Alternate-marking loss and delay measurement (RFC 9341/9342/9343)",
	}
	cmd.AddCommand(markCommand(), probeCommand(), analyzeCommand())
	return cmd
}
