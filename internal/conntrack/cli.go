package conntrack

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/ipnet"
	"github.com/flowplane/flowplane/internal/pin"
)

// Command is `flowplane conntrack`.
func Command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "conntrack",
		Short: "XDP stateful connection-tracking forwarder (nf_conntrack semantics)",
		Long: `conntrack forwards between interfaces in XDP (or, with run --hook tc, at tcx ingress)
and tracks every TCP, UDP and ICMP flow with nf_conntrack's semantics. New connections may
come from inside interfaces (and, if configured, to listed ports and prefixes from outside);
packets of known connections pass both ways; everything else is dropped and counted. Each
network namespace has its own instance, pinned under /sys/fs/bpf/flowplane/conntrack/ns<inode>;
list, status, flush, events, timeout and remove act on the instance of the namespace they run in.`,
	}
	cmd.AddCommand(runCmd(), listCmd(), flushCmd(), statusCmd(), eventsCmd(), timeoutCmd(), removeCmd(),
		cli.Alias(statusCmd(), "stats [--json]", "conntrack stats", "conntrack status"),
		cli.Alias(removeCmd(), "unpin", "conntrack unpin", "conntrack remove"))
	return cmd
}

func runCmd() *cobra.Command {
	var inside, outside, timeouts []string
	var file, metrics, mode, hook string
	var liberal bool
	cmd := &cobra.Command{
		Use:   "run --inside IF... --outside IF... [--hook auto|xdp|tc] [--config FILE] [--metrics ADDR]",
		Short: "Forward and track between the interfaces until interrupted",
		Args:  cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := LoadConfig(file)
			if err != nil {
				return cli.Usage(err)
			}
			cfg.Inside, cfg.Outside = inside, outside
			if cmd.Flags().Changed("mode") {
				cfg.Mode = mode
			}
			if cmd.Flags().Changed("hook") {
				cfg.Hook = hook
			}
			if cmd.Flags().Changed("liberal") {
				cfg.Liberal = liberal
			}
			for _, s := range timeouts {
				name, val, ok := strings.Cut(s, "=")
				if !ok {
					return cli.Usagef("--timeout %q: want name=duration", s)
				}
				if cfg.Timeouts == nil {
					cfg.Timeouts = map[string]string{}
				}
				cfg.Timeouts[name] = val
			}
			r, err := cfg.resolve()
			if err != nil {
				return cli.Usage(err)
			}
			in, err := interfaces(inside)
			if err != nil {
				return err
			}
			out, err := interfaces(outside)
			if err != nil {
				return err
			}
			if metrics != "" {
				if _, _, err := net.SplitHostPort(metrics); err != nil {
					return cli.Usagef("--metrics %q: %v", metrics, err)
				}
			}
			ctx := cmd.Context() // main cancels it on SIGINT and SIGTERM
			return Run(ctx, r, in, out, metrics)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&inside, "inside", nil, "inside interface: may open connections (repeatable)")
	f.StringArrayVar(&outside, "outside", nil, "outside interface: only replies and allowed connections (repeatable)")
	f.StringVar(&file, "config", "", "YAML configuration file (docs/conntrack.md)")
	f.StringVar(&metrics, "metrics", "", "serve Prometheus /metrics on this address (host:port)")
	f.StringVar(&mode, "mode", "firewall", "firewall (drop refused packets) or track (only observe)")
	f.StringVar(&hook, "hook", HookAuto, "where to run: auto (per interface: xdp where it can forward at full speed, tc elsewhere), xdp (before the skb; fastest per packet; refused where it would lose traffic) or tc (tcx ingress, after GRO)")
	f.BoolVar(&liberal, "liberal", false, "accept TCP segments outside the tracked window (nf's tcp_be_liberal)")
	f.StringArrayVar(&timeouts, "timeout", nil, "override a timeout, e.g. tcp_established=1h (repeatable)")
	return cmd
}

