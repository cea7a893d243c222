package altmark

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/cli"
)

// markCommand is `flowplane altmark mark`: apply, remove, status.
func markCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mark",
		Short: "Color packets by period at a network edge's egress (dscp, ipv4-flag or ipv6-altmark)",
		Long: `The marker, attached at the head of an edge interface's tcx egress, gives every selected
packet the color of its period, (⌊TAI / period⌋ + start_color) mod 2, in the configured
carrier, and with double marking the delay mark on the first packets of each flow in the
central half of each period. It stays attached (pinned) after "mark apply" returns; "mark
remove" detaches it, "mark status" shows its counters. docs/altmark.md, sections Marker configuration and The marker.`,
	}
	// The old bare forms: `mark --dev IF --config FILE [--check]` and `mark --remove --dev IF`.
	var a markApply
	var remove bool
	a.flags(cmd, true)
	cmd.Flags().BoolVar(&remove, "remove", false, "detach the marker from --dev")
	_ = cmd.Flags().MarkHidden("remove")
	for _, f := range markLegacy {
		cli.Deprecates(cmd, f[0], f[1])
	}
	cli.Object(cmd, func(cmd *cobra.Command, _ []string) error {
		switch {
		case remove:
			cli.Notice(cmd, markLegacy[2][0], markLegacy[2][1])
			if a.file != "" {
				return cli.Usagef("--remove takes no --config")
			}
			return runMarkRemove(cmd, a.dev)
		case a.check:
			cli.Notice(cmd, markLegacy[1][0], markLegacy[1][1])
		default:
			cli.Notice(cmd, markLegacy[0][0], markLegacy[0][1])
		}
		return a.run(cmd)
	})
	cmd.AddCommand(markApplyCommand(), markRemoveCommand(),
		cli.StatusCommand("Show the markers of this network namespace and their counters", ReadMarkStatus, printMarkStatus))
	return cmd
}

// markLegacy: the deprecated bare spellings and what replaces them.
var markLegacy = [][2]string{
	{"altmark mark --dev IF --config FILE", "altmark mark apply --dev IF --config FILE"},
	{"altmark mark --check --config FILE", "altmark mark apply --check --config FILE"},
	{"altmark mark --remove --dev IF", "altmark mark remove --dev IF"},
}

const markApplyUse = "altmark mark apply --dev IF --config FILE [--check]"

// markApply is `mark apply`'s flags and action.
type markApply struct {
	dev, file string
	check     bool
}

func (a *markApply) flags(cmd *cobra.Command, legacy bool) {
	f := cmd.Flags()
	f.StringVar(&a.dev, "dev", "", "the edge interface whose egress is marked")
	f.BoolVar(&a.check, "check", false, "validate --config and exit (no --dev needed)")
	cli.ConfigFlag(cmd, &a.file, "marker configuration file (YAML; docs/altmark.md, Marker configuration)", "", "")
	if legacy {
		for _, n := range []string{"dev", "check", "config"} {
			_ = f.MarkHidden(n)
		}
	}
}

func (a *markApply) run(cmd *cobra.Command) error {
	if a.file == "" || (a.dev == "" && !a.check) {
		return cli.Usagef("%s needs --dev and --config; usage: %s %s", cmd.CommandPath(), cmd.Root().Name(), markApplyUse)
	}
	c, err := LoadMarkConfig(a.file)
	if err != nil {
		return cli.Usage(err)
	}
	cli.Warn(cmd, c.Warnings...)
	if a.check {
		fmt.Fprintf(cmd.OutOrStdout(), "%s: valid (%s, period %v)\n", a.file, c.Carrier, time.Duration(c.Period))
		return nil
	}
	if _, err := CheckMarkDevice(a.dev); err != nil {
		return cli.Usagef("--dev: %w", err)
	}
	// A device that has a marker gets the new one in place (link.Update): no packet leaves
	// unmarked in between, and the counters carry on.
	res, err := ApplyMark(a.dev, c)
	verb, err := cli.Applied(cmd, res, err)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "altmark mark: %s on %s egress, %s, period %v, start color %d%s\n", verb, a.dev, describeCarrier(c), time.Duration(c.Period), c.StartColor, describeDouble(c))
	return nil
}

func markApplyCommand() *cobra.Command {
	var a markApply
	cmd := &cobra.Command{
		Use:   "apply --dev IF --config FILE [--check]",
		Short: "Attach the marker to an interface's egress, or replace the one there in place",
		Long: `Attach the marker at the head of IF's tcx egress. The configuration is validated before
anything attaches (exit 2 naming the field); --check only validates it. An interface that has
a marker already gets the new one in place (link.Update): no packet leaves unmarked, the
counters carry on, and if the new marker fails the old one stays. docs/altmark.md, sections
Marker configuration and The marker.`,
		Args: cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.run(cmd) },
	}
	a.flags(cmd, false)
	return cmd
}

func markRemoveCommand() *cobra.Command {
	var dev string
	cmd := &cobra.Command{
		Use:   "remove --dev IF",
		Short: "Detach the marker from an interface",
		Args:  cli.ExactArgs(0),
		RunE:  func(cmd *cobra.Command, _ []string) error { return runMarkRemove(cmd, dev) },
	}
	cmd.Flags().StringVar(&dev, "dev", "", "the marked interface")
	return cmd
}

func runMarkRemove(cmd *cobra.Command, dev string) error {
	if dev == "" {
		return cli.Usagef("altmark mark remove needs --dev; usage: altmark mark remove --dev IF")
	}
	res, err := removeMark(dev)
	if err != nil {
		err = fmt.Errorf("--dev: %w", err)
	}
	if err := cli.Removed(cmd, res, err); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "altmark mark: removed from %s\n", dev)
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
		if s.Leftover != "" {
			fmt.Fprintf(w, "%s: leftover: %s (the next altmark mark apply or remove on %s cleans it)\n", s.Dev, s.Leftover, s.Dev)
			continue
		}
		c := s.Config
		fmt.Fprintf(w, "%s: %s, period %v, start color %d%s; %d flow(s) tracked (config %s)\n", s.Dev, describeCarrier(&c), time.Duration(c.Period), c.StartColor, describeDouble(&c), s.Flows, c.File)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, n := range markCounterNames {
			fmt.Fprintf(tw, "  %s\t%d\n", n, s.Counters[n])
		}
		tw.Flush()
	}
}
