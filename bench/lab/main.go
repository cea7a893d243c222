// Command lab measures what the lab's loss program costs: TCP throughput over a plain veth link
// against the same kind of link with the loss program attached at 0% loss, in one lab, with
// the two measured in alternation so machine noise hits both alike; and how closely TCP
// goodput over an HTB-shaped link (rate: 40mbit) meets its rate.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/lab"
)

const topology = `
nodes: {a1: {}, b1: {}, a2: {}, b2: {}, a3: {}, b3: {}}
links:
  - endpoints: [a1, b1]
  - endpoints: [a2, b2]
    loss: 0
  - endpoints: [a3, b3]
    rate: 40mbit
`

const shapedBPS = 40e6 // the a3-b3 link's rate

func main() {
	rounds := flag.Int("rounds", 5, "measurements per path")
	secs := flag.Int("seconds", 3, "seconds per iperf3 run")
	flag.Parse()
	// Ctrl-C ends the running iperf3 and still takes the lab down.
	// A lost terminal or output pipe (| head) stops the bench as ^C does, and it cleans up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	err := run(ctx, *rounds, *secs)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, rounds, secs int) error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return err
	}
	name := fmt.Sprintf("bl%d", os.Getpid()%100000)
	top, err := lab.Parse("bench-lab.yaml", []byte(topology), name)
	if err != nil {
		return err
	}
	l, err := lab.Up("bench-lab.yaml", []byte(topology), top)
	if err != nil {
		return err
	}
	defer lab.Down(name)
	paths := []struct{ name, client, server string }{
		{"veth, no program", "a1", "b1"},
		{"veth + loss program at 0%", "a2", "b2"},
	}
	gbps := make([][]float64, len(paths))
	for r := 0; r < rounds; r++ {
		for i, p := range paths {
			dst := l.Topology.Node(p.server).Ifaces[0].IPv4.Addr().String()
			res, err := l.Iperf(ctx, p.client, p.server, dst, "-t", fmt.Sprint(secs), "-O", "1")
			if err != nil {
				return err
			}
			gbps[i] = append(gbps[i], res.ReceivedBPS/1e9)
			time.Sleep(200 * time.Millisecond)
		}
	}
	base := report.Median(gbps[0])
	t := &report.Table{
		Title:   "lab: cost of the loss program (TCP iperf3, one flow, median of alternating runs)",
		Columns: []string{"path", "median Gbit/s", "min–max Gbit/s", "runs", "ratio to plain veth", "per-run ratio min–max"},
		Notes:   []string{fmt.Sprintf("%d runs × %d s per path, alternated; the ratio is of the medians, the per-run ratios pair each run with the plain run before it.", rounds, secs)},
	}
	for i, p := range paths {
		var paired []float64
		for r, v := range gbps[i] {
			paired = append(paired, v/gbps[0][r])
		}
		ratio, perRun := report.Median(gbps[i])/base, ""
		if i > 0 {
			perRun = report.Range("%.3f", paired)
		}
		t.Add(p.name, fmt.Sprintf("%.2f", report.Median(gbps[i])), report.Range("%.2f", gbps[i]), len(gbps[i]), fmt.Sprintf("%.3f", ratio), perRun)
		if i > 0 {
			// The loss program costs < 3 %.
			t.Goal(report.AtLeast("ratio to plain veth", ratio, 0.97))
		}
	}
	var shaped []float64
	dst := l.Topology.Node("b3").Ifaces[0].IPv4.Addr().String()
	for r := 0; r < rounds; r++ {
		res, err := l.Iperf(ctx, "a3", "b3", dst, "-t", fmt.Sprint(secs), "-O", "1")
		if err != nil {
			return err
		}
		shaped = append(shaped, res.ReceivedBPS/shapedBPS)
	}
	h := &report.Table{
		Title:   "lab: HTB shaping (TCP iperf3, one flow, over a link with rate: 40mbit)",
		Columns: []string{"link", "median goodput Mbit/s", "min–max Mbit/s", "runs", "ratio to the rate"},
		Notes:   []string{"The test asserts only the upper bound (goodput never above the rate +10 %)."},
	}
	h.Add("rate: 40mbit", fmt.Sprintf("%.2f", report.Median(shaped)*shapedBPS/1e6), report.Range("%.2f", scale(shaped, shapedBPS/1e6)), len(shaped), fmt.Sprintf("%.3f", report.Median(shaped)))
	h.Goal(report.Within("ratio to the rate", report.Median(shaped), 0.9, 1.1))
	return report.Save(report.Result{Name: "lab", Tables: []*report.Table{t, h}, Data: map[string]any{"gbps": gbps, "shaped_ratio": shaped}})
}

// scale is xs, each times k.
func scale(xs []float64, k float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x * k
	}
	return out
}