func interfaces(names []string) ([]*net.Interface, error) {
	var out []*net.Interface
	for _, n := range names {
		ifc, err := ipnet.Interface(n)
		if err != nil {
			return nil, cli.Usage(err)
		}
		out = append(out, ifc)
	}
	return out, nil
}

func listCmd() *cobra.Command {
	var asJSON bool
	var proto, state string
	cmd := &cobra.Command{
		Use:   "list [--json] [--proto P] [--state S]",
		Short: "List tracked connections, like conntrack -L",
		Args:  cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			proto, state = strings.ToLower(proto), strings.ToUpper(state)
			switch proto {
			case "", "tcp", "udp", "icmp", "icmpv6":
			default:
				return cli.Usagef("--proto %q: want tcp, udp, icmp or icmpv6", proto)
			}
			if state != "" && !validState(state) {
				return cli.Usagef("--state %q: want one of %s, NEW", state, strings.Join(tcpStateNames, ", "))
			}
			return withTables(func(t *Tables) error {
				all, err := t.List()
				if err != nil {
					return err
				}
				es := []Entry{}
				for _, e := range all {
					if (proto == "" || e.Proto == proto) && (state == "" || e.State == state) {
						es = append(es, e)
					}
				}
				if asJSON {
					return cli.WriteJSON(cmd.OutOrStdout(), es)
				}
				for _, e := range es {
					fmt.Fprintln(cmd.OutOrStdout(), e.String())
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "conntrack: %d flow entries listed\n", len(es))
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&proto, "proto", "", "only this protocol (tcp, udp, icmp, icmpv6)")
	cmd.Flags().StringVar(&state, "state", "", "only this state (e.g. ESTABLISHED, TIME_WAIT, NEW)")
	return cmd
}

func validState(s string) bool {
	if s == "NEW" {
		return true
	}
	for _, n := range tcpStateNames {
		if n == s {
			return true
		}
	}
	return false
}

func (t Tuple) String(proto string) string {
	if proto == "icmp" || proto == "icmpv6" {
		return fmt.Sprintf("src=%s dst=%s id=%d", t.Src, t.Dst, t.ID)
	}
	return fmt.Sprintf("src=%s dst=%s sport=%d dport=%d", t.Src, t.Dst, t.Sport, t.Dport)
}

// String formats e as conntrack -L does.
func (e Entry) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-6s %d %d ", e.Proto, protoNumber(e.Proto), int(e.Timeout))
	if e.Proto == "tcp" {
		b.WriteString(e.State + " ")
	}
	fmt.Fprintf(&b, "%s packets=%d bytes=%d ", e.Orig.String(e.Proto), e.Packets[0], e.Bytes[0])
	if !e.SeenReply {
		b.WriteString("[UNREPLIED] ")
	}
	fmt.Fprintf(&b, "%s packets=%d bytes=%d", e.Reply.String(e.Proto), e.Packets[1], e.Bytes[1])
	if e.Assured {
		b.WriteString(" [ASSURED]")
	}
	if !e.Confirmed {
		b.WriteString(" [UNCONFIRMED]")
	}
	return b.String()
}

// withTables runs fn on this namespace's pinned tables and closes them after.
func withTables(fn func(t *Tables) error) error {
	t, err := OpenPinned()
	if errors.Is(err, ErrNoInstance) {
		return cli.Usage(err)
	}
	if err != nil {
		return err
	}
	defer t.Close()
	return fn(t)
}

func flushCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "flush",
		Short: "Delete every tracked connection, like conntrack -F",
		Args:  cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withTables(func(t *Tables) error {
				n, err := t.Flush()
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "conntrack: flushed %d connections\n", n)
				return nil
			})
		},
	}
}

