// Command prio runs prio's experiments (docs/prio.md, "Experiments") in one dumbbell lab:
// senders s1, s2 → r1 → bottleneck (r1's HTB at -rate) → r2 → receivers d1, d2. Every scheme
// runs on the same lab, one after the other, with the host option writer on the senders'
// cgroup throughout:
//
//  1. fairness: N long-lived flows, per-flow goodput (TCP_INFO bytes acked), Jain's index,
//     utilization;
//  2. flow completion times: web-search and data-mining sizes, Poisson arrivals at a load,
//     persistent connections, a few long flows in the background;
//  3. cost: the classifier's ns/packet (BPF_PROG_TEST_RUN) against an empty program, and TCP
//     goodput through an unshaped r1 with the host writer and classifier against without.
//
// Tables go to stdout (ratios against fifo / the baseline of the same run), flows to
// bench/results/prio/*.jsonl, plots to bench/results/prio/*.png, a summary to
// bench/results/prio.json; with the receivers' links delayed (-delay), under the name prio-wan
// instead (bench/prio-wan). Run as root: go run ./bench/prio [-exp fair,fct,cost] [-d 60s].
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/match"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/prio"
	"github.com/flowplane/flowplane/internal/units"
)

// The dumbbell. r1's interface towards r2 is the bottleneck; lab links are unshaped (prio
// router builds the HTB tree itself).
const topology = `
nodes:
  s1: {}
  s2: {}
  r1: {kind: router}
  r2: {kind: router}
  d1: {}
  d2: {}
links:
  - endpoints: [s1, r1]
  - endpoints: [s2, r1]
  - endpoints: [r1, r2]
  - endpoints: [r2, d1]
  - endpoints: [r2, d2]
`

const sinkPort = 5500

