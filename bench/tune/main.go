// Command tune reproduces Brakmo's TCP-BPF experiment (Netdev 2.2) in a lab: three senders
// share one HTB bottleneck towards a receiver; each runs X back-to-back 1 MB RPC loops, one
// streaming flow and two 10 KB RPC flows, each starting an RPC every 50 ms (every RPC on a new
// connection), so the small RPCs offer the same load whether or not they complete faster. The
// baseline runs in a cgroup without a program, the policy run in a cgroup with the tune policy
// (cwnd clamp, SYN RTO 10 ms, 150 KB buffers for intra-DC peers); the two alternate per X in
// one run, then again towards a second receiver behind the same bottleneck and a WAN link
// (-wan-delay, 10 ms each way by default: the lab's relay delays it). It also measures
// connection setup with 1,000 rules loaded against no program and a `return 1` program: connections per CPU second of three setup loops sharing one CPU at once,
// and the kernel's run time of the programs.
//
// The binary re-executes itself as the RPC load generator (`tune rpc …`) inside namespaces and
// cgroups.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/tune"
	"github.com/flowplane/flowplane/internal/tune/rpc"
)

// wan is a second receiver behind the same kind of bottleneck, whose link also has a one-way
// delay (-wan-delay): the experiment's WAN rows.
const topology = `
nodes: {s1: {}, s2: {}, s3: {}, r1: {kind: router}, dst: {}, wan: {}}
links:
  - endpoints: [s1, r1]
  - endpoints: [s2, r1]
  - endpoints: [s3, r1]
  - endpoints: [r1, dst]
    rate: %[1]s
  - endpoints: [r1, wan]
    rate: %[1]s
`

var senders = []string{"s1", "s2", "s3"}

