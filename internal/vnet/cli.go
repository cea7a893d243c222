package vnet

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/topo"
	"github.com/flowplane/flowplane/internal/vnet/tcp"
)

type cliFlags struct {
	file     string
	basePort int
	cc       string
	noSACK   bool
	noTS     bool
	noWS     bool
	noNagle  bool
	noDelAck bool
	minRTO   time.Duration
	seed     uint64
	taps     []string
}

func (f *cliFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&f.basePort, "base-port", 0, "first UDP port (link i uses base+2i and base+2i+1); 0 derives it from the topology name")
	fl.StringVar(&f.cc, "cc", "cubic", "TCP congestion control: reno or cubic")
	fl.BoolVar(&f.noSACK, "no-sack", false, "disable SACK")
	fl.BoolVar(&f.noTS, "no-timestamps", false, "disable TCP timestamps")
	fl.BoolVar(&f.noWS, "no-window-scaling", false, "disable window scaling")
	fl.BoolVar(&f.noNagle, "no-nagle", false, "disable Nagle's algorithm")
	fl.BoolVar(&f.noDelAck, "no-delayed-ack", false, "acknowledge every segment at once")
	fl.DurationVar(&f.minRTO, "min-rto", 200*time.Millisecond, "floor of the retransmission timeout")
	fl.Uint64Var(&f.seed, "seed", 0, "seed for link impairments (0: random)")
	fl.StringArrayVar(&f.taps, "tap", nil, "NODE=NETNS: give NODE an interface on a TAP device in network namespace NETNS, so Linux there can reach vnet (root; repeatable)")
}

func (f *cliFlags) options() (Options, error) {
	cfg := tcp.DefaultConfig()
	if _, err := tcp.NewCC(f.cc); err != nil {
		return Options{}, cli.Usagef("--cc: %w", err)
	}
	if f.minRTO < time.Millisecond || f.minRTO > time.Minute {
		return Options{}, cli.Usagef("--min-rto %v is out of range; use 1ms to 1m", f.minRTO)
	}
	if f.basePort < -1 || f.basePort > 65535 {
		return Options{}, cli.Usagef("--base-port %d is out of range; use 1024-65535, or 0 to derive it", f.basePort)
	}
	cfg.CC, cfg.SACK, cfg.Timestamps, cfg.WindowScale = f.cc, !f.noSACK, !f.noTS, !f.noWS
	cfg.Nagle, cfg.DelayedAck, cfg.MinRTO = !f.noNagle, !f.noDelAck, f.minRTO
	// Logger nil: slog's default, whose level flowplane's -v sets (protocol events are debug).
	opts := Options{BasePort: f.basePort, TCP: cfg, Seed: f.seed}
	for _, tp := range f.taps {
		spec, err := ParseTAPSpec(tp)
		if err != nil {
			return Options{}, err
		}
		opts.TAPs = append(opts.TAPs, spec)
	}
	return opts, nil
}

// load reads the flags and the topology file every subcommand starts from.
func (f *cliFlags) load(cmd *cobra.Command) (Options, *topo.Topology, error) {
	if err := cli.Require(cmd, "config"); err != nil {
		return Options{}, nil, err
	}
	opts, err := f.options()
	if err != nil {
		return Options{}, nil, err
	}
	t, err := loadTopo(f.file)
	return opts, t, err
}

// configFlag adds --config FILE, and the deprecated positional FILE of the verb.
func (f *cliFlags) configFlag(cmd *cobra.Command, verb string) {
	cli.ConfigFlag(cmd, &f.file, "topology file (YAML; docs/vnet.md)", "vnet "+verb+" FILE", "vnet "+verb+" --config FILE")
}

func loadTopo(path string) (*topo.Topology, error) {
	t, err := topo.Load(path)
	if err != nil {
		var te topo.Errors
		if errors.As(err, &te) {
			return nil, cli.Usage(err) // already says file:line: field: what and how to fix
		}
		return nil, cli.Usagef("topology %s: %w", path, err)
	}
	return t, nil
}

// Command is the vnet command tree: up, node and exec.
func Command() *cobra.Command {
	root := &cobra.Command{
		Use:   "vnet",
		Short: "User-space TCP/IP network over UDP links (IPv4, RIP, TCP)",
		Long: "vnet runs a topology's hosts and routers as user-space IP stacks whose links are UDP sockets on " +
			"127.0.0.1, with per-link loss, delay, jitter, reordering, duplication, corruption and rate from the file. " +
			"See docs/vnet.md.",
	}
	root.AddCommand(upCommand(), nodeCommand(), execCommand())
	return root
}