type config struct {
	exps        []string
	schemes     []string // fairness and cost
	fctSchemes  []string
	flows       []int
	runs        int
	costRounds  int
	flowCycles  int
	flowPeriod  time.Duration
	flowStates  []flowState
	costArms    []costArm
	costOffload []string // offload modes of the throughput rounds, in this order
	costCC      string   // the cost flows' congestion control (iperf3 -C)
	workloads   []string
	loads       []float64
	dur         time.Duration
	fctDur      time.Duration
	rate        uint64
	leaves      int
	limit       int
	fifoLimit   int
	bg          int
	capBytes    float64
	delays      []time.Duration // one-way delays of the receivers' links (the lab's relay), a lab each
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "gen" {
		if err := genMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
		return
	}
	var c config
	exps := flag.String("exp", "cost,fair,fct", "experiments: cost, fair, fct (the quick one first)")
	schemes := flag.String("schemes", "fifo,fair,occupancy,occupancy-strict,backlog,pias", "fair and cost: schemes compared (occupancy-strict: the original's strict priority between bands; FILE.yaml: a router policy file)")
	fctSchemes := flag.String("fct-schemes", "fifo,fair,occupancy,backlog,pias", "fct: schemes compared (FILE.yaml: a router policy file)")
	flows := flag.String("flows", "20,200,1000", "fair: numbers of long-lived flows")
	workloads := flag.String("workloads", "websearch,datamining", "fct: CDFs under bench/prio/cdf/")
	loads := flag.String("loads", "0.5,0.8", "fct: offered loads")
	flag.IntVar(&c.runs, "runs", 3, "fair: rounds, the schemes taking turns in each; cells are medians, with Jain's range (one 60-s run of occupancy moves by a few hundredths)")
	flag.IntVar(&c.costRounds, "cost-rounds", 18, "cost: interleaved rounds of every arm (a multiple of the number of arms: each takes every place in a round equally often)")
	flag.IntVar(&c.flowCycles, "flow-cycles", 1000, "cost: cycles of the within-flow measurement (every state a period each, in one iperf3 flow; 0: none)")
	flag.DurationVar(&c.flowPeriod, "flow-period", 250*time.Millisecond, "cost: how long each state holds within one flow (the first fifth not counted)")
	flowStateKeys := flag.String("flow-states", "plain,writer+classifier", "cost: states within one flow (plain, the baseline, among them)")
	costArmKeys := flag.String("cost-arms", "plain,room,tcx-empty,writer,classifier,writer+classifier,htb,htb+classifier,writer+htb+classifier", "cost: arms measured (plain first, the baseline)")
	costOffload := flag.String("cost-offload", "on,off", "cost: offload modes of the throughput rounds: on (the sender's TSO/GSO), off (MTU-sized packets end to end), gro (MTU-sized on the wire, GRO on r1's ingress)")
	flag.StringVar(&c.costCC, "cost-cc", "cubic", "cost: the flows' congestion control (bbr drains a flow for 200 ms every 10 s in PROBE_RTT, which lands in one state's period at random)")
	flag.DurationVar(&c.dur, "d", 60*time.Second, "fair: measured window per run")
	flag.DurationVar(&c.fctDur, "fct-d", 100*time.Second, "fct: arrival period per run (100 s: a few hundred small flows per run, so a p99 is not one flow)")
	rate := flag.String("rate", "100mbit", "bottleneck rate")
	flag.IntVar(&c.leaves, "leaves", 0, "leaves per band (K; 0: the router policy's default)")
	flag.IntVar(&c.limit, "limit", 0, "packets per leaf queue (0: the router policy's default, a band's 2048 packets over its leaves)")
	flag.IntVar(&c.fifoLimit, "fifo-limit", 0, "packets in fifo's one queue (0: the router policy's default, as many as a band of the others)")
	flag.IntVar(&c.bg, "bg", 2, "fct: long-lived background flows per sender")
	flag.Float64Var(&c.capBytes, "cap", 30e6, "fct: largest flow size, bytes")
	delays := flag.String("delay", "0", "one-way delays of the links to d1 and d2 (the lab's relay), for a longer RTT than the lab's microseconds, e.g. 250us; several (250us,500us): the experiments run once per delay, each on a lab of its own. Any delay but 0 saves the results as prio-wan, not prio")
	flag.Parse()
	if c.runs < 1 {
		fmt.Fprintf(os.Stderr, "-runs: %d is not a number of rounds (give 1 or more)\n", c.runs)
		os.Exit(2)
	}
	for name, n := range map[string]int{"-cost-rounds": c.costRounds, "-flow-cycles": c.flowCycles} {
		if n < 0 {
			fmt.Fprintf(os.Stderr, "%s: %d is not a count (give 0 or more; 0: none)\n", name, n)
			os.Exit(2)
		}
	}
	c.exps, c.schemes, c.fctSchemes, c.workloads = split(*exps), split(*schemes), split(*fctSchemes), split(*workloads)
	var err error
	if c.costArms, err = costArms(split(*costArmKeys)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if c.flowStates, err = pickFlowStates(split(*flowStateKeys)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if c.flowPeriod < 50*time.Millisecond {
		fmt.Fprintf(os.Stderr, "-flow-period: %v is shorter than a switch settles (give 50ms or more)\n", c.flowPeriod)
		os.Exit(2)
	}
	if c.costRounds%len(c.costArms) != 0 {
		fmt.Fprintf(os.Stderr, "-cost-rounds: %d is not a multiple of the %d arms (each must take every place in a round equally often)\n", c.costRounds, len(c.costArms))
		os.Exit(2)
	}
	for _, s := range split(*costOffload) {
		if (s != offloadOn && s != offloadOff && s != offloadGRO) || slices.Contains(c.costOffload, s) {
			fmt.Fprintf(os.Stderr, "-cost-offload: %q: give one or more of on, gro, off, each once\n", *costOffload)
			os.Exit(2)
		}
		c.costOffload = append(c.costOffload, s)
	}
	if len(c.costOffload) == 0 {
		fmt.Fprintln(os.Stderr, "-cost-offload: give one or more of on, gro, off")
		os.Exit(2)
	}
	for _, s := range split(*flows) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "-flows: %q is not a number of flows\n", s)
			os.Exit(2)
		}
		c.flows = append(c.flows, n)
	}
	for _, s := range split(*loads) {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f <= 0 || f >= 1 {
			fmt.Fprintf(os.Stderr, "-loads: %q is not a load between 0 and 1\n", s)
			os.Exit(2)
		}
		c.loads = append(c.loads, f)
	}
	for _, s := range split(*delays) {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 || d > time.Second || slices.Contains(c.delays, d) {
			fmt.Fprintf(os.Stderr, "-delay: %q: give durations from 0 to 1s, each once (e.g. 250us,500us)\n", s)
			os.Exit(2)
		}
		c.delays = append(c.delays, d)
	}
	if len(c.delays) == 0 {
		c.delays = []time.Duration{0}
	}
	if c.rate, err = units.ParseRate(*rate); err != nil {
		fmt.Fprintf(os.Stderr, "-rate: %v\n", err)
		os.Exit(2)
	}
	// A lost terminal or output pipe (| head) stops the bench as ^C does, and it cleans up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	defer stop()
	if err := run(ctx, c); err != nil {
		slog.Error("bench prio", "err", err)
		os.Exit(1)
	}
}

