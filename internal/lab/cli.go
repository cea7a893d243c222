package lab

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf/rlimit"
	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/cli"
)

// Command is `flowplane lab`.
func Command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Run topologies of network namespaces described in YAML",
		Long: "lab builds Mininet-style topologies out of network namespaces: hosts and routers joined by veth\n" +
			"links with optional rate (HTB), loss (a cls_bpf program on the clsact egress hook) and delay, jitter, reordering,\n" +
			"duplication, corruption or burst loss (a user-space relay per such link), routed so every host reaches every host\n" +
			"over IPv4 and IPv6. See docs/lab.md for the file format.",
	}
	cmd.AddCommand(upCmd(), downCmd(), listCmd(), statusCmd(), execCmd())
	return cmd
}

func upCmd() *cobra.Command {
	var file, name string
	cmd := &cobra.Command{
		Use:   "up --config FILE [--name N]",
		Short: "Create the lab described in a topology file",
		Long: "Create the lab described in a topology file (docs/lab.md). Run again for a running lab with the file it\n" +
			"was started from, unchanged, it restarts the relays that failed or lost their supervisor (lab status shows\n" +
			"them FAILED or DEAD); another topology under a running lab's name is refused (exit 2).",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Require(cmd, "config"); err != nil {
				return err
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return cli.Usage(err)
			}
			t, err := Parse(file, data, name)
			if err != nil {
				return cli.Usage(err)
			}
			if err := rlimit.RemoveMemlock(); err != nil {
				return fmt.Errorf("remove memlock limit: %w", err)
			}
			l, err := Up(file, data, t)
			if errors.Is(err, ErrExists) {
				// Up again from the same file: bring back what is down (the relays).
				return repair(cmd, t.Name, data)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lab %s: up, %s, %s\n", l.Name(), cli.Count(len(t.Nodes), "node"), cli.Count(len(t.Links), "link"))
			return nil
		},
	}
	cli.ConfigFlag(cmd, &file, "topology file (YAML; docs/lab.md)", "lab up FILE", "lab up --config FILE")
	cmd.Flags().StringVar(&name, "name", "", "lab name (overrides name: in the topology)")
	return cmd
}

// repair is `lab up` of a running lab: Repair, and one line saying which relays it restarted.
func repair(cmd *cobra.Command, name string, data []byte) error {
	links, err := Repair(name, data)
	if errors.Is(err, ErrExists) {
		return cli.Usage(err)
	}
	names := make([]string, len(links))
	for i, l := range links {
		names[i] = l.A.Node.Name + " — " + l.B.Node.Name
	}
	switch {
	case len(links) > 0: // even if a later one failed: these run
		fmt.Fprintf(cmd.OutOrStdout(), "lab %s: already up, restarted the relay of %s: %s\n", name, cli.Count(len(links), "link"), strings.Join(names, ", "))
	case err == nil:
		fmt.Fprintf(cmd.OutOrStdout(), "lab %s: already up, nothing to restart\n", name)
	}
	return err
}

func downCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "down NAME|--all",
		Short: "Remove a lab and everything it created",
		Args:  cli.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) == 1) {
				return cli.Usagef("give a lab name or --all, not both or neither; usage: %s", cmd.UseLine())
			}
			names := args
			if all {
				var err error
				if names, err = Names(); err != nil {
					return err
				}
			}
			var errs []error
			var down []string
			for _, n := range names {
				err := Down(n)
				switch {
				case errors.Is(err, ErrNotFound) && !all:
					return cli.Usage(err)
				case err != nil:
					errs = append(errs, err)
				default:
					down = append(down, n)
				}
			}
			out := cmd.OutOrStdout()
			switch {
			case !all:
				if len(down) == 1 {
					fmt.Fprintf(out, "lab %s: down\n", down[0])
				}
			case len(names) == 0:
				fmt.Fprintln(out, "lab: no lab was running")
			default:
				fmt.Fprintf(out, "lab: %d of %s down: %s\n", len(down), cli.Count(len(names), "lab"), strings.Join(down, ", "))
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "remove every lab")
	return cmd
}

