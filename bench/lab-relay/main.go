// Command lab-relay measures the kernel lab's impairment relay: one TCP flow through a link whose
// relay delays by 0 against a plain veth link (the relay's cost), and through 10 ms and 50 ms
// links against the ideal a window limit allows at that RTT, with the relay's CPU time per Gbit
// carried; plus the RTT a ping measures over each delay, and how closely the delays over a link
// with normal jitter follow the configured distribution. The paths are measured in alternation so
// machine noise hits them alike.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/impair"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/topo"
)

const topology = `
nodes: {a0: {}, b0: {}, a1: {}, b1: {}, a2: {}, b2: {}, a3: {}, b3: {}, a4: {}, b4: {}, a5: {}, b5: {}}
links:
  - endpoints: [a0, b0]
  - endpoints: [a1, b1]
    delay: 0ms
  - endpoints: [a2, b2]
    delay: 10ms
  - endpoints: [a3, b3]
    delay: 50ms
  - endpoints: [a4, b4]
  - endpoints: [{node: a5, delay: 10ms, jitter: 2ms, distribution: normal}, b5]
`

// offloadOff is the path through a4—b4: a plain veth whose ends send MTU-sized frames with full
// checksums, as the ends of a relayed link do, to tell the relay's cost from that of the frames.
const offloadOff = 4

func main() {
	rounds := flag.Int("rounds", 3, "measurements per path")
	secs := flag.Int("seconds", 5, "seconds per iperf3 run (the first 2 more, omitted: slow start)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	err := run(ctx, *rounds, *secs)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

// cpuSeconds is the user and system time a process has used.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64) // fields 14 and 15 of stat, after pid and comm
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100, nil // USER_HZ
}

// windowLimit is the most a TCP flow from client can keep in flight: its send buffer limit or the
// receiver's receive buffer limit, whichever is smaller (the nodes' tcp_wmem and tcp_rmem maxima).
func windowLimit(l *lab.Lab, client, server string) (float64, error) {
	read := func(node, key string) (float64, error) {
		cmd, err := l.Command(context.Background(), node, "cat", filepath.Join("/proc/sys/net/ipv4", key))
		if err != nil {
			return 0, err
		}
		out, err := cmd.Output()
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(out))
		return strconv.ParseFloat(f[len(f)-1], 64)
	}
	w, err := read(client, "tcp_wmem")
	if err != nil {
		return 0, err
	}
	r, err := read(server, "tcp_rmem")
	if err != nil {
		return 0, err
	}
	return min(w, r), nil
}

// pingRTTs pings n times, 10 ms apart, and returns the RTTs in ms, sorted.
func pingRTTs(ctx context.Context, l *lab.Lab, from, to string, n int) ([]float64, error) {
	cmd, err := l.Command(ctx, from, "ping", "-c", strconv.Itoa(n), "-i", "0.01", "-W", "2", to)
	if err != nil {
		return nil, err
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ping %s: %w", to, err)
	}
	var rtts []float64
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "time="); ok {
			if ms, err := strconv.ParseFloat(v, 64); err == nil {
				rtts = append(rtts, ms)
			}
		}
	}
	if len(rtts) == 0 {
		return nil, fmt.Errorf("ping %s: no replies", to)
	}
	sort.Float64s(rtts)
	return rtts, nil
}