func split(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' })
}

type bench struct {
	c         config
	l         *lab.Lab
	self      string
	cg        string
	host      string
	bneck     string        // r1's device towards r2
	r1In      string        // r1's device towards the first sender
	senders   []string      // s1, s2
	senderDev []string      // their interfaces
	dsts      string        // receivers' sink addresses, comma-separated
	pin       string        // if set, iperf3 runs on this CPU list (taskset)
	delay     time.Duration // the receivers' links' one-way delay
	name      string        // the results' name: prio or prio-wan
	out       string        // bench/results/<name>
	res       *report.Result
}

// resultName is where a run's results go: prio, or prio-wan when a receivers' link is delayed,
// so that a run at a longer RTT never replaces the lab's own figures.
func resultName(c config) string {
	if slices.ContainsFunc(c.delays, func(d time.Duration) bool { return d > 0 }) {
		return "prio-wan"
	}
	return "prio"
}

func run(ctx context.Context, c config) error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	name := resultName(c)
	res := &report.Result{Name: name, Time: time.Now().UTC(), Data: map[string]any{}}
	out, err := filepath.Abs(filepath.Join("bench/results", name))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, d := range c.delays {
		b := &bench{c: c, self: self, senders: []string{"s1", "s2"}, res: res, name: name, out: out, delay: d}
		if err := b.run(ctx); err != nil {
			return err
		}
	}
	return report.Save(*res)
}