type config struct {
	rate, buffer string
	clamp        int
	xs           []int
	dur          time.Duration
	rules        int
	connRounds   int
	connDur      time.Duration
	connCPU      int
	connProfile  string
	smallGap     time.Duration
	wanDelay     time.Duration
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "rpc" {
		if err := rpc.Main(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		return
	}
	var c config
	xs := flag.String("x", "1,2,4,8,16", "numbers of 1 MB RPC loops per sender (empty: only the connection setup measurement)")
	flag.StringVar(&c.rate, "rate", "500mbit", "bottleneck rate (HTB on r1 towards dst)")
	flag.StringVar(&c.buffer, "buffer", "700000", "bottleneck queue in bytes (bfifo under the HTB class)")
	flag.IntVar(&c.clamp, "clamp", 8, "cwnd clamp of the policy (segments)")
	flag.DurationVar(&c.dur, "d", 5*time.Second, "duration of each run")
	flag.DurationVar(&c.wanDelay, "wan-delay", 10*time.Millisecond, "one-way delay of the WAN receiver's link, for the experiment's rows over a WAN (0: no WAN rows)")
	flag.DurationVar(&c.smallGap, "small-gap", 50*time.Millisecond, "each 10 KB RPC flow starts an RPC this often (0: back-to-back)")
	flag.IntVar(&c.rules, "rules", 1000, "rules loaded for the connection setup measurement")
	flag.IntVar(&c.connRounds, "conn-rounds", 30, "rounds of the connection setup measurement (each runs the three arms' loops at once)")
	flag.StringVar(&c.connProfile, "conn-profile", "{init_cwnd: 10}", "profile of the connection setup measurement's rules")
	flag.DurationVar(&c.connDur, "conn-d", 2*time.Second, "duration of each connection setup round")
	flag.IntVar(&c.connCPU, "conn-cpu", runtime.NumCPU()-1, "CPU the connection setup loops are pinned to")
	flag.Parse()
	for _, s := range strings.FieldsFunc(*xs, func(r rune) bool { return r == ',' }) {
		n, err := strconv.Atoi(s)
		if err != nil {
			log.Fatalf("-x: %v", err)
		}
		c.xs = append(c.xs, n)
	}
	if err := run(c); err != nil {
		log.Fatal(err)
	}
}

// benchName names this run's cgroup and policy instance for k (base, dc, rules): fp-prefixed
// and unique per process, as the same name serves both.
func benchName(k string) string { return fmt.Sprintf("fpbench%d-%s", os.Getpid()%100000, k) }

type bench struct {
	l       *lab.Lab
	self    string
	dstNode string            // the receiver of the experiment running
	dst     string            // its address
	cgs     map[string]string // base, dc, rules, floor
	fds     []io.Closer       // cgroup descriptors of prepared commands (closed at the end)
}

func run(c config) error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	name := fmt.Sprintf("bt%d", os.Getpid()%100000)
	yaml := fmt.Sprintf(topology, c.rate)
	if c.wanDelay > 0 {
		yaml += fmt.Sprintf("    delay: %v\n", c.wanDelay)
	}
	top, err := lab.Parse("bench-tune.yaml", []byte(yaml), name)
	if err != nil {
		return err
	}
	l, err := lab.Up("bench-tune.yaml", []byte(yaml), top)
	if err != nil {
		return err
	}
	defer lab.Down(name)
	b := &bench{l: l, self: self, cgs: map[string]string{}}
	// The HTB class's default leaf queues up to txqueuelen GSO packets, megabytes; a byte
	// FIFO makes the bottleneck buffer what -buffer says, on each of r1's ends the lab shapes
	// (at the endpoint's rate, else the link's).
	r1 := top.Node("r1")
	for _, ifc := range r1.Ifaces {
		if lab.ShapedEgress(ifc) { // towards dst and wan
			if out, err := b.output("r1", "tc", "qdisc", "replace", "dev", l.IfName(ifc), "parent", "1:1", "handle", "10:", "bfifo", "limit", c.buffer); err != nil {
				return fmt.Errorf("bottleneck queue: %v: %s", err, out)
			}
		}
	}
	root, err := cgroup.Mount()
	if err != nil {
		return err
	}
	for _, k := range []string{"base", "dc", "rules", "floor"} {
		cg := filepath.Join(root, benchName(k))
		if err := os.Mkdir(cg, 0o755); err != nil {
			return err
		}
		b.cgs[k] = cg
	}
	var procs []*lab.NodeCmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
		for _, cg := range b.cgs {
			for i := 0; i < 100 && os.Remove(cg) != nil; i++ {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	kern, err := tune.HostKernel()
	if err != nil {
		return err
	}
	policy := fmt.Sprintf(`
profiles:
  dc: {syn_rto: 10ms, cwnd_clamp: %d, snd_buf: 150KB, rcv_buf: 150KB}
rules:
  - {match: {remote: 198.18.0.0/15}, profile: dc}
`, c.clamp)
	instances := map[string]string{"dc": policy, "rules": manyRules(c.rules, c.connProfile)}
	for k, src := range instances {
		pol, err := tune.Parse("bench-"+k+".yaml", []byte(src), kern)
		if err != nil {
			return err
		}
		inst := benchName(k)
		if _, err := tune.Apply(pol, []byte(src), tune.ApplyOptions{Name: inst, Cgroup: b.cgs[k]}); err != nil {
			return err
		}
		defer tune.Remove(inst)
	}
	// The floor of the connection setup measurement: a sock_ops program that only returns 1,
	// what any sock_ops program costs on this machine (dispatch, the kernel's callbacks).
	floor, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SockOps, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		return fmt.Errorf("load floor program: %w", err)
	}
	defer floor.Close()
	floorLink, err := link.AttachCgroup(link.CgroupOptions{Path: b.cgs["floor"], Attach: ebpf.AttachCGroupSockOps, Program: floor})
	if err != nil {
		return fmt.Errorf("attach floor program: %w", err)
	}
	defer floorLink.Close()
	// RPC servers: one per cgroup on each receiver (the policy also tunes the passive side).
	for _, node := range []string{"dst", "wan"} {
		for k, port := range ports {
			p, err := b.start(node, b.cgs[k], "rpc", "server", "-addr", ":"+port)
			if err != nil {
				return err
			}
			procs = append(procs, p)
		}
	}
	time.Sleep(300 * time.Millisecond)
	var results []runResult
	var tables []*report.Table
	receivers := []struct{ node, where string }{{"dst", ""}}
	if c.wanDelay > 0 {
		receivers = append(receivers, struct{ node, where string }{"wan", fmt.Sprintf(", over a WAN link (delay %v each way)", c.wanDelay)})
	}
	for _, r := range receivers {
		if len(c.xs) == 0 {
			break
		}
		b.dstNode, b.dst = r.node, top.Node(r.node).Ifaces[0].IPv4.Addr().String()
		t, rs, err := b.experiment(c, kern, r.where)
		if err != nil {
			return err
		}
		tables, results = append(tables, t), append(results, rs...)
	}
	ct, connData, err := b.connSetup(c, kern, floor)
	if err != nil {
		return err
	}
	connData["runs"] = results
	connData["config"] = map[string]any{"rate": c.rate, "buffer": c.buffer, "clamp": c.clamp, "seconds": c.dur.Seconds(), "wan_delay_ms": c.wanDelay.Seconds() * 1e3}
	return report.Save(report.Result{Name: "tune", Tables: append(tables, ct), Data: connData})
}

// ports are the RPC servers' ports, per cgroup.
var ports = map[string]string{"base": "7000", "dc": "7001"}

type runResult struct {
	X                  int     `json:"x"`
	Mode               string  `json:"mode"`
	Receiver           string  `json:"receiver"`
	LargeRPS           float64 `json:"large_rpc_per_s"`
	LargeMbps          float64 `json:"large_goodput_mbit_s"`
	StreamMbps         float64 `json:"stream_mbit_s"`
	TotalMbps          float64 `json:"total_goodput_mbit_s"`
	SmallP50, SmallP99 float64 `json:"-"`
	SmallCalls         int     `json:"small_calls"`
	Retrans            uint64  `json:"retrans_segs"`
	SynRetrans         uint64  `json:"syn_retrans"`
	Errors             int     `json:"errors"`
	P50                float64 `json:"small_p50_ms"`
	P99                float64 `json:"small_p99_ms"`
}

// experiment runs the baseline and the policy in turn for every X towards b.dstNode.
func (b *bench) experiment(c config, kern tune.Kernel, where string) (*report.Table, []runResult, error) {
	var results []runResult
	t := &report.Table{
		Title: fmt.Sprintf("tune: Brakmo's TCP-BPF experiment, 3 senders → 1 receiver through %s HTB, %s B FIFO%s (%v per run)", c.rate, c.buffer, where, c.dur),
		Columns: []string{"X", "mode", "1 MB RPC/s", "1 MB goodput Mbit/s", "stream Mbit/s", "all goodput Mbit/s", "10 KB p50 ms", "10 KB p99 ms",
			"TcpRetransSegs", "of which SYN/SYN-ACK", "retrans ratio", "p99 ratio", "1 MB goodput ratio", "all goodput ratio"},
	}
	for _, x := range c.xs {
		var base runResult
		for _, mode := range []string{"base", "dc"} {
			before, beforeSyn, err := b.retrans()
			if err != nil {
				return nil, nil, err
			}
			res, err := b.mix(mode, ports[mode], x, c.smallGap, c.dur)
			if err != nil {
				return nil, nil, err
			}
			after, afterSyn, err := b.retrans()
			if err != nil {
				return nil, nil, err
			}
			var lat []float64
			var smallBytes float64
			rr := runResult{X: x, Mode: mode, Receiver: b.dstNode, Retrans: after - before, SynRetrans: afterSyn - beforeSyn}
			var secs float64
			for _, r := range res {
				rr.LargeRPS += float64(r.Large.Calls)
				rr.LargeMbps += float64(r.Large.Bytes)
				rr.StreamMbps += float64(r.Stream.Bytes)
				rr.Errors += r.Large.Errors + r.Small.Errors + r.Stream.Errors
				rr.SmallCalls += r.Small.Calls
				smallBytes += float64(r.Small.Bytes)
				lat = append(lat, r.Small.Latencies...)
				secs = max(secs, r.Seconds)
			}
			rr.LargeRPS /= secs
			rr.LargeMbps = rr.LargeMbps * 8 / secs / 1e6
			rr.StreamMbps = rr.StreamMbps * 8 / secs / 1e6
			rr.TotalMbps = rr.LargeMbps + rr.StreamMbps + smallBytes*8/secs/1e6
			sort.Float64s(lat)
			rr.P50, rr.P99 = rpc.Percentile(lat, 50), rpc.Percentile(lat, 99)
			results = append(results, rr)
			label := map[string]string{"base": "baseline", "dc": "policy"}[mode]
			if mode == "base" {
				base = rr
				t.Add(x, label, f1(rr.LargeRPS), f1(rr.LargeMbps), f1(rr.StreamMbps), f1(rr.TotalMbps), f2(rr.P50), f2(rr.P99), rr.Retrans, rr.SynRetrans, "", "", "", "")
			} else {
				t.Add(x, label, f1(rr.LargeRPS), f1(rr.LargeMbps), f1(rr.StreamMbps), f1(rr.TotalMbps), f2(rr.P50), f2(rr.P99), rr.Retrans, rr.SynRetrans,
					ratio(float64(rr.Retrans), float64(base.Retrans)), ratio(rr.P99, base.P99), ratio(rr.LargeMbps, base.LargeMbps), ratio(rr.TotalMbps, base.TotalMbps))
				// Retransmissions ≥ 5× lower, small RPCs' tail at most half, bulk goodput kept (the
				// intra-DC promise; the WAN rows are for comparison only).
				if where == "" {
					t.Goal(report.AtMost("retrans ratio", div(float64(rr.Retrans), float64(base.Retrans)), 0.2),
						report.AtMost("10 KB p99 ratio", div(rr.P99, base.P99), 0.5),
						report.AtLeast("1 MB goodput ratio", div(rr.LargeMbps, base.LargeMbps), 0.95))
				}
			}
			fmt.Fprintf(os.Stderr, "%s X=%d %s: %+v\n", b.dstNode, x, mode, rr)
		}
	}
	t.Notes = []string{
		fmt.Sprintf("Policy for intra-DC peers (198.18.0.0/15): cwnd_clamp %d, syn_rto 10ms (3 jiffies = 12 ms at CONFIG_HZ=%d), snd_buf/rcv_buf 150KB. "+
			"Every RPC opens a new connection; latency includes the handshake. Each 10 KB flow starts an RPC every %v (the next one at once if an RPC took longer). Retransmissions are TcpRetransSegs summed over the sender and receiver namespaces.", c.clamp, kern.HZ, c.smallGap),
	}
	if where != "" {
		t.Notes = append(t.Notes, "No goals here: the policy is meant for intra-DC peers (it matches this one by its address), and over a WAN it is not expected to keep the intra-DC promises: a cwnd clamp of a few segments cannot fill a path of this RTT, and a SYN RTO below the RTT retransmits SYNs that were not lost (the SYN/SYN-ACK column).")
	}
	return t, results, nil
}

// The arms of the connection setup measurement: a cgroup without a program (the baseline's),
// one with a sock_ops program that only returns 1 (the floor), one with the many-rule policy.
var connArms = []string{"base", "floor", "rules"}

// connRound is one arm's setup loop in one round.
type connRound struct {
	Arm     string  `json:"arm"`
	Round   int     `json:"round"`
	Calls   int     `json:"calls"`
	Seconds float64 `json:"seconds"`
	CPUNs   int64   `json:"cpu_ns"`
	BPFNs   uint64  `json:"bpf_ns"`   // the arm's program's run_time_ns during the round
	BPFRuns uint64  `json:"bpf_runs"` // and its run count
	// Stats: the round ran with BPF run-time statistics on. Such rounds give the BPF time and
	// nothing else: the statistics cost every program run two clock reads, which the arm
	// without a program would not pay.
	Stats bool `json:"stats"`
}

// connSetup measures connection setup on dst's loopback with no program, the floor program and
// the many-rule policy. Each round starts one setup loop per arm (rpc.SetupLoop: connect,
// accept and close in one thread, both ends in the arm's cgroup), all three pinned to the same
// CPU at the same time: the scheduler interleaves them every few milliseconds, so whatever
// slows the shared machine down slows the three alike, and each arm's cost is its CPU time
// per connection. An arm's rate is connections per CPU second summed over all rounds (a ratio
// of sums); the spread of the ratios between arms is a bootstrap over rounds. The kernel's own
// accounting of the programs' run time (BPF_ENABLE_STATS) in extra rounds gives the BPF time
// per connection.
func (b *bench) connSetup(c config, kern tune.Kernel, floor *ebpf.Program) (*report.Table, map[string]any, error) {
	st, err := tune.ReadStatus(benchName("rules"), kern)
	if err != nil {
		return nil, nil, err
	}
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(st.ProgramID))
	if err != nil {
		return nil, nil, err
	}
	defer prog.Close()
	progs := map[string]*ebpf.Program{"rules": prog, "floor": floor}
	cpu := strconv.Itoa(c.connCPU)
	round := func(r int, d time.Duration, stats bool) ([]connRound, error) {
		before := map[string]*ebpf.ProgramStats{}
		for arm, p := range progs {
			s, err := p.Stats()
			if err != nil {
				return nil, err
			}
			before[arm] = s
		}
		cmds := map[string]*lab.NodeCmd{}
		outs := map[string]*bytes.Buffer{}
		defer func() {
			for _, fd := range b.fds {
				_ = fd.Close()
			}
			b.fds = nil
			for _, cmd := range cmds { // loops left running by an error
				if cmd.ProcessState == nil {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
				}
			}
		}()
		for _, arm := range connArms {
			cmd, err := b.pinned(b.cgs[arm], cpu, "rpc", "setup", "-d", d.String())
			if err != nil {
				return nil, err
			}
			outs[arm] = &bytes.Buffer{}
			cmd.Stdout = outs[arm]
			if err := cmd.Start(); err != nil {
				return nil, err
			}
			cmds[arm] = cmd
		}
		var rounds []connRound
		for _, arm := range connArms {
			if err := cmds[arm].Wait(); err != nil {
				return nil, fmt.Errorf("%s setup loop: %w", arm, err)
			}
			var res rpc.Result
			if err := json.Unmarshal(outs[arm].Bytes(), &res); err != nil {
				return nil, fmt.Errorf("%s setup loop: %w", arm, err)
			}
			cr := connRound{Arm: arm, Round: r, Calls: res.Connect.Calls, Seconds: res.Seconds, CPUNs: res.CPUNs, Stats: stats}
			if p := progs[arm]; p != nil {
				after, err := p.Stats()
				if err != nil {
					return nil, err
				}
				cr.BPFNs, cr.BPFRuns = uint64(after.Runtime-before[arm].Runtime), after.RunCount-before[arm].RunCount
			}
			rounds = append(rounds, cr)
		}
		return rounds, nil
	}
	// A short round first, not counted: it warms caches and the kernel's socket slabs.
	if _, err := round(-1, c.connDur/4, false); err != nil {
		return nil, nil, err
	}
	var rounds []connRound
	statsRounds := max(c.connRounds/4, 1)
	for r := 0; r < c.connRounds+statsRounds; r++ {
		if r == c.connRounds {
			stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
			if err != nil {
				return nil, nil, fmt.Errorf("enable BPF statistics: %w", err)
			}
			defer stats.Close()
		}
		rs, err := round(r, c.connDur, r >= c.connRounds)
		if err != nil {
			return nil, nil, err
		}
		rounds = append(rounds, rs...)
	}
	return connTable(c, rounds), map[string]any{"connect_rounds": rounds, "connect_round_seconds": c.connDur.Seconds(), "connect_cpu": c.connCPU}, nil
}