func upCommand() *cobra.Command {
	var f cliFlags
	cmd := &cobra.Command{
		Use:   "up --config FILE",
		Short: "Run the whole topology in this process with a command shell on stdin",
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, t, err := f.load(cmd)
			if err != nil {
				return err
			}
			nw, err := Start(t, opts)
			if err != nil {
				return err
			}
			defer nw.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "vnet %s: %s, %s up; type help\n", t.Name, cli.Count(len(t.Nodes), "node"), cli.Count(len(t.Links), "link"))
			return serve(cmd, NewShell(cmd.OutOrStdout(), nw, nw.Nodes()...))
		},
	}
	f.register(cmd)
	f.configFlag(cmd, "up")
	return cmd
}

func nodeCommand() *cobra.Command {
	var f cliFlags
	var name string
	cmd := &cobra.Command{
		Use:   "node --config FILE --name NODE",
		Short: "Run one node of the topology; its neighbours run in other processes",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return cli.Usagef("--name is required: the node of the topology to run; usage: %s", cmd.UseLine())
			}
			opts, t, err := f.load(cmd)
			if err != nil {
				return err
			}
			n, err := StartNode(t, name, opts)
			if err != nil {
				return err
			}
			defer n.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "vnet %s: node %s up; type help\n", t.Name, name)
			return serve(cmd, NewShell(cmd.OutOrStdout(), nil, n))
		},
	}
	f.register(cmd)
	f.configFlag(cmd, "node")
	cmd.Flags().StringVar(&name, "name", "", "node to run")
	return cmd
}

func execCommand() *cobra.Command {
	var f cliFlags
	var cmds []string
	var script string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "exec --config FILE [-c CMD]... [--script F]",
		Short: "Run the topology, wait for routing, run commands non-interactively, and exit",
		Long: "exec starts the whole network in this process, waits until RIP has converged, then runs each -c " +
			"command (or the lines of --script, or of stdin when neither is given) in order. Commands are those " +
			"of the shell (type help in vnet up); prefix one with a node name to pick the node. The first " +
			"failing command stops the run with an error.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, t, err := f.load(cmd)
			if err != nil {
				return err
			}
			var in io.Reader
			switch {
			case script != "" && len(cmds) > 0:
				return cli.Usage(errors.New("give commands with -c or --script, not both"))
			case script != "":
				fh, err := os.Open(script)
				if err != nil {
					return cli.Usagef("--script: %w", err)
				}
				defer fh.Close()
				in = fh
			case len(cmds) > 0:
				in = strings.NewReader(strings.Join(cmds, "\n"))
			default:
				in = cmd.InOrStdin()
			}
			if opts.BasePort == 0 {
				opts.BasePort = -1 // one process: let the kernel pick ports, no collisions
			}
			nw, err := Start(t, opts)
			if err != nil {
				return err
			}
			defer nw.Close()
			if err := nw.WaitConverged(timeout); err != nil {
				return err
			}
			sh := NewShell(cmd.OutOrStdout(), nw, nw.Nodes()...)
			sh.Timeout = timeout
			err = sh.Run(in, false, true)
			var ue *cli.UsageError
			if err != nil && !errors.As(err, &ue) {
				return fmt.Errorf("vnet exec: %w", err)
			}
			return err
		},
	}
	f.register(cmd)
	f.configFlag(cmd, "exec")
	cmd.Flags().StringArrayVarP(&cmds, "command", "c", nil, "command to run (repeatable)")
	cmd.Flags().StringVar(&script, "script", "", "file of commands, one a line")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "limit for routing to converge and for each blocking command")
	return cmd
}

// serve runs the shell on stdin until quit, EOF, or a signal; after EOF of a non-interactive
// stdin the network keeps running until a signal, like a daemon.
func serve(cmd *cobra.Command, sh *Shell) error {
	ctx := cmd.Context() // main cancels it on SIGINT and SIGTERM
	done := make(chan error, 1)
	interactive := isTerminal(cmd.InOrStdin())
	go func() { done <- sh.Run(cmd.InOrStdin(), interactive, false) }()
	select {
	case err := <-done:
		if err != nil || interactive || sh.quit {
			return err
		}
		<-ctx.Done()
		return nil
	case <-ctx.Done():
		return nil
	}
}

func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