// run builds the dumbbell, with the receivers' links delayed by b.delay, and runs the
// experiments on it.
func (b *bench) run(ctx context.Context) error {
	c := b.c
	tag := make([]byte, 3)
	_, _ = rand.Read(tag)
	name := "pb" + hex.EncodeToString(tag)
	yaml := topology
	if b.delay > 0 {
		// The receivers' links, after the bottleneck: the prio router's HTB on r1 stays what it is.
		for _, d := range []string{"d1", "d2"} {
			link := fmt.Sprintf("  - endpoints: [r2, %s]\n", d)
			yaml = strings.Replace(yaml, link, fmt.Sprintf("%s    delay: %v\n", link, b.delay), 1)
		}
	}
	top, err := lab.Parse("bench-prio.yaml", []byte(yaml), name)
	if err != nil {
		return err
	}
	if b.l, err = lab.Up("bench-prio.yaml", []byte(yaml), top); err != nil {
		return fmt.Errorf("lab up: %w", err)
	}
	defer func() {
		if err := lab.Down(name); err != nil {
			slog.Warn("lab down", "err", err)
		}
	}()
	var dsts []string
	for _, d := range []string{"d1", "d2"} {
		dsts = append(dsts, fmt.Sprintf("%s:%d", top.Node(d).Ifaces[0].IPv4.Addr(), sinkPort))
	}
	b.dsts = strings.Join(dsts, ",")
	for _, ifc := range top.Node("r1").Ifaces {
		switch ifc.Peer().Node.Name {
		case "r2":
			b.bneck = b.l.IfName(ifc)
		case b.senders[0]:
			b.r1In = b.l.IfName(ifc)
		}
	}
	// Senders hand MTU-sized segments to the bottleneck, as the original's hosts did: with TSO
	// and GSO a veth passes 64 KB aggregates that HTB would schedule as one packet.
	for _, s := range b.senders {
		b.senderDev = append(b.senderDev, b.l.IfName(top.Node(s).Ifaces[0]))
		if err := b.offload(ctx, len(b.senderDev)-1, false); err != nil {
			return err
		}
	}
	if err := b.hostWriter(); err != nil {
		return err
	}
	defer func() {
		_ = prio.RemoveHost(b.host)
		_ = cgroup.Remove(b.cg)
	}()
	for _, d := range []string{"d1", "d2"} {
		sink, err := b.l.Command(ctx, d, b.self, "gen", "sink", "-listen", fmt.Sprintf(":%d", sinkPort))
		if err != nil {
			return err
		}
		if err := sink.Start(); err != nil {
			return fmt.Errorf("sink on %s: %w", d, err)
		}
		defer func() { _ = sink.Process.Kill(); _ = sink.Wait() }()
	}
	time.Sleep(300 * time.Millisecond)
	for _, e := range c.exps {
		var err error
		switch e {
		case "fair":
			err = b.fairness(ctx)
		case "fct":
			err = b.fct(ctx)
		case "cost":
			err = b.cost(ctx)
		default:
			err = fmt.Errorf("-exp: unknown experiment %q (fair, fct, cost)", e)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", e, err)
		}
	}
	return nil
}

// offload turns TSO and GSO on or off on sender i's interface.
func (b *bench) offload(ctx context.Context, i int, on bool) error {
	state := map[bool]string{true: "on", false: "off"}[on]
	if out, err := b.cmd(ctx, b.senders[i], "ethtool", "-K", b.senderDev[i], "tso", state, "gso", state); err != nil {
		return fmt.Errorf("ethtool on %s: %v: %s", b.senders[i], err, out)
	}
	return nil
}

// hostWriter puts the option writer on a cgroup of its own, which every sender process joins.
func (b *bench) hostWriter() error {
	root, err := cgroup.Mount()
	if err != nil {
		return err
	}
	b.host = fmt.Sprintf("fpbench%d", os.Getpid()%100000)
	b.cg = filepath.Join(root, b.host)
	if err := os.Mkdir(b.cg, 0o755); err != nil {
		return err
	}
	return prio.Host(b.host, b.cg, &prio.HostPolicy{File: "bench", Advertise: []match.Match{match.Any()}, Refresh: prio.DefaultRefresh, MinInterval: prio.DefaultMinInterval})
}

// policy is the router policy of a scheme, as a user would write it; thresholds are pias's
// (derived from the workload); the other schemes keep their defaults. occupancy-strict is the
// original scheme as it was: strict priority between bands, a flow moves at every change.
// A name ending in .yaml is a policy file of the user's, compared under that name.
func (b *bench) policy(name string, thresholds []uint64) (*prio.RouterPolicy, error) {
	if strings.HasSuffix(name, ".yaml") {
		return prio.LoadRouterPolicy(name)
	}
	limit := b.c.limit
	if name == "fifo" {
		limit = b.c.fifoLimit
	}
	scheme, variant, _ := strings.Cut(name, "-")
	y := fmt.Sprintf("scheme: %s\ntrust: [198.18.0.0/15]\n", scheme)
	if b.c.leaves > 0 {
		y += fmt.Sprintf("leaves: %d\n", b.c.leaves)
	}
	if limit > 0 {
		y += fmt.Sprintf("limit: %d\n", limit)
	}
	if variant == "strict" {
		y += "service: strict\nband_change_interval: 10ms\nmove_gap: 0s\n"
	}
	if len(thresholds) > 0 && scheme == "pias" {
		var ts []string
		for _, t := range thresholds {
			ts = append(ts, strconv.FormatUint(t, 10))
		}
		y += "thresholds: [" + strings.Join(ts, ", ") + "]\n"
	}
	return prio.ParseRouterPolicy(name+".yaml", []byte(y))
}