// Status is what `conntrack status` shows: where the instance is attached, its table sizes and
// its counters.
type Status struct {
	Counters           Counters       `json:"counters"`
	Entries            map[string]int `json:"entries"`  // confirmed, unconfirmed
	Capacity           map[string]int `json:"capacity"` // the tables' sizes: confirmed, unconfirmed
	UnconfirmedEvicted uint64         `json:"unconfirmed_evicted"`
	Interfaces         []IfaceHook    `json:"interfaces"`
	Running            bool           `json:"running"`        // a run is attached
	Mode               string         `json:"mode,omitempty"` // the run's: firewall or track
	// Leftover says what a run killed before it could clean up left (the next run or remove
	// cleans it; internal/attach).
	Leftover string `json:"leftover,omitempty"`
}

// ReadStatus reads the status of this network namespace's instance.
func ReadStatus() (*Status, error) {
	var st *Status
	err := withTables(func(t *Tables) error {
		c, err := t.ReadCounters()
		if err != nil {
			return err
		}
		conf, unconf, err := t.Count()
		if err != nil {
			return err
		}
		hooks, mode, err := AttachedHooks()
		if err != nil {
			return err
		}
		run, left, err := runState()
		if err != nil {
			return err
		}
		if hooks != nil && !run && left == nil {
			left = &attach.Problem{Why: "ct_hooks lists interfaces but no run recorded them (a run killed while it attached)"}
		}
		if !run || hooks == nil {
			hooks, mode = []IfaceHook{}, ""
		}
		st = &Status{Counters: c, Entries: map[string]int{"confirmed": conf, "unconfirmed": unconf},
			Capacity:           map[string]int{"confirmed": int(t.Main.MaxEntries()), "unconfirmed": int(t.Emb.MaxEntries())},
			UnconfirmedEvicted: Evicted(c, unconf), Interfaces: hooks, Running: run, Mode: mode}
		if left != nil {
			st.Leftover = left.Why
		}
		return nil
	})
	return st, err
}

// runState says whether a run is attached in this namespace, or what a killed one left.
func runState() (running bool, left *attach.Problem, err error) {
	inst, err := Instance()
	if err != nil {
		return false, nil, err
	}
	in := runInstance(inst)
	if left, err = in.Leftover(); err != nil || left != nil {
		return false, left, err
	}
	return in.HasRecord(), nil, nil
}

func statusCmd() *cobra.Command {
	return cli.StatusCommand("Show where the instance is attached, its table sizes and counters", ReadStatus, printStatus)
}

func printStatus(w io.Writer, st *Status) {
	c, hooks := st.Counters, st.Interfaces
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if st.Running {
		fmt.Fprintf(tw, "running\tyes\n")
		if st.Mode != "" {
			fmt.Fprintf(tw, "mode\t%s\n", st.Mode)
		}
	} else {
		fmt.Fprintf(tw, "running\tno (the tables are pinned; no run is attached)\n")
	}
	if st.Leftover != "" {
		fmt.Fprintf(tw, "leftover\t%s (the next run or remove cleans it)\n", st.Leftover)
	}
	for _, h := range hooks {
		fmt.Fprintf(tw, "interface %s\t%s, hook %s\n", h.Interface, h.Role, h.Hook)
	}
	for _, k := range []string{"confirmed", "unconfirmed"} {
		fmt.Fprintf(tw, "entries %s\t%d of %d\n", k, st.Entries[k], st.Capacity[k])
	}
	fmt.Fprintf(tw, "unconfirmed_evicted\t%d\n", st.UnconfirmedEvicted)
	for _, n := range StatNames {
		fmt.Fprintf(tw, "%s\t%d\n", n, c[n])
	}
	tw.Flush()
}

