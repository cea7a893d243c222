// Package prio prioritizes flows at a bottleneck from what their senders advertise: a sock_ops
// program on the hosts writes each connection's send backlog into a TCP option, and a tc
// classifier on the router's bottleneck interface puts flows into HTB classes by a scheme
// (fifo, fair, occupancy, backlog, pias). docs/prio.md.
package prio

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/ipnet"
	"github.com/flowplane/flowplane/internal/units"
)

// Command is `flowplane prio`.
func Command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "prio",
		Short: "Prioritize flows at a bottleneck from the send backlog their hosts advertise",
		Long: `prio has two halves. On hosts, "prio host apply" attaches a sock_ops program to a cgroup v2:
the connections its policy selects carry their unsent bytes and send-buffer occupancy in a TCP
option, on the SYN and on data segments when they change (policy: min_interval, refresh). On a
router, "prio router apply" builds an HTB tree on the bottleneck interface and a classifier at
its tcx egress that puts each flow into a class by the policy's scheme. Routers are per network
namespace and device; see docs/prio.md.`,
	}
	cmd.AddCommand(hostCmd(), routerCmd(),
		cli.StatusCommand("Show per-class packets, bytes and drops, per-flow advertised backlog and class, counters", ReadStatus, printStatus),
		legacyRemoveCmd())
	return cmd
}

func hostCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "host",
		Short: "Advertise the send backlog of a cgroup's selected connections",
	}
	// The old bare form `prio host --cgroup PATH --policy FILE [--name N]`.
	var a hostApply
	a.flags(cmd, true)
	cli.Deprecates(cmd, hostLegacy, hostReplacement)
	cli.Object(cmd, func(cmd *cobra.Command, _ []string) error {
		cli.Notice(cmd, hostLegacy, hostReplacement)
		return a.run(cmd)
	})
	cmd.AddCommand(hostApplyCmd(), hostRemoveCmd())
	return cmd
}

const (
	hostLegacy      = "prio host --cgroup PATH --policy FILE"
	hostReplacement = "prio host apply --cgroup PATH --config FILE"
)

// hostApply is `prio host apply`'s flags and action.
type hostApply struct{ cg, file, name string }

func (a *hostApply) flags(cmd *cobra.Command, legacy bool) {
	f := cmd.Flags()
	f.StringVar(&a.cg, "cgroup", "", "cgroup v2 whose connections advertise (absolute or relative to the cgroup2 mount)")
	f.StringVar(&a.name, "name", DefaultHost, "attachment name (several cgroups can have one each)")
	if legacy { // the bare object's flags: hidden, --policy only
		f.StringVar(&a.file, "policy", "", "host policy file (YAML)")
		for _, n := range []string{"cgroup", "name", "policy"} {
			_ = f.MarkHidden(n)
		}
		return
	}
	cli.ConfigFlag(cmd, &a.file, "host policy file (YAML; docs/prio.md)", "", "")
	cli.AliasFlag(cmd, "policy", "config", "prio host apply --policy FILE", "prio host apply --config FILE")
}

func (a *hostApply) run(cmd *cobra.Command) error {
	if a.cg == "" || a.file == "" {
		return cli.Usagef("%s needs --cgroup and --config; usage: %s", cmd.CommandPath(), hostApplyUse)
	}
	p, err := LoadHostPolicy(a.file)
	if err != nil {
		return cli.Usage(err)
	}
	path, err := cgroup.Resolve(a.cg)
	if err != nil {
		return cli.Usage(err)
	}
	res, err := ApplyHost(a.name, path, p) // again: link.Update swaps the program in place
	verb, err := cli.Applied(cmd, res, err)
	if err != nil {
		return err
	}
	when := "on every data segment"
	if p.Refresh > 0 {
		when = fmt.Sprintf("on changes, at least every %v", p.Refresh)
		if p.MinInterval > 0 {
			when = fmt.Sprintf("on changes at most every %v, at least every %v", p.MinInterval, p.Refresh)
		}
	}
	fmt.Fprintf(cmd.OutOrStdout(), "prio host: %s %q on %s, %s, the option written %s\n", verb, a.name, cgroup.HostPath(path), cli.Count(len(p.Advertise), "selector"), when)
	return nil
}

const hostApplyUse = "prio host apply --cgroup PATH --config FILE [--name N]"

