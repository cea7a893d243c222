package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/prio"
	"github.com/flowplane/flowplane/internal/progrun"
)

// cost is experiment 3: what the classifier costs per packet, and what the host writer and
// the classifier cost a TCP flow that no bottleneck limits.
func (b *bench) cost(ctx context.Context) error {
	if err := b.classifierCost(); err != nil {
		return err
	}
	return b.onOneCPU(func() error {
		for _, m := range b.c.costOffload {
			err := b.offloadMode(ctx, m)
			if err == nil && b.c.costRounds > 0 {
				err = b.throughputCost(ctx, m)
			}
			if err == nil && b.c.flowCycles > 0 {
				err = b.throughputWithinFlow(ctx, m)
			}
			if oerr := b.offloadMode(ctx, offloadOff); err == nil {
				err = oerr
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// The offload modes of the throughput rounds: how big the packets the writer and the
// classifier see are.
const (
	// offloadOn: the sender's TSO/GSO on, as a host has them: the writer and the classifier
	// run once per super-packet of up to 64 KB.
	offloadOn = "on"
	// offloadOff: the sender's TSO/GSO off (as for the other experiments: the bottleneck
	// must see MTU-sized packets), so every MTU-sized packet pays the classifier in full.
	offloadOff = "off"
	// offloadGRO: MTU-sized packets on the wire, as offloadOff, and GRO on r1's ingress, as
	// a NIC has it by default: the classifier sees what a Linux router's egress sees. (The
	// writer runs once per send in every mode: Linux TCP always builds GSO packets, which
	// the device layer cuts when the device has TSO/GSO off.)
	offloadGRO = "gro"
)

// offloadShort names a mode in a table's title; offloadKey in the JSON results.
var (
	offloadShort = map[string]string{offloadOn: "TSO/GSO on", offloadOff: "TSO/GSO off", offloadGRO: "TSO/GSO off, GRO on r1"}
	offloadKey   = map[string]string{offloadOn: "tso_on", offloadOff: "tso_off", offloadGRO: "gro_r1"}
)

var offloadTitle = map[string]string{
	offloadOn:  "the sender's TSO/GSO on, as a host has them",
	offloadOff: "the sender's TSO/GSO off (as for the other experiments: the bottleneck must see MTU-sized packets), so one flow is CPU-bound at a few Gbit/s and every packet pays in full",
	offloadGRO: "the sender's TSO/GSO off and GRO on r1's ingress, as a NIC has it by default: MTU-sized packets on the wire, aggregates at r1's egress",
}

// offloadMode sets the sender's TSO/GSO and r1's ingress GRO for mode m.
func (b *bench) offloadMode(ctx context.Context, m string) error {
	if err := b.offload(ctx, 0, m == offloadOn); err != nil {
		return err
	}
	gro := map[bool]string{true: "on", false: "off"}[m == offloadGRO]
	if out, err := b.cmd(ctx, "r1", "ethtool", "-K", b.r1In, "gro", gro); err != nil {
		return fmt.Errorf("ethtool on r1: %v: %s", err, out)
	}
	return nil
}

// onOneCPU runs fn with iperf3 on one CPU, the machine's last: then one flow's whole path
// (sender, r1's forwarding and classifier, receiver) runs on it, every cycle the writer and the
// classifier take comes out of the flow's throughput, and no packets are reordered between two
// CPUs' backlogs. Spread over this VM's two CPUs, that reordering moved a flow 10–30 % from
// round to round, and any change of timing (8 bytes less payload per segment, with no BPF at
// all: iperf3 -M) moved the mean by as much as the cost measured.
func (b *bench) onOneCPU(fn func() error) error {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		return fmt.Errorf("CPUs of the bench: %w", err)
	}
	for i := range 1024 {
		if all.IsSet(i) {
			b.pin = strconv.Itoa(i)
		}
	}
	defer func() { b.pin = "" }()
	return fn()
}

// classifierCost times the classifier on an established flow's data segment (timestamps and
// our option, 1400 bytes of payload) against a tc program that only returns.
func (b *bench) classifierCost() error {
	const repeat, passes = 1_000_000, 7
	type prog struct {
		name, key string
		p         *ebpf.Program
		ns        []float64
	}
	empty, err := emptyTC()
	if err != nil {
		return err
	}
	defer empty.Close()
	progs := []*prog{{name: "empty tc program", key: "empty", p: empty}}
	for _, scheme := range b.c.schemes {
		p, err := b.policy(scheme, nil)
		if err != nil {
			return err
		}
		for _, cache := range []bool{true, false} {
			if !cache && scheme != "backlog" {
				continue
			}
			cp, closer, err := prio.ClassifierProgram(p, cache)
			if err != nil {
				return err
			}
			defer closer.Close()
			key := scheme
			if !cache {
				key += ", without the flow cache"
			}
			progs = append(progs, &prog{name: "classifier, " + key, key: key, p: cp})
		}
	}
	opt := prio.Option{Occupancy: 40, Backlog: 200e3}.Encode()
	frame := packet.IP("198.18.0.1", "198.18.1.2").TCP(40000, 5500, "A").
		Option(1, nil).Option(1, nil).Option(8, []byte{0, 0, 0, 1, 0, 0, 0, 2}).
		Option(opt[0], opt[2:]).Payload(make([]byte, 1400)).Bytes()
	// Interleaved passes: one pass of 2,000,000 runs per program moved by ~10 ns from run to
	// run, more than the differences it measures; the median of interleaved passes is steadier.
	for range passes {
		for _, pr := range progs {
			_, per, err := progrun.Bench(pr.p, frame, repeat)
			if err != nil {
				return fmt.Errorf("%s: %w", pr.name, err)
			}
			pr.ns = append(pr.ns, float64(per.Nanoseconds()))
		}
	}
	t := &report.Table{
		Title:   "Cost: classifier ns/packet (BPF_PROG_TEST_RUN, a data segment with timestamps and the option)" + b.delayNote(),
		Columns: []string{"program", "ns/packet (median of passes)", "passes min–max", "ratio to empty", "added ns"},
	}
	data := map[string]float64{}
	base := report.Median(progs[0].ns)
	for _, pr := range progs {
		m := report.Median(pr.ns)
		t.Add(pr.name, m, report.Range("%.3g", pr.ns), m/base, m-base)
		data[pr.key] = m
	}
	t.Notes = append(t.Notes, fmt.Sprintf("%d interleaved passes of %d runs of each program, one flow on one CPU (its state stays in the table, and in the CPU's flow cache: the established path); ratio and added ns from the medians.", passes, repeat))
	b.table(t)
	b.res.Data[b.key("classifier_ns_per_packet")] = data
	return nil
}

// throughputCost runs one TCP flow s1 → d1 with r1's bottleneck unshaped (HTB far above what
// the CPUs can forward), in interleaved rounds: plain forwarding, a NIC's default qdisc, then
// the host writer and the router's parts alone and together: the classifier on the bare link
// (the unshaped link: what the writer and the classifier cost by themselves) and over
// HTB trees (fifo: one class, the classifier returns at once; backlog: it reads every packet).
func (b *bench) throughputCost(ctx context.Context, mode string) error {
	const unshaped = 100e9
	rounds := b.c.costRounds
	dst := netip.MustParseAddrPort(splitFirst(b.dsts)).Addr().String()
	arms := b.c.costArms
	got, cpuPerGbit, resent := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for round := range rounds {
		// Each round starts one arm later than the one before, so every arm takes every place
		// in a round equally often (rounds a multiple of len(arms)) and a place's bias falls
		// on none: in a fixed order (plain first) the classifier on the bare link read 0.967×
		// with TSO on, 1.005× rotated, where it runs once per 64-KB packet.
		for i := range arms {
			a := arms[(round+i)%len(arms)]
			slog.Info("throughput cost", "round", round+1, "arm", a.name)
			measure := func() error {
				busy := make(chan float64, 1)
				go func() { busy <- cpuBusyDuring(time.Now().Add(costWarmUp), costWindow) }()
				bps, retransmits, err := b.iperf3(ctx, dst, a.writer, a.room)
				if err != nil {
					return err
				}
				got[a.name] = append(got[a.name], bps)
				resent[a.name] = append(resent[a.name], retransmits/costWindow.Seconds())
				// CPU seconds the whole machine spent per gigabit moved in the window
				cpuPerGbit[a.name] = append(cpuPerGbit[a.name], <-busy/(bps*costWindow.Seconds()/1e9))
				return nil
			}
			var err error
			switch a.scheme {
			case "":
				err = measure()
			case "pfifo_fast":
				if out, qerr := b.cmd(ctx, "r1", "tc", "qdisc", "replace", "dev", b.bneck, "root", "pfifo_fast"); qerr != nil {
					return fmt.Errorf("tc qdisc on r1: %v: %s", qerr, out)
				}
				err = measure()
				if out, qerr := b.cmd(ctx, "r1", "tc", "qdisc", "del", "dev", b.bneck, "root"); qerr != nil && err == nil {
					err = fmt.Errorf("tc qdisc del on r1: %v: %s", qerr, out)
				}
			case "bare", "bare-nocache":
				err = b.withBareClassifier(a.scheme == "bare", measure)
			case "empty":
				err = b.withEmptyTCX(measure)
			default:
				p, perr := b.policy(a.scheme, nil)
				if perr != nil {
					return perr
				}
				err = b.withRouter(p, unshaped, measure)
			}
			if err != nil {
				return err
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t := &report.Table{
		Title:   "Cost: one TCP flow through an unshaped r1, " + offloadShort[mode] + b.delayNote() + " (median of interleaved rounds)",
		Columns: []string{"arm", "Gbit/s", "ratio to plain", "ratio to its baseline, per round: median (min–max)", "geometric mean (95 % interval)", "CPU s / Gbit", "Gbit per CPU s, ratio to plain", "segments resent / s"},
	}
	base, baseCPU := percentile(got[arms[0].name], 50), percentile(cpuPerGbit[arms[0].name], 50)
	for _, a := range arms {
		m, c := percentile(got[a.name], 50), percentile(cpuPerGbit[a.name], 50)
		// Paired within a round, so the machine's drift between rounds cancels: an arm over
		// HTB against HTB alone (the tree every scheme needs), the others against plain.
		baseline := arms[0].name
		if a.scheme == "fifo" || a.scheme == "backlog" {
			baseline = htbArm
		}
		var paired []float64
		for i, v := range got[a.name] {
			paired = append(paired, v/got[baseline][i])
		}
		t.Add(a.name, m/1e9, m/base, fmt.Sprintf("%.3f (%.3f–%.3f)", report.Median(paired), slices.Min(paired), slices.Max(paired)),
			ratioInterval(paired), c, baseCPU/c, percentile(resent[a.name], 50))
	}
	t.Notes = append(t.Notes, fmt.Sprintf("%d rounds of iperf3 (congestion control: %s), each round starting one arm later, %v after %v of warm-up, the sender, r1, r2 and the receiver on one CPU; %s. Ratio to its baseline: each round's goodput over the same round's HTB (fifo) for the arms over HTB, over plain forwarding for the others: median (min–max), and geometric mean with its 95 %% interval. CPU: the whole machine's busy time (/proc/stat) in the window per gigabit moved.", rounds, b.c.costCC, costWindow, costWarmUp, offloadTitle[mode]))
	b.table(t)
	b.res.Data[b.key("throughput_bps_"+offloadKey[mode])] = got
	b.res.Data[b.key("cpu_s_per_gbit_"+offloadKey[mode])] = cpuPerGbit
	b.res.Data[b.key("resent_per_s_"+offloadKey[mode])] = resent
	return nil
}

// roomMSS is the MSS (TCP_MAXSEG: without options) that leaves a segment as much payload as
// the writer does: the lab's 1500-byte MTU less IPv4 and TCP headers, less the option's 8 bytes.
const roomMSS = 1500 - 20 - 20 - prio.OptLen

// The cost experiment's flows: iperf3's goodput over the window after the warm-up.
const costWarmUp, costWindow = time.Second, 4 * time.Second

// iperf3 runs one iperf3 flow s1 → dst (d1), the client in the host writer's cgroup if
// advertise, with the MSS the writer leaves (roomMSS) if room, and returns its goodput in bit/s
// and its retransmitted segments over costWindow after costWarmUp. iperf3, one thread each
// side, is what users measure a link with; it keeps the Go runtime's threads out of a one-CPU
// measurement.
func (b *bench) iperf3(ctx context.Context, dst string, advertise, room bool) (bps, retransmits float64, err error) {
	srv, err := b.command(ctx, "d1", "iperf3", "-s", "-1")
	if err != nil {
		return 0, 0, err
	}
	if err := srv.Start(); err != nil {
		return 0, 0, fmt.Errorf("iperf3 server on d1: %w", err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	var out []byte
	for try := 0; ; try++ { // until the server listens
		time.Sleep(100 * time.Millisecond)
		args := []string{"-c", dst, "-C", b.c.costCC, "-J", "-O", strconv.Itoa(int(costWarmUp.Seconds())), "-t", strconv.Itoa(int(costWindow.Seconds()))}
		if room {
			args = append(args, "-M", strconv.Itoa(roomMSS))
		}
		cmd, err := b.command(ctx, "s1", "iperf3", args...)
		if err != nil {
			return 0, 0, err
		}
		var fd io.Closer
		if advertise {
			if fd, err = cgroup.Into(cmd.Cmd, b.cg); err != nil {
				return 0, 0, err
			}
		}
		out, err = cmd.Output()
		if fd != nil {
			fd.Close()
		}
		if err == nil {
			break
		}
		if try == 20 {
			return 0, 0, fmt.Errorf("iperf3 s1 → %s: %w: %s", dst, err, out)
		}
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			SumSent struct {
				Retransmits float64 `json:"retransmits"`
			} `json:"sum_sent"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.End.SumReceived.BitsPerSecond == 0 {
		return 0, 0, fmt.Errorf("iperf3 output %q: %v", out, err)
	}
	return r.End.SumReceived.BitsPerSecond, r.End.SumSent.Retransmits, nil
}

// ratioInterval is the geometric mean of paired ratios with its 95 % interval: a ratio's
// noise is multiplicative, and the arithmetic mean of ratios to a noisy baseline leans above
// the true ratio (by about the square of the baseline's relative spread).
func ratioInterval(ratios []float64) string {
	logs := make([]float64, len(ratios))
	for i, r := range ratios {
		logs[i] = math.Log(r)
	}
	mean, half := meanInterval(logs)
	if math.IsNaN(half) {
		return fmt.Sprintf("%.3f (one pair: —)", math.Exp(mean))
	}
	return fmt.Sprintf("%.3f (%.3f–%.3f)", math.Exp(mean), math.Exp(mean-half), math.Exp(mean+half))
}

// geoMean is the geometric mean of ratios (NaN for none).
func geoMean(ratios []float64) float64 {
	if len(ratios) == 0 {
		return math.NaN()
	}
	logs := make([]float64, len(ratios))
	for i, r := range ratios {
		logs[i] = math.Log(r)
	}
	mean, _ := meanInterval(logs)
	return math.Exp(mean)
}

// meanInterval is the mean of xs and the half-width of its 95 % confidence interval
// (Student's t: a handful of rounds).
func meanInterval(xs []float64) (mean, half float64) {
	n := float64(len(xs))
	for _, x := range xs {
		mean += x / n
	}
	if len(xs) < 2 {
		return mean, math.NaN()
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	// t quantiles (0.975) for 1–9 degrees of freedom, then 2.1 up to 29, 2.0 beyond
	t := []float64{12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26}
	q := 2.0
	if df := len(xs) - 1; df <= len(t) {
		q = t[df-1]
	} else if df < 30 {
		q = 2.1
	}
	return mean, q * math.Sqrt(ss/(n-1)/n)
}

// withBareClassifier runs fn with backlog's classifier, with or without its flow cache, on
// r1's bottleneck egress (tcx) and no qdisc: what the classifier costs a link by itself,
// without the HTB tree that acts on it.
func (b *bench) withBareClassifier(cache bool, fn func() error) error {
	p, err := b.policy("backlog", nil)
	if err != nil {
		return err
	}
	prog, objs, err := prio.ClassifierProgram(p, cache)
	if err != nil {
		return err
	}
	defer objs.Close()
	return b.withTCX(prog, fn)
}

// withEmptyTCX runs fn with a tc program that only returns on r1's bottleneck tcx egress.
func (b *bench) withEmptyTCX(fn func() error) error {
	prog, err := emptyTC()
	if err != nil {
		return err
	}
	defer prog.Close()
	return b.withTCX(prog, fn)
}

// withTCX runs fn with prog on r1's bottleneck tcx egress.
func (b *bench) withTCX(prog *ebpf.Program, fn func() error) error {
	l, err := b.attachTCX(prog)
	if err != nil {
		return err
	}
	defer l.Close()
	return fn()
}

// attachTCX attaches prog to r1's bottleneck tcx egress.
func (b *bench) attachTCX(prog *ebpf.Program) (link.Link, error) {
	var l link.Link
	err := nsrun.Do(b.l.Netns("r1"), func() error {
		iface, err := net.InterfaceByName(b.bneck)
		if err != nil {
			return err
		}
		l, err = link.AttachTCX(link.TCXOptions{Interface: iface.Index, Program: prog, Attach: ebpf.AttachTCXEgress})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("attach a program to r1's %s: %w", b.bneck, err)
	}
	return l, nil
}

// emptyTC is a tc program that only returns TCX_NEXT.
func emptyTC() (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
	if err != nil {
		return nil, fmt.Errorf("load the empty program: %w", err)
	}
	return prog, nil
}

func splitFirst(s string) string { return split(s)[0] }

// cpuBusyDuring is how many CPU seconds the machine spent busy (not idle, iowait or stolen)
// from at to at+d, by /proc/stat; 0 if it cannot be read.
func cpuBusyDuring(at time.Time, d time.Duration) float64 {
	time.Sleep(time.Until(at))
	before := cpuBusy()
	time.Sleep(d)
	return cpuBusy() - before
}

// cpuBusy is the busy seconds of all CPUs since boot: user, nice, system, irq and softirq of
// /proc/stat's first line (USER_HZ = 100 on Linux).
func cpuBusy() float64 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	var ticks float64
	for _, i := range []int{1, 2, 3, 6, 7} {
		if i < len(f) {
			v, _ := strconv.ParseFloat(f[i], 64)
			ticks += v
		}
	}
	return ticks / 100
}

type costArm struct {
	key    string // -cost-arms
	name   string
	writer bool   // the generator runs in the host writer's cgroup
	room   bool   // iperf3 asks for an MSS smaller by the option's length (no program)
	scheme string // the router's scheme; "" for none, "bare" for the classifier alone ("bare-nocache": without its flow cache), "empty" for an empty tcx program, or pfifo_fast
}

const htbArm = "HTB (fifo)"

// allCostArms, plain first: the baseline of the arms without HTB; HTB (fifo) that of the
// arms over HTB. A veth's default is noqueue: no qdisc at all, cheaper than any router
// interface (a NIC comes with pfifo_fast or another qdisc), so pfifo_fast can be measured too; an
// empty program on the same tcx hook is the floor of any classifier there.
var allCostArms = []costArm{
	{"plain", "plain forwarding (veth: noqueue)", false, false, ""},
	{"pfifo_fast", "pfifo_fast (a NIC's default)", false, false, "pfifo_fast"},
	{"room", "plain forwarding, MSS 8 bytes smaller (the option's room, no program)", false, true, ""},
	{"tcx-empty", "tcx egress, an empty program", false, false, "empty"},
	{"writer", "host writer", true, false, ""},
	{"classifier", "classifier (backlog; packets without the option), no qdisc", false, false, "bare"},
	{"classifier-nocache", "classifier (backlog; packets without the option) without the flow cache, no qdisc", false, false, "bare-nocache"},
	{"writer+classifier", "host writer + classifier (backlog), no qdisc", true, false, "bare"},
	{"htb", htbArm, false, false, "fifo"},
	{"htb+classifier", "classifier (backlog) + HTB", false, false, "backlog"},
	{"writer+htb+classifier", "host writer + classifier (backlog) + HTB", true, false, "backlog"},
}

// costArms picks the arms of -cost-arms, in allCostArms' order.
func costArms(keys []string) ([]costArm, error) {
	var out []costArm
	for _, a := range allCostArms {
		if slices.Contains(keys, a.key) {
			out = append(out, a)
		}
	}
	for _, k := range keys {
		if !slices.ContainsFunc(allCostArms, func(a costArm) bool { return a.key == k }) {
			return nil, fmt.Errorf("-cost-arms: %q is not an arm", k)
		}
	}
	if len(out) == 0 || out[0].key != "plain" {
		return nil, fmt.Errorf("-cost-arms: plain is every arm's baseline; include it")
	}
	if slices.ContainsFunc(out, func(a costArm) bool { return a.scheme == "backlog" }) &&
		!slices.ContainsFunc(out, func(a costArm) bool { return a.key == "htb" }) {
		return nil, fmt.Errorf("-cost-arms: htb is the baseline of the arms over HTB; include it")
	}
	return out, nil
}