func eventsCmd() *cobra.Command {
	var asJSON, stamp bool
	cmd := &cobra.Command{
		Use:   "events [--json | --timestamp]",
		Short: "Print connections as they are created and destroyed, like conntrack -E",
		Long: `events prints [NEW] when the data path creates a connection and [DESTROY] when one is
removed: a SYN reopening a closed one, a RST as a connection's only reply, an expired entry
found by a packet, the sweep of 'run', or 'flush'. Not reported: unconfirmed entries evicted
from the full LRU table. It shows what happens after it starts; JSON lines carry each event's
time, and --timestamp puts it first on each text line (as conntrack -E -o timestamp). Only
one reader at a time gets each event.`,
		Args: cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if asJSON && stamp {
				return cli.Usagef("--timestamp is for text lines: JSON lines carry the time already")
			}
			return withTables(func(t *Tables) error {
				r, err := OpenEvents(t)
				if err != nil {
					return err
				}
				ctx := cmd.Context() // main cancels it on SIGINT and SIGTERM
				return r.Read(ctx, func(ev Event) {
					if asJSON {
						_ = json.NewEncoder(cmd.OutOrStdout()).Encode(ev)
						return
					}
					if stamp {
						fmt.Fprintln(cmd.OutOrStdout(), ev.Stamped())
						return
					}
					fmt.Fprintln(cmd.OutOrStdout(), ev.String())
				})
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON lines")
	cmd.Flags().BoolVar(&stamp, "timestamp", false, "begin each line with the event's time, in seconds since the epoch")
	return cmd
}

func timeoutCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "timeout [NAME=DURATION...]",
		Short: "Show or change the timeouts of the running instance, without a reload",
		RunE: func(cmd *cobra.Command, args []string) error {
			over := map[string]time.Duration{}
			var set []string
			for _, a := range args {
				name, d, err := ParseTimeout(a)
				if err != nil {
					return cli.Usage(err)
				}
				if _, dup := over[name]; !dup {
					set = append(set, name)
				}
				over[name] = d
			}
			return withTables(func(t *Tables) error {
				if len(over) > 0 {
					if err := t.SetTimeouts(over); err != nil {
						return err
					}
					for i, n := range set {
						set[i] = n + "=" + over[n].String()
					}
					fmt.Fprintf(cmd.OutOrStdout(), "conntrack: set timeout %s\n", strings.Join(set, " "))
					if running, _, err := runState(); err == nil && !running {
						fmt.Fprintln(cmd.ErrOrStderr(), "conntrack: no run is attached: these apply to the pinned tables until the next run, which sets its own (its config and --timeout)")
					}
					return nil
				}
				to, liberal, err := t.Timeouts()
				if err != nil {
					return err
				}
				names := make([]string, 0, len(to))
				for n := range to {
					if n != "tcp_none" {
						names = append(names, n)
					}
				}
				sort.Slice(names, func(i, j int) bool { return indexOf(names[i]) < indexOf(names[j]) })
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				for _, n := range names {
					fmt.Fprintf(tw, "%s\t%s\n", n, to[n])
				}
				fmt.Fprintf(tw, "liberal\t%v\n", liberal)
				return tw.Flush()
			})
		},
	}
}

func indexOf(name string) int {
	for i, n := range timeoutNames {
		if n == name {
			return i
		}
	}
	return len(timeoutNames)
}

func removeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove",
		Short: "Remove this namespace's pinned tables; stop run first",
		Args:  cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			inst, err := Instance()
			if err != nil {
				return err
			}
			dir := pin.Path("conntrack", inst)
			if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
				return cli.Usagef("no conntrack instance in this network namespace (%s): nothing to remove", pin.Shown("conntrack", inst))
			}
			// A running run keeps its tables: removing them under it would leave a firewall
			// that no other command can see. A record left by a run that was killed goes
			// first, with internal/attach's order.
			if running, left, err := runState(); err != nil {
				return err
			} else if running {
				return cli.Usagef("conntrack run is attached in this network namespace: stop it first (Ctrl-C, or SIGTERM to its process), then remove")
			} else if left != nil {
				if _, err := runInstance(inst).Remove(); err != nil && !errors.Is(err, attach.ErrAbsent) {
					return err
				}
				left.What = runInstance(inst).What
				cli.Cleaned(cmd, left)
			}
			if err := pin.Remove("conntrack", inst); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "conntrack: removed the tables of this network namespace (%s)\n", pin.Shown("conntrack", inst))
			return nil
		},
	}
}
