package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

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
			"links with optional rate (HTB) and loss (a cls_bpf program on the clsact egress hook), routed so every host reaches every host\n" +
			"over IPv4 and IPv6. See docs/lab.md for the file format.",
	}
	cmd.AddCommand(upCmd(), downCmd(), lsCmd(), statusCmd(), execCmd())
	return cmd
}

func upCmd() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "up FILE",
		Short: "Create the lab described in FILE",
		Args:  cli.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return cli.Usage(err)
			}
			t, err := Parse(args[0], data, name)
			if err != nil {
				return cli.Usage(err)
			}
			if err := rlimit.RemoveMemlock(); err != nil {
				return fmt.Errorf("remove memlock limit: %w", err)
			}
			l, err := Up(args[0], data, t)
			if errors.Is(err, ErrExists) {
				return cli.Usage(err)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lab %s is up: %d nodes, %d links; `flowplane lab status %s` shows it\n",
				l.Name(), len(t.Nodes), len(t.Links), l.Name())
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "lab name (overrides the file's name:)")
	return cmd
}

func downCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "down NAME | --all",
		Short: "Remove a lab and everything it created",
		Args:  cli.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) == 1) {
				return cli.Usagef("give a lab name or --all, not both or neither")
			}
			names := args
			if all {
				var err error
				if names, err = Names(); err != nil {
					return err
				}
			}
			var errs []error
			for _, n := range names {
				err := Down(n)
				switch {
				case errors.Is(err, ErrNotFound) && !all:
					return cli.Usage(err)
				case err != nil:
					errs = append(errs, err)
				default:
					fmt.Fprintf(cmd.OutOrStdout(), "lab %s is down\n", n)
				}
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "remove every lab")
	return cmd
}

func lsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List running labs",
		Args:  cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			names, err := Names()
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tNODES\tLINKS\tFILE\tCREATED")
			for _, n := range names {
				l, err := Open(n)
				if err != nil {
					fmt.Fprintf(w, "%s\t?\t?\t(no record: `lab down %s` cleans up)\t\n", n, n)
					continue
				}
				fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\n", n, len(l.Topology.Nodes), len(l.Topology.Links), l.Topology.File, l.Created.Format("2006-01-02 15:04:05"))
			}
			return w.Flush()
		},
	}
}

func statusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show a lab's nodes, addresses, links and drop counters",
		Args:  cli.ExactArgs(1),
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
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(s)
			}
			return printStatus(cmd.OutOrStdout(), s)
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
	for _, l := range s.Links {
		rate, loss := "-", "-"
		if l.Rate != "" {
			rate = l.Rate
		}
		if l.Loss > 0 {
			loss = fmt.Sprintf("%g%%", l.Loss)
		}
		fmt.Fprintf(w, "%s — %s\t%d\t%s\t%s\n", l.A, l.B, l.MTU, rate, loss)
	}
	return w.Flush()
}

func execCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "exec NAME NODE -- CMD [ARG...]",
		Short: "Run a command on a node (its namespace and environment); exits with the command's code",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 3 {
				return cli.Usagef("usage: %s", cmd.UseLine())
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
			return &execError{err: err} // Exec returns only when the command could not start
		},
	}
}

// execError exits 127 like a shell does for a command it cannot run.
type execError struct{ err error }

func (e *execError) Error() string { return e.err.Error() }
func (e *execError) Unwrap() error { return e.err }
func (e *execError) ExitCode() int { return 127 }