func run(ctx context.Context, rounds, secs int) error {
	name := fmt.Sprintf("br%d", os.Getpid()%100000)
	top, err := lab.Parse("bench-lab-relay.yaml", []byte(topology), name)
	if err != nil {
		return err
	}
	l, err := lab.Up("bench-lab-relay.yaml", []byte(topology), top)
	if err != nil {
		return err
	}
	defer lab.Down(name)
	type path struct {
		label, client, server string
		link                  *topo.Link
		relayPID              int
		gbps, cpuPerGbit      []float64
		rtt                   float64
	}
	var paths []*path
	for _, end := range []*topo.Iface{l.Topology.Links[offloadOff].A, l.Topology.Links[offloadOff].B} {
		cmd, err := l.Command(ctx, end.Node.Name, "ethtool", "-K", l.IfName(end), "tx", "off")
		if err != nil {
			return err
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("ethtool on %s: %v: %s", end.Node.Name, err, out)
		}
	}
	// A first ping resolves the neighbours (ARP crosses the delay too).
	for _, link := range l.Topology.Links {
		if _, err := pingRTTs(ctx, l, link.A.Node.Name, link.B.IPv4.Addr().String(), 1); err != nil {
			return err
		}
	}
	for i, label := range []string{"plain veth", "relay, delay 0", "relay, delay 10ms", "relay, delay 50ms", "plain veth, tx checksum offload off"} {
		p := &path{label: label, client: fmt.Sprintf("a%d", i), server: fmt.Sprintf("b%d", i), link: l.Topology.Links[i]}
		if p.link.Impaired() {
			r, err := l.Relay(p.link)
			if err != nil {
				return err
			}
			p.relayPID = r.PID
		}
		rtts, err := pingRTTs(ctx, l, p.client, p.link.B.IPv4.Addr().String(), 100)
		if err != nil {
			return err
		}
		p.rtt = rtts[len(rtts)/2]
		paths = append(paths, p)
	}
	for r := 0; r < rounds; r++ {
		for _, p := range paths {
			dst := p.link.B.IPv4.Addr().String()
			cpu0 := 0.0
			if p.relayPID > 0 {
				if cpu0, err = cpuSeconds(p.relayPID); err != nil {
					return err
				}
			}
			start := time.Now()
			res, err := l.Iperf(ctx, p.client, p.server, dst, "-t", fmt.Sprint(secs), "-O", "2")
			if err != nil {
				return err
			}
			elapsed := time.Since(start).Seconds()
			p.gbps = append(p.gbps, res.ReceivedBPS/1e9)
			if p.relayPID > 0 {
				cpu1, err := cpuSeconds(p.relayPID)
				if err != nil {
					return err
				}
				// CPU over the whole run (omitted seconds included) per Gbit carried in it; the
				// relay's two threads, ACKs included. Elapsed time includes iperf3's setup, a
				// slight overestimate of the bits.
				p.cpuPerGbit = append(p.cpuPerGbit, (cpu1-cpu0)/(res.ReceivedBPS/1e9*elapsed))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	w, err := windowLimit(l, "a2", "b2")
	if err != nil {
		return err
	}
	plain, zero, noOffload := report.Median(paths[0].gbps), report.Median(paths[1].gbps), report.Median(paths[offloadOff].gbps)
	t := &report.Table{
		Title: "lab relay: one TCP flow (iperf3, median of alternating runs)",
		Columns: []string{"path", "ping RTT ms (median)", "median Gbit/s", "min–max Gbit/s", "runs", "ratio to plain veth",
			"ratio to plain veth, offload off", "BDP ideal Gbit/s", "ratio to ideal", "relay CPU s per Gbit"},
		Notes: []string{
			fmt.Sprintf("%d runs × %d s (+2 s omitted) per path, alternated.", rounds, secs),
			fmt.Sprintf("BDP ideal: the lesser of the 0-ms relay's median and the window limit (the smaller of the sender's tcp_wmem and the receiver's tcp_rmem maximum, %.0f MiB) over the ping RTT. Socket buffers also hold overhead, so a flow reaches a fraction of it.", w/(1<<20)),
			"Relay CPU: user + system seconds of the relay process (both directions) per Gbit of goodput.",
			"A plain veth carries 64 KB TSO segments; with tx checksum offload off its ends send MTU-sized frames with full checksums, as the ends of a relayed link do: the ratio to that row is the relay's own cost.",
		},
	}
	for i, p := range paths {
		g := report.Median(p.gbps)
		ideal, toIdeal, cpu, toNoOffload := "", "", "", ""
		if p.relayPID > 0 {
			toNoOffload = fmt.Sprintf("%.3f", g/noOffload)
		}
		if i == 2 || i == 3 {
			id := min(zero, w*8/(p.rtt/1e3)/1e9)
			ideal, toIdeal = fmt.Sprintf("%.2f", id), fmt.Sprintf("%.3f", g/id)
		}
		if p.relayPID > 0 {
			cpu = fmt.Sprintf("%.2f", report.Median(p.cpuPerGbit))
		}
		t.Add(p.label, fmt.Sprintf("%.2f", p.rtt), fmt.Sprintf("%.2f", g), report.Range("%.2f", p.gbps), len(p.gbps),
			fmt.Sprintf("%.3f", g/plain), toNoOffload, ideal, toIdeal, cpu)
		switch i {
		case 2, 3:
			want := 2 * float64(p.link.A.Egress.Delay) / 1e6
			t.Goal(report.Within("ping RTT ms", p.rtt, want, want+1))
		}
	}
	data := map[string]any{"window_limit_bytes": w}
	for _, p := range paths {
		data[p.label] = map[string]any{"gbps": p.gbps, "cpu_s_per_gbit": p.cpuPerGbit, "ping_rtt_ms": p.rtt}
	}
	acc, jitter, err := accuracy(ctx, l)
	if err != nil {
		return err
	}
	data["jitter_rtts_ms"] = jitter
	return report.Save(report.Result{Name: "lab-relay", Tables: []*report.Table{t, acc}, Data: data})
}

// accuracy pings over the link whose one direction has normal jitter (the other none) and
// compares the RTTs with the configured distribution: its median, its 1st and 99th
// percentiles, and a Kolmogorov–Smirnov statistic against its CDF.
func accuracy(ctx context.Context, l *lab.Lab) (*report.Table, []float64, error) {
	const n = 500
	link := l.Topology.Links[5]
	e := link.A.Egress
	rtts, err := pingRTTs(ctx, l, link.A.Node.Name, link.B.IPv4.Addr().String(), n)
	if err != nil {
		return nil, nil, err
	}
	ds := make([]time.Duration, len(rtts))
	for i, ms := range rtts {
		ds[i] = time.Duration(ms * 1e6)
	}
	ks := impair.KS(ds, func(d time.Duration) float64 { return impair.CDF(e.Distribution, e.Delay, e.Jitter, d) })
	bound := 1.5 * impair.KSCritical(len(ds), 0.001)
	pct := func(q float64) string { return fmt.Sprintf("%.2f", rtts[min(len(rtts)-1, int(q*float64(len(rtts))))]) }
	quant := func(q float64) string { // the configured law's quantile, by bisection on its CDF
		lo, hi := time.Duration(0), e.Delay+10*e.Jitter
		for hi-lo > time.Microsecond {
			mid := (lo + hi) / 2
			if impair.CDF(e.Distribution, e.Delay, e.Jitter, mid) < q {
				lo = mid
			} else {
				hi = mid
			}
		}
		return fmt.Sprintf("%.2f", float64(hi)/1e6)
	}
	t := &report.Table{
		Title:   fmt.Sprintf("lab relay: delay accuracy (ping RTT over a link delaying one way %v ± %v %s, %d pings)", e.Delay, e.Jitter, e.Distribution, len(rtts)),
		Columns: []string{"", "p1 ms", "median ms", "p99 ms", "KS statistic against the configured CDF", "bound"},
		Notes: []string{"The other direction has no delay, so a ping's RTT is the jittered one-way delay plus the path's own microseconds. " +
			"Bound: 1.5 × the Kolmogorov critical value at 0.1 % for this many samples (internal/lab's test uses the same)."},
	}
	t.Add("configured", quant(0.01), quant(0.5), quant(0.99), "", "")
	t.Add("measured", pct(0.01), pct(0.5), pct(0.99), fmt.Sprintf("%.4f", ks), fmt.Sprintf("%.4f", bound))
	t.Goal(report.AtMost("KS statistic", ks, bound))
	return t, rtts, nil
}
