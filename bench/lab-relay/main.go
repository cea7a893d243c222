// Command lab-relay measures the kernel lab's impairment relay: one TCP flow through a link whose
// relay delays by 0 against a plain veth link (the relay's cost), and through 10 ms and 50 ms
// links against the ideal a window limit allows at that RTT, with the relay's CPU time per Gbit
// carried; plus the RTT a ping measures over each delay. The paths are measured in alternation so
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
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/topo"
)

const topology = `
nodes: {a0: {}, b0: {}, a1: {}, b1: {}, a2: {}, b2: {}, a3: {}, b3: {}}
links:
  - endpoints: [a0, b0]
  - endpoints: [a1, b1]
    delay: 0ms
  - endpoints: [a2, b2]
    delay: 10ms
  - endpoints: [a3, b3]
    delay: 50ms
`

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

func pingRTT(ctx context.Context, l *lab.Lab, from, to string) (median float64, err error) {
	cmd, err := l.Command(ctx, from, "ping", "-c", "50", "-i", "0.02", "-W", "2", to)
	if err != nil {
		return 0, err
	}
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("ping %s: %w", to, err)
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
		return 0, fmt.Errorf("ping %s: no replies", to)
	}
	sort.Float64s(rtts)
	return rtts[len(rtts)/2], nil
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
	for i, label := range []string{"plain veth", "relay, delay 0", "relay, delay 10ms", "relay, delay 50ms"} {
		p := &path{label: label, client: fmt.Sprintf("a%d", i), server: fmt.Sprintf("b%d", i), link: l.Topology.Links[i]}
		if p.link.Impaired() {
			r, err := l.Relay(p.link)
			if err != nil {
				return err
			}
			p.relayPID = r.PID
		}
		dst := p.link.B.IPv4.Addr().String()
		if p.rtt, err = pingRTT(ctx, l, p.client, dst); err != nil {
			return err
		}
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
	plain, zero := report.Median(paths[0].gbps), report.Median(paths[1].gbps)
	t := &report.Table{
		Title: "lab relay: one TCP flow (iperf3, median of alternating runs)",
		Columns: []string{"path", "ping RTT ms (median)", "median Gbit/s", "min–max Gbit/s", "runs", "ratio to plain veth",
			"BDP ideal Gbit/s", "ratio to ideal", "relay CPU s per Gbit"},
		Notes: []string{
			fmt.Sprintf("%d runs × %d s (+2 s omitted) per path, alternated.", rounds, secs),
			fmt.Sprintf("BDP ideal: the lesser of the 0-ms relay's median and the window limit (the smaller of the sender's tcp_wmem and the receiver's tcp_rmem maximum, %.0f MiB) over the ping RTT. Socket buffers also hold overhead, so a flow reaches a fraction of it.", w/(1<<20)),
			"Relay CPU: user + system seconds of the relay process (both directions) per Gbit of goodput.",
		},
	}
	for i, p := range paths {
		g := report.Median(p.gbps)
		ideal, toIdeal, cpu := "", "", ""
		if i >= 2 {
			id := min(zero, w*8/(p.rtt/1e3)/1e9)
			ideal, toIdeal = fmt.Sprintf("%.2f", id), fmt.Sprintf("%.3f", g/id)
		}
		if p.relayPID > 0 {
			cpu = fmt.Sprintf("%.2f", report.Median(p.cpuPerGbit))
		}
		t.Add(p.label, fmt.Sprintf("%.2f", p.rtt), fmt.Sprintf("%.2f", g), report.Range("%.2f", p.gbps), len(p.gbps),
			fmt.Sprintf("%.3f", g/plain), ideal, toIdeal, cpu)
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
	return report.Save(report.Result{Name: "lab-relay", Tables: []*report.Table{t}, Data: data})
}