// ListEntry is a line of `lab list`: a running lab, or (Error) a name whose record is gone.
type ListEntry struct {
	Name    string     `json:"name"`
	Nodes   int        `json:"nodes"`
	Links   int        `json:"links"`
	File    string     `json:"file,omitempty"`
	Created *time.Time `json:"created,omitempty"`
	Error   string     `json:"error,omitempty"`
}

// List is every lab of this machine, by name.
func List() ([]ListEntry, error) {
	names, err := Names()
	if err != nil {
		return nil, err
	}
	out := []ListEntry{}
	for _, n := range names {
		l, err := Open(n)
		if err != nil {
			out = append(out, ListEntry{Name: n, Error: fmt.Sprintf("no record: `lab down %s` cleans up", n)})
			continue
		}
		created := l.Created
		out = append(out, ListEntry{Name: n, Nodes: len(l.Topology.Nodes), Links: len(l.Topology.Links), File: l.Topology.File, Created: &created})
	}
	return out, nil
}

func listCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "list [--json]",
		Aliases: []string{"ls"},
		Short:   "List running labs",
		Args:    cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ls, err := List()
			if err != nil {
				return err
			}
			if asJSON {
				return cli.WriteJSON(cmd.OutOrStdout(), ls)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tNODES\tLINKS\tFILE\tCREATED")
			for _, l := range ls {
				if l.Error != "" {
					fmt.Fprintf(w, "%s\t?\t?\t(%s)\t\n", l.Name, l.Error)
					continue
				}
				fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\n", l.Name, l.Nodes, l.Links, l.File, l.Created.Format("2006-01-02 15:04:05"))
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// ErrDegraded is `lab status`'s error (exit 1) for a lab that is up but has a link whose relay
// failed or lost its supervisor: the status is printed in full first.
var ErrDegraded = errors.New("up but degraded")

func statusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status NAME [--json]",
		Short: "Show a lab's nodes, addresses, links and drop counters",
		Long: "Show a lab's nodes, interfaces (addresses, counters, drops), links and the relays of its impaired links.\n" +
			"Exit code 0: the lab is up; 1: it is up but degraded, a link's relay failed or is unsupervised (said on\n" +
			"stderr, after the full status); 2: bad usage or no such lab.",
		Args: cli.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := Open(args[0])
			if errors.Is(err, ErrNotFound) {
				return cli.Usage(err)
			}
			if err != nil {
				return err
			}
			s, err := l.Status()
			if err != nil {
				return err
			}
			// A relay that is given up or unsupervised leaves its link carrying nothing: said on
			// stderr too, whatever the format, and in the exit code once everything is printed.
			ws := relayWarnings(s)
			for _, w := range ws {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
			}
			if asJSON {
				err = cli.WriteJSON(cmd.OutOrStdout(), s)
			} else {
				err = printStatus(cmd.OutOrStdout(), s)
			}
			if err == nil && len(ws) > 0 {
				err = fmt.Errorf("lab %s: %w: the relay of %s failed or is unsupervised (see the warnings above)", s.Name, ErrDegraded, cli.Count(len(ws), "link"))
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printStatus(out io.Writer, s *Status) error {
	fmt.Fprintf(out, "lab %s (%s, up since %s)\n\n", s.Name, s.File, s.Created.Local().Format("2006-01-02 15:04:05"))
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tKIND\tIFACE\tDEVICE\tPEER\tIPV4\tIPV6\tSTATE\tTX PKTS\tRX PKTS\tQDISC DROPS\tLOSS DROPS")
	for _, n := range s.Nodes {
		for _, i := range n.Ifaces {
			state, loss := "down", "-"
			if i.Up {
				state = "up"
			}
			if i.Loss != nil {
				loss = fmt.Sprintf("%d/%d", i.Loss.Dropped, i.Loss.Dropped+i.Loss.Passed)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", n.Name, n.Kind, i.Name, i.Device, i.Peer,
				i.IPv4, i.IPv6, state, i.TxPackets, i.RxPackets, i.QdiscDrops, loss)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "LINK\tMTU\tRATE\tLOSS")
	// One value for both directions, or A → B's / B → A's where they differ.
	both := func(a, b string) string {
		if a == b {
			return a
		}
		return a + " / " + b
	}
	for _, l := range s.Links {
		rate, loss := both(cmp.Or(l.Rate, "-"), cmp.Or(l.BToARate, "-")), both(percentOrDash(l.Loss), percentOrDash(l.BToALoss))
		fmt.Fprintf(w, "%s — %s\t%d\t%s\t%s\n", l.A, l.B, l.MTU, rate, loss)
	}
	relays := false
	for _, l := range s.Links {
		if l.Relay == nil {
			continue
		}
		if !relays {
			relays = true
			fmt.Fprintln(w)
			fmt.Fprintln(w, "RELAY\tDIRECTION\tIMPAIRMENT\tSTATE\tRESTARTS\tPID\tRX\tTX\tDELAYED\tLOST\tDUPLICATED\tREORDERED\tCORRUPTED\tOVERFLOW\tQUEUE")
		}
		pid := strconv.Itoa(l.Relay.PID)
		if !l.Relay.Alive {
			pid += " (dead)"
		}
		state := l.Relay.State
		if state == relayFailed || state == relayDead || state == "" {
			state = strings.ToUpper(cmp.Or(state, "not started"))
		}
		for _, d := range []struct {
			name string
			im   *Impairment
			c    RelayCounters
		}{{l.A + " → " + l.B, l.AToB, l.Relay.AToB}, {l.B + " → " + l.A, l.BToA, l.Relay.BToA}} {
			im := fmt.Sprintf("delay %s ± %s %s, reorder %s, duplicate %s, corrupt %s, loss %s", d.im.Delay, d.im.Jitter,
				d.im.Distribution, percent(d.im.Reorder), percent(d.im.Duplicate), percent(d.im.Corrupt), d.im.LossModel)
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", l.Relay.Netns, d.name, im, state, l.Relay.Restarts, pid,
				d.c.RxPackets, d.c.TxPackets, d.c.Delayed, d.c.Lost, d.c.Duplicated, d.c.Reordered, d.c.Corrupted, d.c.Overflow, d.c.Queue)
		}
	}
	return w.Flush()
}

func percentOrDash(p float64) string {
	if p == 0 {
		return "-"
	}
	return percent(p)
}

// percent is p% to 4 significant digits: a derived loss (a gemodel's average) reads 3.846%.
func percent(p float64) string { return strconv.FormatFloat(p, 'g', 4, 64) + "%" }

// relayWarnings says which links' relays no longer relay and will not again by themselves.
func relayWarnings(s *Status) []string {
	var ws []string
	for _, l := range s.Links {
		r := l.Relay
		if r == nil {
			continue
		}
		switch r.State {
		case relayFailed:
			ws = append(ws, fmt.Sprintf("the relay of link %s — %s FAILED: it died %d times in a row, each within %v of its start (last: %s), "+
				"and was given up; the link carries nothing. Its log: %s. `flowplane lab up --config %s --name %s` restarts it",
				l.A, l.B, relayMaxStreak, relayStable, r.LastExit, r.Log, s.File, s.Name))
		case relayDead, "":
			ws = append(ws, fmt.Sprintf("the relay of link %s — %s is not supervised (its supervisor was killed or never started); "+
				"the link carries nothing if its relay is dead too. Its log: %s. `flowplane lab up --config %s --name %s` restarts it",
				l.A, l.B, r.Log, s.File, s.Name))
		}
	}
	return ws
}

func execCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "exec NAME NODE -- CMD [ARG...]",
		Short: "Run a command on a node, in its namespace and environment, with the command's exit code",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 3 {
				return cli.Usagef("%s needs NAME, NODE and a command; usage: %s", cmd.CommandPath(), cmd.UseLine())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := Open(args[0])
			if errors.Is(err, ErrNotFound) {
				return cli.Usage(err)
			}
			if err != nil {
				return err
			}
			if _, err := l.Node(args[1]); err != nil {
				return cli.Usage(err)
			}
			err = l.Exec(args[1], args[2:])
			return &cli.CannotStart{Err: err} // Exec returns only when the command could not start
		},
	}
}