// pinned prepares the load generator on dst inside cgroup, pinned to cpu (taskset); the caller
// starts it.
func (b *bench) pinned(cg, cpu string, args ...string) (*lab.NodeCmd, error) {
	cmd, err := b.l.Command(context.Background(), "dst", "taskset", append([]string{"-c", cpu, b.self}, args...)...)
	if err != nil {
		return nil, err
	}
	fd, err := cgroup.Into(cmd.Cmd, cg)
	if err != nil {
		return nil, err
	}
	// cgroup.Into's descriptor must stay open until Start (connSetup closes them after each round).
	b.fds = append(b.fds, fd)
	cmd.Stderr = os.Stderr
	return cmd, nil
}

// connTable summarizes the rounds: per arm the sums over all rounds, the ratio of sums of
// connections per CPU second to the arm without a program with a 95 % bootstrap interval over
// rounds, and the quartiles of the per-round ratios.
func connTable(c config, rounds []connRound) *report.Table {
	type sums struct{ calls, secs, cpu, bpf, runs float64 }
	// perRound and total: the rate rounds; withStats: the rounds with BPF statistics on.
	perRound := make([]map[string]sums, c.connRounds)
	total, withStats := map[string]sums{}, map[string]sums{}
	for _, cr := range rounds {
		if cr.Stats {
			s := withStats[cr.Arm]
			s.calls += float64(cr.Calls)
			s.bpf += float64(cr.BPFNs)
			s.runs += float64(cr.BPFRuns)
			withStats[cr.Arm] = s
			continue
		}
		if perRound[cr.Round] == nil {
			perRound[cr.Round] = map[string]sums{}
		}
		for _, m := range []map[string]sums{perRound[cr.Round], total} {
			s := m[cr.Arm]
			s.calls += float64(cr.Calls)
			s.secs += cr.Seconds
			s.cpu += float64(cr.CPUNs)
			m[cr.Arm] = s
		}
	}
	rate := func(s sums) float64 { return s.calls / s.cpu * 1e9 }
	ratio := func(a, base sums) float64 { return rate(a) / rate(base) }
	// boot resamples rounds with replacement (a fixed seed: the same rounds give the same
	// interval) and returns the 2.5th and 97.5th percentiles of the rate ratio.
	boot := func(arm string) (lo, hi float64) {
		rng := rand.New(rand.NewPCG(1, 2))
		var xs []float64
		for i := 0; i < 2000; i++ {
			var a, base sums
			for j := 0; j < c.connRounds; j++ {
				r := perRound[rng.IntN(c.connRounds)]
				a.calls, a.cpu = a.calls+r[arm].calls, a.cpu+r[arm].cpu
				base.calls, base.cpu = base.calls+r["base"].calls, base.cpu+r["base"].cpu
			}
			xs = append(xs, ratio(a, base))
		}
		sort.Float64s(xs)
		return rpc.Percentile(xs, 2.5), rpc.Percentile(xs, 97.5)
	}
	quart := func(arm string) (string, string) {
		var xs []float64
		for _, r := range perRound {
			xs = append(xs, ratio(r[arm], r["base"]))
		}
		sort.Float64s(xs)
		return fmt.Sprintf("%.3f / %.3f / %.3f", rpc.Percentile(xs, 25), rpc.Percentile(xs, 50), rpc.Percentile(xs, 75)), report.Range("%.3f", xs)
	}
	base := total["base"]
	ct := &report.Table{
		Title: fmt.Sprintf("tune: connection setup with %d rules loaded (loopback connect+accept+close, three loops at once on CPU %d, %d rounds of %v)", c.rules, c.connCPU, c.connRounds, c.connDur),
		Columns: []string{"program", "connections per CPU second", "rate ratio to none, ratio of sums [95 % bootstrap]", "per-round rate ratio p25 / median / p75", "per-round min–max",
			"CPU µs per connection", "BPF µs per connection (kernel stats)", "program runs per connection", "rate ratio implied by BPF time"},
		Notes: []string{"Both ends of every connection are in the arm's cgroup, so active and passive callbacks run; " +
			"the rules are 999 /26 prefixes that do not match and a catch-all that does (profile: " + c.connProfile + ").",
			"Method: each round runs one loop per arm at the same time, all pinned to one CPU, each opening a connection to its own listener, accepting it and closing both ends (SO_LINGER 0) in one thread. " +
				"The handshake completes inside connect on loopback, so the loops never sleep and the scheduler interleaves them every few milliseconds: a slowdown of the shared machine meets all three alike. " +
				"An arm's rate is its connections over its CPU time (softirq work the loop causes is charged to it; steal is not), summed over every round; the interval resamples rounds (2,000 bootstrap draws). " +
				"Floor: a sock_ops program that only returns 1: what attaching any sock_ops program costs here.",
			fmt.Sprintf("BPF time: the arm's program's run_time_ns over its connections, from %d more rounds run with BPF statistics on after the rate rounds (the statistics add two clock reads to every program run, so the rate rounds run without them). ", max(c.connRounds/4, 1)) +
				"Implied rate ratio: CPU per connection without a program / (that + BPF time), the rate if the program's own time were the only difference.",
		},
	}
	ct.Add("none", f1(rate(base)), "", "", "", f1(base.cpu/base.calls/1e3), "", "", "")
	for _, arm := range []string{"floor", "rules"} {
		t, ws := total[arm], withStats[arm]
		bpf := ws.bpf / ws.calls
		label := "floor: `return 1`"
		if arm == "rules" {
			label = fmt.Sprintf("tune, %d rules", c.rules)
		}
		lo, hi := boot(arm)
		q, mm := quart(arm)
		ct.Add(label, f1(rate(t)), fmt.Sprintf("%.3f [%.3f, %.3f]", ratio(t, base), lo, hi), q, mm, f1(t.cpu/t.calls/1e3),
			f2(bpf/1e3), f1(ws.runs/ws.calls), fmt.Sprintf("%.3f", base.cpu/base.calls/(base.cpu/base.calls+bpf)))
		if arm == "rules" {
			// The policy costs connection setup at most 2 %.
			ct.Goal(report.AtLeast("rate ratio (ratio of sums)", ratio(t, base), 0.98))
		}
	}
	return ct
}

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// div is a/b: +Inf for a/0, NaN for 0/0 (a goal on it is then not judged).
func div(a, b float64) float64 {
	if b == 0 {
		if a == 0 {
			return math.NaN()
		}
		return math.Inf(1)
	}
	return a / b
}

