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
		Columns: []string{"path", "median Gbit/s", "runs", "ratio to plain veth"},
		Notes:   []string{fmt.Sprintf("Goal: the loss program costs < 3%% (ratio ≥ 0.97). %d runs × %d s per path, alternated.", rounds, secs)},
	}
	for i, p := range paths {
		t.Add(p.name, fmt.Sprintf("%.2f", report.Median(gbps[i])), len(gbps[i]), fmt.Sprintf("%.3f", report.Median(gbps[i])/base))
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
		Columns: []string{"link", "median goodput Mbit/s", "runs", "ratio to the rate"},
		Notes:   []string{"Goal: within ±10% of the rate (ratio 0.9 to 1.1); the test asserts only the upper bound."},
	}
	h.Add("rate: 40mbit", fmt.Sprintf("%.2f", report.Median(shaped)*shapedBPS/1e6), len(shaped), fmt.Sprintf("%.3f", report.Median(shaped)))
	return report.Save(report.Result{Name: "lab", Tables: []*report.Table{t, h}, Data: map[string]any{"gbps": gbps, "shaped_ratio": shaped}})
}
