package tune

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/cilium/ebpf/rlimit"
	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/runstate"
)

// Command is `flowplane tune`.
func Command() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "tune",
		Short: "Tune TCP per connection from a declarative policy (BPF sock_ops on a cgroup v2)",
		Long: "tune attaches a sock_ops program to a cgroup v2; for each TCP connection of a process in that cgroup\n" +
			"it picks the first rule matching the addresses, ports and direction and applies the rule's profile\n" +
			"(SYN RTO, buffers, initial cwnd, cwnd clamp, congestion control, …). See docs/tune.md.",
	}
	cmd.PersistentFlags().StringVar(&name, "name", DefaultName, "policy instance (several can be applied to different cgroups)")
	cmd.AddCommand(applyCmd(&name), execCmd(&name), explainCmd(&name), statusCmd(&name), removeCmd(&name),
		cli.Alias(execCmd(&name), "run [--cgroup PATH] -- CMD [ARG...]", "tune run", "tune exec"))
	return cmd
}

// loadPolicy reads and validates a policy file; every problem is a usage error.
func loadPolicy(file string, k Kernel) (*Policy, []byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, cli.Usage(err)
	}
	p, err := Parse(file, data, k)
	if err != nil {
		return nil, nil, cli.Usage(err)
	}
	return p, data, nil
}

func applyCmd(name *string) *cobra.Command {
	var file, cgroupArg string
	cmd := &cobra.Command{
		Use:   "apply --config FILE [--cgroup PATH] [--name N]",
		Short: "Attach the policy in a file, or atomically replace the applied one",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Require(cmd, "config"); err != nil {
				return err
			}
			k, err := HostKernel()
			if err != nil {
				return err
			}
			pol, data, err := loadPolicy(file, k)
			if err != nil {
				return err
			}
			opt := ApplyOptions{Name: *name}
			if cgroupArg != "" {
				if opt.Cgroup, err = cgroup.Resolve(cgroupArg); err != nil {
					return cli.Usage(err)
				}
			}
			cli.Warn(cmd, pol.Warnings...)
			if err := rlimit.RemoveMemlock(); err != nil {
				return fmt.Errorf("remove memlock limit: %w", err)
			}
			rec, res, err := ApplyResult(pol, data, opt) // again: the tables swap atomically
			verb, err := cli.Applied(cmd, res, err, ErrOtherCgroup)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tune: %s policy %s on cgroup %s (%s, %s, from %s)\n",
				verb, rec.Name, cgroup.HostPath(rec.Cgroup), cli.Count(len(pol.Profiles), "profile"), cli.Count(len(pol.Rules), "rule"), rec.File)
			return nil
		},
	}
	cli.ConfigFlag(cmd, &file, "policy file (YAML; docs/tune.md)", "tune apply POLICY", "tune apply --config FILE")
	cmd.Flags().StringVar(&cgroupArg, "cgroup", "", "cgroup v2 to attach to (absolute or relative to the cgroup2 mount; default: create fptune)")
	return cmd
}