func hostApplyCmd() *cobra.Command {
	var a hostApply
	cmd := &cobra.Command{
		Use:   "apply --cgroup PATH --config FILE [--name N]",
		Short: "Attach the option writer to a cgroup, replacing the attachment of the same name",
		Args:  cli.ExactArgs(0),
		RunE:  func(cmd *cobra.Command, _ []string) error { return a.run(cmd) },
	}
	a.flags(cmd, false)
	return cmd
}

func hostRemoveCmd() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "remove [--name N]",
		Short: "Detach a host attachment and unpin it",
		Args:  cli.ExactArgs(0),
		RunE:  func(cmd *cobra.Command, _ []string) error { return removeHost(cmd, name) },
	}
	cmd.Flags().StringVar(&name, "name", DefaultHost, "the attachment's name")
	return cmd
}

func removeHost(cmd *cobra.Command, name string) error {
	res, err := hostInstance(name).Remove()
	if err := cli.Removed(cmd, res, err); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "prio host: removed %q\n", name)
	return nil
}

func routerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "router",
		Short: "Shape a bottleneck interface with HTB and classify its flows by a scheme",
	}
	// The old bare form `prio router --dev IF --rate R --policy FILE`.
	var a routerApply
	a.flags(cmd, true)
	cli.Deprecates(cmd, routerLegacy, routerReplacement)
	cli.Object(cmd, func(cmd *cobra.Command, _ []string) error {
		cli.Notice(cmd, routerLegacy, routerReplacement)
		return a.run(cmd)
	})
	cmd.AddCommand(routerApplyCmd(), routerRemoveCmd())
	return cmd
}

const (
	routerLegacy      = "prio router --dev IF --rate R --policy FILE"
	routerReplacement = "prio router apply --dev IF --rate R --config FILE"
	routerApplyUse    = "prio router apply --dev IF --rate R --config FILE"
)

// routerApply is `prio router apply`'s flags and action.
type routerApply struct {
	dev, rate, file string
	legacy          bool // the deprecated bare form: --policy, not --config
}

func (a *routerApply) flags(cmd *cobra.Command, legacy bool) {
	a.legacy = legacy
	f := cmd.Flags()
	f.StringVar(&a.dev, "dev", "", "the bottleneck interface (its egress is shaped)")
	f.StringVar(&a.rate, "rate", "", "the bottleneck's rate, e.g. 100mbit")
	if legacy {
		f.StringVar(&a.file, "policy", "", "router policy file (YAML)")
		for _, n := range []string{"dev", "rate", "policy"} {
			_ = f.MarkHidden(n)
		}
		return
	}
	cli.ConfigFlag(cmd, &a.file, "router policy file (YAML; docs/prio.md)", "", "")
	cli.AliasFlag(cmd, "policy", "config", "prio router apply --policy FILE", "prio router apply --config FILE")
}

func (a *routerApply) run(cmd *cobra.Command) error {
	if a.dev == "" || a.rate == "" || a.file == "" {
		if a.legacy {
			return cli.Usagef("%s needs --dev, --rate and --policy; usage: %s", cmd.CommandPath(), routerLegacy)
		}
		return cli.Usagef("%s needs --dev, --rate and --config; usage: %s", cmd.CommandPath(), routerApplyUse)
	}
	bps, err := units.ParseRate(a.rate)
	if err != nil {
		return cli.Usagef("--rate: %v", err)
	}
	p, err := LoadRouterPolicy(a.file)
	if err != nil {
		return cli.Usage(err)
	}
	if _, err := CheckDevice(a.dev); err != nil {
		return cli.Usagef("--dev: %v", err)
	}
	// A device prio shapes already gets the new classifier in place (link.Update) and its
	// classes' new rates; a policy that needs other classes is refused (exit 2), the router
	// staying as it was.
	res, err := ApplyRouter(a.dev, bps, p)
	verb, err := cli.Applied(cmd, res, err, ErrTreeChanged)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "prio router: %s scheme %s on %s at %s, %s × %s\n", verb, p.Scheme, a.dev, units.FormatRate(bps), cli.Count(p.Bands(), "band"), cli.Count(p.Leaves, "leaf", "leaves"))
	return nil
}

func routerApplyCmd() *cobra.Command {
	var a routerApply
	cmd := &cobra.Command{
		Use:   "apply --dev IF --rate R --config FILE",
		Short: "Shape a device and attach the classifier, or replace them in place on a shaped device",
		Args:  cli.ExactArgs(0),
		RunE:  func(cmd *cobra.Command, _ []string) error { return a.run(cmd) },
	}
	a.flags(cmd, false)
	return cmd
}