func ratio(a, b float64) string {
	if b == 0 {
		if a == 0 {
			return "0/0"
		}
		return "∞"
	}
	return fmt.Sprintf("%.3f", a/b)
}

// manyRules builds a policy of n rules (n ≤ 2,049): n-1 that match nothing here, then one for
// everything.
func manyRules(n int, profile string) string {
	var s strings.Builder
	s.WriteString("profiles: {p: " + profile + "}\nrules:\n")
	for i := 0; i < n-1; i++ {
		// /26 prefixes in the lab's 198.18.0.0/15 (2,048 of them), none containing loopback
		a := netip.AddrFrom4([4]byte{198, 18 + byte(i>>10), byte(i >> 2), byte(i&3) << 6})
		fmt.Fprintf(&s, "  - {match: {remote: %s/26}, profile: p}\n", a)
	}
	s.WriteString("  - {profile: p}\n")
	return s.String()
}

func (b *bench) output(node string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, err := b.l.Command(ctx, node, args[0], args[1:]...)
	if err != nil {
		return nil, err
	}
	return cmd.CombinedOutput()
}

// start starts the load generator on node inside cgroup.
func (b *bench) start(node, cg string, args ...string) (*lab.NodeCmd, error) {
	cmd, err := b.l.Command(context.Background(), node, b.self, args...)
	if err != nil {
		return nil, err
	}
	fd, err := cgroup.Into(cmd.Cmd, cg)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	cmd.Stderr = os.Stderr
	return cmd, cmd.Start()
}

