// Package prio prioritizes flows at a bottleneck from what their senders advertise: a sock_ops
// program on the hosts writes each connection's send backlog into a TCP option, and a tc
// classifier on the router's bottleneck interface puts flows into HTB classes by a scheme
// (fifo, fair, occupancy, backlog, pias). docs/prio.md.
package prio

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/units"
)

// Command is `flowplane prio`.
func Command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "prio",
		Short: "Prioritize flows at a bottleneck from the send backlog their hosts advertise",
		Long: `prio has two halves. On hosts, "prio host" attaches a sock_ops program to a cgroup v2: the
connections its policy selects carry their unsent bytes and send-buffer occupancy in a TCP
option, on the SYN and on data segments when they change (policy: min_interval, refresh). On a
router, "prio router" builds an HTB tree on the bottleneck interface and a classifier at its tcx
egress that puts each flow into a class by the policy's scheme. Routers are per network
namespace and device; see docs/prio.md.`,
	}
	cmd.AddCommand(hostCmd(), routerCmd(),
		cli.StatusCommand("per-class packets, bytes and drops, per-flow advertised backlog and class, counters", ReadStatus, printStatus),
		removeCmd())
	return cmd
}

func hostCmd() *cobra.Command {
	var cg, policy, name string
	cmd := &cobra.Command{
		Use:   "host --cgroup PATH --policy FILE",
		Short: "advertise the backlog of the selected connections of a cgroup's processes",
		Args:  cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cg == "" || policy == "" {
				return cli.Usagef("prio host needs --cgroup and --policy; usage: %s", cmd.UseLine())
			}
			p, err := LoadHostPolicy(policy)
			if err != nil {
				return cli.Usage(err)
			}
			path, err := cgroup.Resolve(cg)
			if err != nil {
				return cli.Usage(err)
			}
			if err := Host(name, path, p); err != nil {
				return err
			}
			when := "on every data segment"
			if p.Refresh > 0 {
				when = fmt.Sprintf("on changes, at least every %v", p.Refresh)
				if p.MinInterval > 0 {
					when = fmt.Sprintf("on changes at most every %v, at least every %v", p.MinInterval, p.Refresh)
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "prio host %s: %d selector(s) on %s; the option written %s\n", name, len(p.Advertise), cgroup.HostPath(path), when)
			return nil
		},
	}
	cmd.Flags().StringVar(&cg, "cgroup", "", "cgroup v2 whose connections advertise (absolute or relative to the cgroup2 mount)")
	cmd.Flags().StringVar(&policy, "policy", "", "host policy file (YAML)")
	cmd.Flags().StringVar(&name, "name", "default", "attachment name (several cgroups can have one each)")
	return cmd
}

func routerCmd() *cobra.Command {
	var dev, rate, policy string
	cmd := &cobra.Command{
		Use:   "router --dev IF --rate R --policy FILE",
		Short: "shape a bottleneck interface with HTB and classify its flows by a scheme",
		Args:  cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dev == "" || rate == "" || policy == "" {
				return cli.Usagef("prio router needs --dev, --rate and --policy; usage: %s", cmd.UseLine())
			}
			bps, err := units.ParseRate(rate)
			if err != nil {
				return cli.Usagef("--rate: %v", err)
			}
			p, err := LoadRouterPolicy(policy)
			if err != nil {
				return cli.Usage(err)
			}
			if _, err := CheckDevice(dev); err != nil {
				return cli.Usagef("--dev: %v", err)
			}
			if err := Router(dev, bps, p); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "prio router on %s: %s at %s, %d band(s) × %d leaves\n", dev, p.Scheme, units.FormatRate(bps), p.Bands(), p.Leaves)
			return nil
		},
	}
	cmd.Flags().StringVar(&dev, "dev", "", "the bottleneck interface (its egress is shaped)")
	cmd.Flags().StringVar(&rate, "rate", "", "the bottleneck's rate, e.g. 100mbit")
	cmd.Flags().StringVar(&policy, "policy", "", "router policy file (YAML)")
	return cmd
}

func printStatus(w io.Writer, st *Status) {
	if len(st.Routers)+len(st.Hosts) == 0 {
		fmt.Fprintln(w, "no prio router in this network namespace and no prio host attachment")
		return
	}
	for _, r := range st.Routers {
		fmt.Fprintf(w, "router %s: %s at %s, %d band(s) × %d leaves (%s)\n", r.Dev, r.Scheme, units.FormatRate(r.Rate), r.Bands, r.Leaves, r.File)
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
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%d\t%s\t%d\t%d\n", f.Src, f.Dst, f.Proto, f.Class, f.Backlog, occ, f.Bytes, f.BandChanges)
		}
		tw.Flush()
		fmt.Fprintf(w, "  counters: %s\n", counterLine(r.Counters, routerCounterNames))
	}
	for _, h := range st.Hosts {
		fmt.Fprintf(w, "host %s on %s (%s, refresh %v, min_interval %v)\n  counters: %s\n", h.Name, h.Cgroup, h.File, h.Refresh, h.MinInterval, counterLine(h.Counters, hostCounterNames))
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

func removeCmd() *cobra.Command {
	var dev, name string
	cmd := &cobra.Command{
		Use:   "remove [--dev IF] [--host NAME]",
		Short: "undo prio router on a device and/or prio host: no qdisc, program or pin left",
		Args:  cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dev == "" && name == "" {
				return cli.Usagef("prio remove needs --dev IF (a router) or --host NAME (a host attachment)")
			}
			if dev != "" {
				if err := RemoveRouter(dev); errors.Is(err, os.ErrNotExist) {
					return cli.Usagef("no prio router on %s in this network namespace", dev)
				} else if err != nil {
					return err
				}
			}
			if name != "" {
				if err := RemoveHost(name); errors.Is(err, os.ErrNotExist) {
					return cli.Usagef("no prio host attachment %q", name)
				} else if err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dev, "dev", "", "the router device")
	cmd.Flags().StringVar(&name, "host", "", `the host attachment's name ("default" unless prio host had --name)`)
	return cmd
}