func execCmd(name *string) *cobra.Command {
	var cgroupArg string
	cmd := &cobra.Command{
		Use:   "exec [--cgroup PATH] -- CMD [ARG...]",
		Short: "Run a command inside the tuned cgroup, with the command's exit code",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cli.Usagef("%s needs a command; usage: %s", cmd.CommandPath(), cmd.UseLine())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			path := cgroupArg
			if path == "" {
				rec, err := LoadRecord(*name)
				if errors.Is(err, os.ErrNotExist) {
					return cli.Usagef("no policy %q is applied; run `flowplane tune apply --config FILE` or give --cgroup", *name)
				}
				if err != nil {
					return err
				}
				path = cgroup.Reach(rec.Cgroup)
			} else {
				var err error
				if path, err = cgroup.Resolve(path); err != nil {
					return cli.Usage(err)
				}
			}
			return RunIn(cmd.Context(), path, args, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&cgroupArg, "cgroup", "", "cgroup v2 to run in (default: the applied policy's)")
	return cmd
}

// RunIn runs argv as a child born in cgroupPath (clone3 CLONE_INTO_CGROUP: no moment outside it)
// and returns cli.Run's error: its exit code, or 127 when it could not start. Cancelling ctx (flowplane got SIGINT or
// SIGTERM) passes SIGTERM on to the child and waits for it.
func RunIn(ctx context.Context, cgroupPath string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
	c.Stdin, c.Stdout, c.Stderr = stdin, stdout, stderr
	fd, err := cgroup.Into(c, cgroupPath)
	if err != nil {
		return err
	}
	defer fd.Close()
	err = cli.Run(c)
	if errors.Is(err, syscall.EBUSY) { // clone3 into a cgroup that is not a leaf
		return fmt.Errorf("run %s in cgroup %s: %w: the cgroup enables controllers for its children, so it takes no process; give a cgroup without children", argv[0], cgroup.HostPath(cgroupPath), err)
	}
	return err
}

func explainCmd(name *string) *cobra.Command {
	var local, policy string
	var passive, asJSON bool
	cmd := &cobra.Command{
		Use:   "explain REMOTE[:PORT] [--local ADDR[:PORT]] [--passive] [--config FILE] [--json]",
		Short: "Show which rule a connection matches and the exact values it gets",
		Args:  cli.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := HostKernel()
			if err != nil {
				return err
			}
			var pol *Policy
			if policy != "" {
				if pol, _, err = loadPolicy(policy, k); err != nil {
					return err
				}
			} else {
				rec, err := LoadRecord(*name)
				if errors.Is(err, os.ErrNotExist) {
					return cli.Usagef("no policy %q is applied; give --config FILE", *name)
				}
				if err != nil {
					return err
				}
				if pol, err = Parse(rec.File, []byte(rec.YAML), k); err != nil {
					return err
				}
			}
			f := Flow{Dir: Active}
			if passive {
				f.Dir = Passive
			}
			if f.Remote, f.RemotePort, err = parseEndpoint(args[0]); err != nil {
				return cli.Usagef("REMOTE: %v", err)
			}
			if local != "" {
				if f.Local, f.LocalPort, err = parseEndpoint(local); err != nil {
					return cli.Usagef("--local: %v", err)
				}
			}
			e := Explain(pol, f, k)
			if asJSON {
				out := map[string]any{"rule": e.Index, "treated": e.Treated, "values": e.Values}
				if e.Rule != nil {
					out["rule_name"], out["profile"] = e.Rule.Name, e.Rule.Profile
				}
				return cli.WriteJSON(cmd.OutOrStdout(), out)
			}
			e.Print(cmd.OutOrStdout(), f.LocalPort != 0)
			return nil
		},
	}
	cmd.Flags().StringVar(&local, "local", "", "local address[:port] of the connection")
	cmd.Flags().BoolVar(&passive, "passive", false, "the connection is accepted, not initiated")
	cli.ConfigFlag(cmd, &policy, "explain against this policy file instead of the applied policy", "", "")
	cli.AliasFlag(cmd, "policy", "config", "tune explain --policy FILE", "tune explain --config FILE")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// parseEndpoint reads ADDR, ADDR:PORT or [V6]:PORT.
func parseEndpoint(s string) (netip.Addr, uint16, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr(), ap.Port(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("%q is not ADDR, ADDR:PORT or [IPV6]:PORT", s)
	}
	return a, 0, nil
}

func statusCmd(name *string) *cobra.Command {
	return cli.StatusCommand("Show the applied policy, per-rule hits and per-setting kernel refusals", func() (*Status, error) {
		k, err := HostKernel()
		if err != nil {
			return nil, err
		}
		st, err := ReadStatus(*name, k)
		if errors.Is(err, ErrNotApplied) {
			if names, _ := runstate.Names(subsystem); len(names) > 0 {
				err = fmt.Errorf("%w; applied: %s (give --name NAME)", err, strings.Join(names, ", "))
			}
			return nil, cli.Usage(err)
		}
		return st, err
	}, printStatus)
}

func printStatus(out io.Writer, st *Status) {
	if st.Leftover != "" {
		fmt.Fprintf(out, "policy %s: leftover: %s (the next tune apply or remove --name %s cleans it)\n", st.Name, st.Leftover, st.Name)
		return
	}
	fmt.Fprintf(out, "policy %s from %s on cgroup %s (generation %d, applied %s)\n", st.Name, st.File, st.Cgroup, st.Generation, st.Applied.Format("2006-01-02 15:04:05"))
	fmt.Fprintf(out, "program %d, link %d\n", st.ProgramID, st.LinkID)
	if len(st.OtherSockOp) == 0 {
		fmt.Fprintln(out, "other sock_ops programs for these sockets: none")
	} else {
		fmt.Fprintf(out, "other sock_ops programs for these sockets (multi-attach; they run after ours and may override its replies):")
		for _, o := range st.OtherSockOp {
			fmt.Fprintf(out, " %d(%s)", o.ID, o.Name)
		}
		fmt.Fprintln(out)
	}
	// The rules are the applied policy's; the other counters run on from the first apply.
	fmt.Fprintf(out, "connections since the first apply: %d active, %d passive; %d tuned, %d sampled out, %d unmatched; %d reactions\n",
		st.Counters["active"], st.Counters["passive"], st.Counters["matched"], st.Counters["sampled_out"], st.Counters["unmatched"], st.Counters["reacted"])
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tNAME\tPROFILE\tTREATED\tSAMPLED OUT\tMATCH (since this policy was applied)")
	for _, r := range st.Rules {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\n", r.Index, r.Name, r.Profile, r.Treated, r.SampledOut, r.Match)
	}
	tw.Flush()
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTING\tAPPLIED\tREFUSED (since the first apply)")
	for _, s := range st.Settings {
		ref := "-"
		if len(s.Errors) > 0 {
			ref = ""
			for i, e := range s.Errors {
				if i > 0 {
					ref += ", "
				}
				ref += strconv.FormatUint(e.Count, 10) + "×" + e.Name
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", s.Setting, s.Applied, ref)
	}
	tw.Flush()
	for _, w := range st.Warnings {
		fmt.Fprintln(out, "warning:", w)
	}
}

func removeCmd(name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "remove [--name N]",
		Short: "Detach the policy and remove what apply created",
		Args:  cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := RemoveResult(*name)
			if err := cli.Removed(cmd, res, err, ErrNotApplied); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tune: removed policy %s\n", *name)
			return nil
		},
	}
}
