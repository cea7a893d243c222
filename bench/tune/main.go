// Command tune reproduces Brakmo's TCP-BPF experiment (Netdev 2.2) in a lab: three senders
// share one HTB bottleneck towards a receiver; each runs X back-to-back 1 MB RPC loops, one
// streaming flow and two 10 KB RPC flows, each starting an RPC every 50 ms (every RPC on a new
// connection), so the small RPCs offer the same load whether or not they complete faster. The
// baseline runs in a cgroup without a program, the policy run in a cgroup with the tune policy
// (cwnd clamp, SYN RTO 10 ms, 150 KB buffers for intra-DC peers); the two alternate per X in
// one run. It also measures connection setup with 1,000 rules loaded against no program: wall
// rate, CPU per connection and the kernel's run time of the program, paired per round.
//
// The binary re-executes itself as the RPC load generator (`tune rpc …`) inside namespaces and
// cgroups.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
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
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/tune"
	"github.com/flowplane/flowplane/internal/tune/rpc"
)

const topology = `
nodes: {s1: {}, s2: {}, s3: {}, r1: {kind: router}, dst: {}}
links:
  - endpoints: [s1, r1]
  - endpoints: [s2, r1]
  - endpoints: [s3, r1]
  - endpoints: [r1, dst]
    rate: %s
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
	connProfile  string
	smallGap     time.Duration
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
	flag.DurationVar(&c.smallGap, "small-gap", 50*time.Millisecond, "each 10 KB RPC flow starts an RPC this often (0: back-to-back)")
	flag.IntVar(&c.rules, "rules", 1000, "rules loaded for the connection setup measurement")
	flag.IntVar(&c.connRounds, "conn-rounds", 40, "rounds of the connection setup measurement (each runs the no-program and the policy loop at once; medians of paired ratios)")
	flag.StringVar(&c.connProfile, "conn-profile", "{init_cwnd: 10}", "profile of the connection setup measurement's rules")
	flag.DurationVar(&c.connDur, "conn-d", time.Second, "duration of each connection setup round")
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
	l    *lab.Lab
	self string
	dst  string
	cgs  map[string]string // base, dc, rules
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
	top, err := lab.Parse("bench-tune.yaml", []byte(yaml), name)
	if err != nil {
		return err
	}
	l, err := lab.Up("bench-tune.yaml", []byte(yaml), top)
	if err != nil {
		return err
	}
	defer lab.Down(name)
	b := &bench{l: l, self: self, dst: top.Node("dst").Ifaces[0].IPv4.Addr().String(), cgs: map[string]string{}}
	// The HTB class's default leaf queues up to txqueuelen GSO packets, megabytes; a byte
	// FIFO makes the bottleneck buffer what -buffer says.
	r1 := top.Node("r1")
	for _, ifc := range r1.Ifaces {
		if ifc.Peer().Node.Name == "dst" {
			if out, err := b.output("r1", "tc", "qdisc", "replace", "dev", l.IfName(ifc), "parent", "1:1", "handle", "10:", "bfifo", "limit", c.buffer); err != nil {
				return fmt.Errorf("bottleneck queue: %v: %s", err, out)
			}
		}
	}
	root, err := tune.Cgroup2Mount()
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
	// RPC servers: one per cgroup on dst (the policy also tunes the receiver's passive side).
	ports := map[string]string{"base": "7000", "dc": "7001", "rules": "7002", "floor": "7003"}
	for k, port := range ports {
		p, err := b.start("dst", b.cgs[k], "rpc", "server", "-addr", ":"+port)
		if err != nil {
			return err
		}
		procs = append(procs, p)
	}
	time.Sleep(300 * time.Millisecond)

	type runResult struct {
		X                  int     `json:"x"`
		Mode               string  `json:"mode"`
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
	var results []runResult
	t := &report.Table{
		Title: fmt.Sprintf("tune: Brakmo's TCP-BPF experiment, 3 senders → 1 receiver through %s HTB, %s B FIFO (%v per run)", c.rate, c.buffer, c.dur),
		Columns: []string{"X", "mode", "1 MB RPC/s", "1 MB goodput Mbit/s", "stream Mbit/s", "all goodput Mbit/s", "10 KB p50 ms", "10 KB p99 ms",
			"TcpRetransSegs", "of which SYN/SYN-ACK", "retrans ratio", "p99 ratio", "1 MB goodput ratio", "all goodput ratio"},
	}
	for _, x := range c.xs {
		var base runResult
		for _, mode := range []string{"base", "dc"} {
			before, beforeSyn, err := b.retrans()
			if err != nil {
				return err
			}
			res, err := b.mix(mode, ports[mode], x, c.smallGap, c.dur)
			if err != nil {
				return err
			}
			after, afterSyn, err := b.retrans()
			if err != nil {
				return err
			}
			var lat []float64
			var smallBytes float64
			rr := runResult{X: x, Mode: mode, Retrans: after - before, SynRetrans: afterSyn - beforeSyn}
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
			}
			fmt.Fprintf(os.Stderr, "X=%d %s: %+v\n", x, mode, rr)
		}
	}
	t.Notes = []string{
		fmt.Sprintf("Policy for intra-DC peers (198.18.0.0/15): cwnd_clamp %d, syn_rto 10ms (3 jiffies = 12 ms at CONFIG_HZ=%d), snd_buf/rcv_buf 150KB. "+
			"Every RPC opens a new connection; latency includes the handshake. Each 10 KB flow starts an RPC every %v (the next one at once if an RPC took longer). Retransmissions are TcpRetransSegs summed over the sender and receiver namespaces.", c.clamp, kern.HZ, c.smallGap),
		"Goals: retransmissions ≥5× lower (ratio ≤ 0.2), 10 KB p99 ≤ 0.5× baseline, 1 MB goodput ≥ 0.95× baseline.",
	}

	ct, connData, err := b.connSetup(c, kern, ports)
	if err != nil {
		return err
	}
	connData["runs"] = results
	connData["config"] = map[string]any{"rate": c.rate, "buffer": c.buffer, "clamp": c.clamp, "seconds": c.dur.Seconds()}
	tables := []*report.Table{ct}
	if len(c.xs) > 0 {
		tables = []*report.Table{t, ct}
	}
	return report.Save(report.Result{Name: "tune", Tables: tables, Data: connData})
}

// connSetup measures connection setup on dst's loopback with no program against the
// many-rule policy. Each round runs one connect loop in each cgroup at the same time (the
// start order alternating), so whatever else loads the shared machine loads both alike, and
// the round's ratios pair the two; the medians over rounds are the figures. The wall rate is
// what the goal names, but on a shared machine it moves with other load; CPU time per
// connection and the kernel's own accounting of the program's run time (BPF_ENABLE_STATS, on
// for the rounds themselves) are steadier.
func (b *bench) connSetup(c config, kern tune.Kernel, ports map[string]string) (*report.Table, map[string]any, error) {
	st, err := tune.ReadStatus(benchName("rules"), kern)
	if err != nil {
		return nil, nil, err
	}
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(st.ProgramID))
	if err != nil {
		return nil, nil, err
	}
	defer prog.Close()
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		return nil, nil, fmt.Errorf("enable BPF statistics: %w", err)
	}
	defer stats.Close()
	before, err := prog.Stats()
	if err != nil {
		return nil, nil, err
	}
	type loop struct {
		rate, cpuNs float64
		calls       int
	}
	// pair runs one connect loop in the base cgroup and one in mode's at the same time.
	pair := func(mode string, r int) (base, other loop, err error) {
		modes := []string{"base", mode}
		if r%2 == 1 {
			modes[0], modes[1] = modes[1], modes[0]
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		got := map[string]loop{}
		for _, m := range modes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, cpu, lerr := b.runInCPU("dst", b.cgs[m], "rpc", "connect", "-addr", "127.0.0.1:"+ports[m], "-workers", "1", "-d", c.connDur.String())
				var res rpc.Result
				if lerr == nil {
					lerr = json.Unmarshal(out, &res)
				}
				mu.Lock()
				defer mu.Unlock()
				if lerr != nil {
					err = fmt.Errorf("connect loop: %v: %s", lerr, out)
					return
				}
				got[m] = loop{float64(res.Connect.Calls) / res.Seconds, float64(cpu.Nanoseconds()) / float64(max(res.Connect.Calls, 1)), res.Connect.Calls}
			}()
			time.Sleep(time.Millisecond) // the start order alternates
		}
		wg.Wait()
		return got["base"], got[mode], err
	}
	var rateRatios, cpuRatios, floorRatios, floorCPURatios, baseRates, ruleRates, baseCPU, ruleCPU []float64
	var ruleCalls int
	for r := 0; r < c.connRounds; r++ {
		base, rules, err := pair("rules", r)
		if err != nil {
			return nil, nil, err
		}
		baseRates, ruleRates = append(baseRates, base.rate), append(ruleRates, rules.rate)
		baseCPU, ruleCPU = append(baseCPU, base.cpuNs), append(ruleCPU, rules.cpuNs)
		rateRatios = append(rateRatios, rules.rate/base.rate)
		cpuRatios = append(cpuRatios, rules.cpuNs/base.cpuNs)
		ruleCalls += rules.calls
		fbase, floor, err := pair("floor", r)
		if err != nil {
			return nil, nil, err
		}
		floorRatios = append(floorRatios, floor.rate/fbase.rate)
		floorCPURatios = append(floorCPURatios, floor.cpuNs/fbase.cpuNs)
	}
	after, err := prog.Stats()
	if err != nil {
		return nil, nil, err
	}
	n := float64(max(ruleCalls, 1))
	progNs := float64(after.Runtime-before.Runtime) / n
	runsPerConn := float64(after.RunCount-before.RunCount) / n
	for _, xs := range [][]float64{rateRatios, cpuRatios, floorRatios, floorCPURatios} {
		sort.Float64s(xs)
	}
	bc := report.Median(baseCPU)
	q := func(xs []float64) string {
		return fmt.Sprintf("%.3f / %.3f / %.3f", rpc.Percentile(xs, 25), rpc.Percentile(xs, 50), rpc.Percentile(xs, 75))
	}
	ct := &report.Table{
		Title: fmt.Sprintf("tune: connection setup with %d rules loaded (loopback, connect+close, two loops at once, %d rounds of %v per pair)", c.rules, c.connRounds, c.connDur),
		Columns: []string{"program", "connections/s (median of rounds)", "rate ratio to none p25 / median / p75 (paired per round)",
			"client CPU µs per connection (median)", "CPU ratio p25 / median / p75 (paired)", "BPF µs per connection (kernel stats)", "rate ratio implied by BPF time"},
		Notes: []string{"Goal: rate ratio ≥ 0.98. Both ends of every connection are in the cgroup, so active and passive callbacks run; " +
			"the rules are 999 /24 prefixes that do not match and a catch-all that does (profile: " + c.connProfile + ").",
			"Floor: a sock_ops program that only returns 1, paired with none in the same rounds: what attaching any sock_ops program costs here (the kernel's callbacks and their dispatch).",
			"Client CPU per connection: user+system time of the connecting process (on loopback it also runs the passive side's handshake in softirq) divided by its connections. " +
				fmt.Sprintf("BPF time: the program's run_time_ns over the same rounds (stats on for them, which costs the policy side a little) divided by its connections; %.1f program runs per connection. ", runsPerConn) +
				"Implied rate ratio: median baseline CPU per connection / (that + BPF time), the rate if the program's own time were the only difference.",
		},
	}
	ct.Add("none", f1(report.Median(baseRates)), "", f1(bc/1e3), "", "", "")
	ct.Add("floor: `return 1`", "", q(floorRatios), "", q(floorCPURatios), "", "")
	ct.Add(fmt.Sprintf("tune, %d rules", c.rules), f1(report.Median(ruleRates)), q(rateRatios), f1(report.Median(ruleCPU)/1e3), q(cpuRatios),
		f2(progNs/1e3), fmt.Sprintf("%.3f", bc/(bc+progNs)))
	return ct, map[string]any{"connect_base": baseRates, "connect_rules": ruleRates, "connect_rate_ratios": rateRatios, "connect_cpu_ratios": cpuRatios,
		"connect_floor_rate_ratios": floorRatios, "connect_floor_cpu_ratios": floorCPURatios,
		"connect_cpu_ns_base": baseCPU, "connect_cpu_ns_rules": ruleCPU, "program_ns_per_connection": progNs, "program_runs_per_connection": runsPerConn}, nil
}

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

func ratio(a, b float64) string {
	if b == 0 {
		if a == 0 {
			return "0/0"
		}
		return "∞"
	}
	return fmt.Sprintf("%.3f", a/b)
}

// manyRules builds a policy of n rules: n-1 that match nothing here, then one for everything.
func manyRules(n int, profile string) string {
	var s strings.Builder
	s.WriteString("profiles: {p: " + profile + "}\nrules:\n")
	for i := 0; i < n-1; i++ {
		fmt.Fprintf(&s, "  - {match: {remote: 10.%d.%d.0/24}, profile: p}\n", i/250, i%250)
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
func (b *bench) start(node, cgroup string, args ...string) (*lab.NodeCmd, error) {
	cmd, err := b.l.Command(context.Background(), node, b.self, args...)
	if err != nil {
		return nil, err
	}
	fd, err := tune.IntoCgroup(cmd.Cmd, cgroup)
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
func (b *bench) runInCPU(node, cgroup string, args ...string) ([]byte, time.Duration, error) {
	cmd, err := b.l.Command(context.Background(), node, b.self, args...)
	if err != nil {
		return nil, 0, err
	}
	fd, err := tune.IntoCgroup(cmd.Cmd, cgroup)
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
	for _, n := range append(append([]string{}, senders...), "dst") {
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