// runIn runs the load generator on node inside cgroup and returns its stdout.
func (b *bench) runIn(node, cgroup string, args ...string) ([]byte, error) {
	out, _, err := b.runInCPU(node, cgroup, args...)
	return out, err
}

// runInCPU is runIn that also returns the CPU time (user + system) the process used.
func (b *bench) runInCPU(node, cg string, args ...string) ([]byte, time.Duration, error) {
	cmd, err := b.l.Command(context.Background(), node, b.self, args...)
	if err != nil {
		return nil, 0, err
	}
	fd, err := cgroup.Into(cmd.Cmd, cg)
	if err != nil {
		return nil, 0, err
	}
	defer fd.Close()
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if cmd.ProcessState == nil {
		return out, 0, err
	}
	return out, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), err
}

// mix runs the RPC mix from every sender at once.
func (b *bench) mix(mode, port string, x int, gap, d time.Duration) ([]rpc.Result, error) {
	res := make([]rpc.Result, len(senders))
	errs := make([]error, len(senders))
	var wg sync.WaitGroup
	for i, s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := b.runIn(s, b.cgs[mode], "rpc", "mix", "-addr", b.dst+":"+port, "-x", fmt.Sprint(x), "-small-gap", gap.String(), "-d", d.String())
			if err != nil {
				errs[i] = fmt.Errorf("%s: %v: %s", s, err, out)
				return
			}
			errs[i] = json.Unmarshal(out, &res[i])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return res, nil
}

// retrans sums TcpRetransSegs (the counter nstat reports) and TcpExtTCPSynRetrans (SYNs and
// SYN-ACKs among them) over the senders and the receiver.
func (b *bench) retrans() (segs, syns uint64, err error) {
	for _, n := range append(append([]string{}, senders...), b.dstNode) {
		out, err := b.output(n, "cat", "/proc/net/snmp", "/proc/net/netstat")
		if err != nil {
			return 0, 0, err
		}
		hdr := map[string][]string{}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || (f[0] != "Tcp:" && f[0] != "TcpExt:") {
				continue
			}
			h, ok := hdr[f[0]]
			if !ok {
				hdr[f[0]] = f
				continue
			}
			for i, name := range h {
				if i >= len(f) {
					break
				}
				v, _ := strconv.ParseUint(f[i], 10, 64)
				switch {
				case f[0] == "Tcp:" && name == "RetransSegs":
					segs += v
				case f[0] == "TcpExt:" && name == "TCPSynRetrans":
					syns += v
				}
			}
			delete(hdr, f[0])
		}
	}
	return segs, syns, nil
}