// withRouter runs fn with scheme's classifier and HTB tree on the bottleneck, once the senders
// hold no TCP socket of an earlier run.
func (b *bench) withRouter(p *prio.RouterPolicy, rate uint64, fn func() error) error {
	if err := b.sendersIdle(); err != nil {
		return err
	}
	if err := nsrun.Do(b.l.Netns("r1"), func() error { return prio.Router(b.bneck, rate, p) }); err != nil {
		return fmt.Errorf("prio router %s: %w", p.Scheme, err)
	}
	defer func() {
		if err := nsrun.Do(b.l.Netns("r1"), func() error { return prio.RemoveRouter(b.bneck) }); err != nil {
			slog.Warn("prio remove", "err", err)
		}
	}()
	return fn()
}

// sendersIdle waits until no TCP connection is left on the senders (an earlier run's sockets in
// FIN_WAIT or TIME_WAIT hold no data; ones with data still queued would compete).
func (b *bench) sendersIdle() error {
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range b.senders {
		for {
			out, err := b.cmd(context.Background(), s, "ss", "-Htn", "state", "established", "state", "fin-wait-1", "state", "close-wait", "state", "last-ack", "state", "closing")
			if err != nil {
				return fmt.Errorf("ss on %s: %v: %s", s, err, out)
			}
			n := len(bytes.TrimSpace(out))
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s still has TCP connections with data from an earlier run:\n%s", s, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// gen runs the generator on node, inside the host writer's cgroup if advertise, and returns
// its stdout.
func (b *bench) gen(ctx context.Context, node string, advertise bool, args ...string) ([]byte, error) {
	cmd, err := b.l.Command(ctx, node, b.self, append([]string{"gen"}, args...)...)
	if err != nil {
		return nil, err
	}
	if advertise {
		fd, err := cgroup.Into(cmd.Cmd, b.cg)
		if err != nil {
			return nil, err
		}
		defer fd.Close()
	}
	cmd.Stderr = os.Stderr
	return cmd.Output()
}

// onSenders runs the generator on every sender at once with per-sender arguments.
func (b *bench) onSenders(ctx context.Context, args func(i int) []string) ([][]byte, error) {
	outs := make([][]byte, len(b.senders))
	errs := make(chan error, len(b.senders))
	for i, s := range b.senders {
		go func() {
			var err error
			outs[i], err = b.gen(ctx, s, true, args(i)...)
			if err != nil {
				err = fmt.Errorf("generator on %s: %w", s, err)
			}
			errs <- err
		}()
	}
	for range b.senders {
		if err := <-errs; err != nil {
			return nil, err
		}
	}
	return outs, nil
}

// table keeps t for the report and shows it on stderr at once: a full run takes most of an hour.
func (b *bench) table(t *report.Table) {
	b.res.Tables = append(b.res.Tables, t)
	t.Markdown(os.Stderr)
}

// command is name with args on node, on b.pin's CPUs if set.
func (b *bench) command(ctx context.Context, node, name string, args ...string) (*lab.NodeCmd, error) {
	if b.pin != "" {
		name, args = "taskset", append([]string{"-c", b.pin, name}, args...)
	}
	return b.l.Command(ctx, node, name, args...)
}

func (b *bench) cmd(ctx context.Context, node, name string, args ...string) ([]byte, error) {
	c, err := b.l.Command(ctx, node, name, args...)
	if err != nil {
		return nil, err
	}
	return c.CombinedOutput()
}

func (b *bench) saveJSONL(name string, v []json.RawMessage) error {
	f, err := os.Create(filepath.Join(b.out, name))
	if err != nil {
		return err
	}
	defer f.Close()
	for _, line := range v {
		if _, err := f.Write(append(line, '\n')); err != nil {
			return err
		}
	}
	return nil
}
