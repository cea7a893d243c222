package altmark

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/cli"
)

// markCommand is `flowplane altmark mark`.
func markCommand() *cobra.Command {
	var dev, cfgFile string
	var remove, check bool
	cmd := &cobra.Command{
		Use:   "mark --dev IF --config FILE | mark remove --dev IF | mark status [--json]",
		Short: "Color packets by period at a network edge's egress (dscp, ipv4-flag or ipv6-altmark)",
		Long: `Attach the marker at the head of IF's tcx egress: every selected packet gets the color of
its period, (⌊TAI / period⌋ + start_color) mod 2, in the configured carrier, and with double
marking the delay mark on the first packets of each flow in the central half of each period.
The marker stays attached (pinned) after the command returns; "mark remove" detaches it,
"mark status" shows its counters. The configuration is validated before anything attaches
(exit 2 naming the field); docs/altmark.md, section Marker.`,
		Args: cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if remove {
				if cfgFile != "" {
					return cli.Usagef("--remove takes no --config")
				}
				return runMarkRemove(cmd.OutOrStdout(), dev)
			}
			if cfgFile == "" || (dev == "" && !check) {
				return cli.Usagef("altmark mark needs --dev and --config; usage: %s", cmd.UseLine())
			}
			c, err := LoadMarkConfig(cfgFile)
			if err != nil {
				return cli.Usage(err)
			}
			for _, w := range c.Warnings {
				slog.Warn(w)
			}
			if check {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: valid (%s, period %v)\n", cfgFile, c.Carrier, time.Duration(c.Period))
				return nil
			}
			if _, err := CheckMarkDevice(dev); err != nil {
				return cli.Usagef("--dev: %w", err)
			}
			if err := Mark(dev, c); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "altmark marker on %s egress: %s, period %v, start color %d%s\n", dev, describeCarrier(c), time.Duration(c.Period), c.StartColor, describeDouble(c))
			return nil
		},
	}
	cmd.Flags().StringVar(&dev, "dev", "", "the edge interface whose egress is marked")
	cmd.Flags().StringVar(&cfgFile, "config", "", "marker configuration file (YAML; docs/altmark.md, Marker)")
	cmd.Flags().BoolVar(&remove, "remove", false, "detach the marker from --dev (same as `mark remove`)")
	cmd.Flags().BoolVar(&check, "check", false, "validate --config and exit (no --dev needed)")
	cmd.AddCommand(markRemoveCommand(), cli.StatusCommand("the markers of this network namespace and their counters", ReadMarkStatus, printMarkStatus))
	return cmd
}

func markRemoveCommand() *cobra.Command {
	var dev string
	cmd := &cobra.Command{
		Use:   "remove --dev IF",
		Short: "detach the marker from an interface",
		Args:  cli.ExactArgs(0),
		RunE:  func(cmd *cobra.Command, _ []string) error { return runMarkRemove(cmd.OutOrStdout(), dev) },
	}
	cmd.Flags().StringVar(&dev, "dev", "", "the marked interface")
	return cmd
}

func runMarkRemove(w io.Writer, dev string) error {
	if dev == "" {
		return cli.Usagef("altmark mark remove needs --dev")
	}
	if err := RemoveMark(dev); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return cli.Usagef("--dev: no marker on %s in this network namespace", dev)
		}
		return err
	}
	fmt.Fprintf(w, "altmark marker removed from %s\n", dev)
	return nil
}

func describeCarrier(c *MarkConfig) string {
	switch c.Carrier {
	case carrierDSCP:
		return fmt.Sprintf("dscp bits %d (color) and %d (delay)", c.DSCPBits[0], c.DSCPBits[1])
	case carrierIPv4Flag:
		return fmt.Sprintf("ipv4-flag, %d backbone prefix(es) left alone", len(c.Backbone))
	}
	id := "FlowMonID per flow"
	if c.FlowMonID != nil {
		id = fmt.Sprintf("FlowMonID %d", *c.FlowMonID)
	}
	hdr := "Destination Options"
	if c.Header == headerHBH {
		hdr = "Hop-by-Hop"
	}
	return fmt.Sprintf("ipv6-altmark in a %s header, %s", hdr, id)
}

func describeDouble(c *MarkConfig) string {
	if c.Double == 0 {
		return ", no double marking"
	}
	return fmt.Sprintf(", double marking: %d packet(s) per flow and period", c.Double)
}

func printMarkStatus(w io.Writer, st []MarkStatus) {
	if len(st) == 0 {
		fmt.Fprintln(w, "no altmark marker in this network namespace")
		return
	}
	for _, s := range st {
		c := s.Config
		fmt.Fprintf(w, "%s: %s, period %v, start color %d%s; %d flow(s) tracked (config %s)\n", s.Dev, describeCarrier(&c), time.Duration(c.Period), c.StartColor, describeDouble(&c), s.Flows, c.File)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, n := range markCounterNames {
			fmt.Fprintf(tw, "  %s\t%d\n", n, s.Counters[n])
		}
		tw.Flush()
	}
}