func routerRemoveCmd() *cobra.Command {
	var dev string
	cmd := &cobra.Command{
		Use:   "remove --dev IF",
		Short: "Undo router apply on a device: no qdisc, program or pin left",
		Args:  cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Require(cmd, "dev"); err != nil {
				return err
			}
			return removeRouter(cmd, dev)
		},
	}
	cmd.Flags().StringVar(&dev, "dev", "", "the shaped device")
	return cmd
}

func removeRouter(cmd *cobra.Command, dev string) error {
	res, err := removeRouterInstance(dev)
	if err := cli.Removed(cmd, res, err); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "prio router: removed from %s\n", dev)
	return nil
}

func printStatus(w io.Writer, st *Status) {
	defer cli.PrintLeftovers(w, st.Leftovers, "prio router|host apply or remove")
	if len(st.Routers)+len(st.Hosts) == 0 {
		fmt.Fprintln(w, "no prio router in this network namespace and no prio host attachment")
		return
	}
	for _, r := range st.Routers {
		fmt.Fprintf(w, "router %s: %s at %s, %s × %s (%s)\n", r.Dev, r.Scheme, units.FormatRate(r.Rate), cli.Count(r.Bands, "band"), cli.Count(r.Leaves, "leaf", "leaves"), r.File)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  class\tband\tleaf\tpackets\tbytes\tdrops\tqueued")
		for _, c := range r.Classes {
			if c.Packets == 0 && c.Backlog == 0 {
				continue
			}
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%d\n", c.Class, c.Band, c.Leaf, c.Packets, c.Bytes, c.Drops, c.Backlog)
		}
		tw.Flush()
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  flow\t\tproto\tclass\tbacklog\toccupancy\tbytes\tband changes")
		for _, f := range r.Flows {
			occ := "-"
			if f.Occupancy >= 0 {
				occ = fmt.Sprintf("%d%%", f.Occupancy)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\n", f.Src, f.Dst, ipnet.ProtoName(f.Proto), f.Class, f.Backlog, occ, f.Bytes, f.BandChanges)
		}
		tw.Flush()
		fmt.Fprintf(w, "  counters: %s\n", counterLine(r.Counters, routerCounterNames))
	}
	for _, h := range st.Hosts {
		fmt.Fprintf(w, "host %s on %s (%s, refresh %v, min_interval %v)\n  counters: %s\n", h.Name, h.Cgroup, h.File, h.Refresh, h.MinInterval, counterLine(h.Counters, hostCounterNames()))
	}
}

// counterLine is "name value" pairs in the programs' order, as tc -s prints its statistics.
func counterLine(c map[string]uint64, names []string) string {
	var parts []string
	for _, n := range names {
		if v, ok := c[n]; ok {
			parts = append(parts, fmt.Sprintf("%s %d", n, v))
		}
	}
	return strings.Join(parts, " ")
}

// legacyRemoveCmd is the old `prio remove [--dev IF] [--host NAME]`.
func legacyRemoveCmd() *cobra.Command {
	var dev, name string
	cmd := &cobra.Command{
		Use:    "remove [--dev IF] [--host NAME]",
		Short:  "Deprecated: use prio router remove or prio host remove",
		Hidden: true,
		Args: func(cmd *cobra.Command, args []string) error {
			if dev != "" {
				cli.Notice(cmd, "prio remove --dev IF", "prio router remove --dev IF")
			}
			if name != "" {
				cli.Notice(cmd, "prio remove --host NAME", "prio host remove --name NAME")
			}
			return cli.ExactArgs(0)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dev == "" && name == "" {
				return cli.Usagef("prio remove needs --dev IF (a router) or --host NAME (a host attachment); use prio router remove or prio host remove")
			}
			if dev != "" {
				if err := removeRouter(cmd, dev); err != nil {
					return err
				}
			}
			if name != "" {
				return removeHost(cmd, name)
			}
			return nil
		},
	}
	cli.Deprecates(cmd, "prio remove --dev IF", "prio router remove --dev IF")
	cli.Deprecates(cmd, "prio remove --host NAME", "prio host remove --name NAME")
	cmd.Flags().StringVar(&dev, "dev", "", "the router device")
	cmd.Flags().StringVar(&name, "host", "", "the host attachment's name")
	return cmd
}
