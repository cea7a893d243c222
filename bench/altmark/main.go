// Command altmark benchmarks the alternate-marking probe in one run, against baselines measured
// in the same run: ns/packet of the probe program through BPF_PROG_TEST_RUN against an empty tcx
// program (per direction; counting only, counting and hashing, and the worst case of sampling
// every packet), and TCP throughput (iperf3) through a lab router with the probe on both
// directions of both its interfaces against the same router without. It prints markdown tables
// and writes bench/results/altmark.json. Run as root: go run ./bench/altmark
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/altmark"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/packet"
)

var (
	repeat   = flag.Int("repeat", 1_000_000, "BPF_PROG_TEST_RUN runs per measurement")
	rounds   = flag.Int("rounds", 5, "rounds (medians are reported)")
	duration = flag.Duration("duration", 4*time.Second, "iperf3 run length")
	only     = flag.String("only", "", "comma-separated parts to run (ns, tcp, timestamps, 64b); empty: all")
)

// part is whether the part name is to run (-only).
func part(name string) bool {
	return *only == "" || slices.Contains(strings.Split(*only, ","), name)
}

func main() {
	flag.Parse()
	// A lost terminal or output pipe (| head) stops the bench as ^C does, and it cleans up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("bench altmark", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return err
	}
	var tables []*report.Table
	data := map[string]any{}
	if part("ns") {
		ns, ndata, err := nsPerPacket()
		if err != nil {
			return err
		}
		tables = append(tables, ns)
		for k, v := range ndata {
			data[k] = v
		}
	}
	if part("tcp") || part("timestamps") || part("64b") {
		ts, tdata, err := throughput(ctx)
		if err != nil {
			return err
		}
		tables = append(tables, ts...)
		for k, v := range tdata {
			data[k] = v
		}
	}
	name := "altmark"
	if *only != "" {
		name = "altmark-partial" // a partial run does not replace the full one's results
	}
	return report.Save(report.Result{Name: name, Tables: tables, Data: data})
}

// emptyTCX is the baseline: a tcx program that returns TCX_NEXT.
func emptyTCX() (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
}

type variant struct {
	name     string
	sampling bool
	bits     int
	ref      uint32
	nmax     int
}

// nsPerPacket measures the probe programs with BPF_PROG_TEST_RUN (the packet comes from lo, the
// point the probe is loaded for), medians over rounds.
func nsPerPacket() (*report.Table, map[string]any, error) {
	frames := map[string][]byte{
		"1500 B": packet.IP("198.18.0.1", "198.18.1.2").UDP(5000, 6000).Payload(make([]byte, 1500-28)).Bytes(),
		"64 B":   packet.IP("198.18.0.1", "198.18.1.2").UDP(5000, 6000).Payload(make([]byte, 64-14-28-4)).Bytes(),
	}
	base, err := emptyTCX()
	if err != nil {
		return nil, nil, fmt.Errorf("empty tcx program: %w", err)
	}
	defer base.Close()
	variants := []variant{
		{name: "count only", sampling: false, bits: 8},
		{name: "count + hash (packet not selected)", sampling: true, bits: 8, ref: 0},
		{name: "count + hash + sample every packet (worst case)", sampling: true, bits: 0, nmax: 65536},
	}
	t := &report.Table{Title: "altmark probe: ns/packet (BPF_PROG_TEST_RUN)",
		Columns: []string{"variant", "direction", "frame", "empty tcx ns", "probe ns", "probe min–max ns", "probe − empty ns"}}
	data := map[string]any{}
	for _, v := range variants {
		for _, dir := range []string{"in", "out"} {
			for _, fname := range []string{"64 B", "1500 B"} {
				frame := frames[fname]
				spec := altmark.ProbeSpec{Points: []altmark.Point{{Ifname: "lo", Direction: "in"}, {Ifname: "lo", Direction: "out"}},
					PeriodNs: int64(time.Second), Carrier: "dscp", DSCPBits: [2]uint8{0, 1}, HashBits: v.bits, HashRef: v.ref, NMax: max(v.nmax, 1000)}
				if v.sampling && v.bits > 0 {
					// a reference the frame's hash does not match in its low bits
					spec.HashRef = ^frameHash()
				}
				p, err := altmark.LoadProbe(spec, v.sampling)
				if err != nil {
					return nil, nil, err
				}
				in, out := p.Programs()
				prog := in
				if dir == "out" {
					prog = out
				}
				var eNs, pNs []float64
				for r := 0; r < *rounds; r++ {
					_, de, err := benchProg(base, frame)
					if err != nil {
						p.Close()
						return nil, nil, err
					}
					_, dp, err := benchProg(prog, frame)
					if err != nil {
						p.Close()
						return nil, nil, err
					}
					eNs, pNs = append(eNs, float64(de.Nanoseconds())), append(pNs, float64(dp.Nanoseconds()))
					if v.bits == 0 {
						// empty the rings between rounds so every round samples into room
						_, _, _ = p.Read(0)
						_, _, _ = p.Read(1)
					}
				}
				st, _ := p.Stats()
				p.Close()
				e, pm := report.Median(eNs), report.Median(pNs)
				t.Add(v.name, dir, fname, e, pm, report.Range("%.0f", pNs), pm-e)
				data[fmt.Sprintf("ns/%s/%s/%s", v.name, dir, fname)] = map[string]any{"empty": eNs, "probe": pNs, "stats": st}
			}
		}
	}
	t.Notes = append(t.Notes, fmt.Sprintf("Medians of %d rounds of %d runs each; the empty program returns TCX_NEXT. "+
		"The worst case samples every packet (hash length 0, NMAX 65536): the lock, the ring reservation and the copy.", *rounds, *repeat))
	return t, data, nil
}

func benchProg(p *ebpf.Program, frame []byte) (uint32, time.Duration, error) {
	ret, per, err := p.Benchmark(frame, *repeat, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("BPF_PROG_TEST_RUN: %w", err)
	}
	return ret, per, nil
}

// frameHash is the probe's hash of the benchmark's UDP frames (ID 0, zero payload).
func frameHash() uint32 {
	return altmark.Hash(altmark.HashFields{Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.1.2"),
		Proto: 17, SrcPort: 5000, DstPort: 6000, Payload: make([]byte, 8)})
}

// throughput runs iperf3 TCP h1 → h2 through r1 without and with the probe on both directions
// of both of r1's interfaces, interleaved, and reports medians and their ratio; then the
// timestamp agreement on one veth (timestamps) and 64-byte frames (packets64).
func throughput(ctx context.Context) ([]*report.Table, map[string]any, error) {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "am" + hex.EncodeToString(b)
	top, err := lab.Parse("bench-altmark.yaml", []byte(lab.HostRouterHost), name)
	if err != nil {
		return nil, nil, err
	}
	l, err := lab.Up("bench-altmark.yaml", []byte(lab.HostRouterHost), top)
	if err != nil {
		return nil, nil, fmt.Errorf("lab up: %w", err)
	}
	defer func() {
		if err := lab.Down(name); err != nil {
			slog.Error("lab down", "lab", name, "err", err)
		}
	}()
	r1, err := l.Node("r1")
	if err != nil {
		return nil, nil, err
	}
	h2, err := l.Node("h2")
	if err != nil {
		return nil, nil, err
	}
	var points []altmark.Point
	for _, i := range r1.Ifaces {
		points = append(points, altmark.Point{Ifname: l.IfName(i), Direction: "in"}, altmark.Point{Ifname: l.IfName(i), Direction: "out"})
	}
	spec := altmark.ProbeSpec{Points: points, PeriodNs: int64(time.Second), Carrier: "dscp", DSCPBits: [2]uint8{0, 1}, HashBits: 8, NMax: 1000}
	var tables []*report.Table
	data := map[string]any{}
	if part("tcp") {
		t, tdata, err := tcpThroughput(ctx, l, spec, h2.Ifaces[0].IPv4.Addr().String())
		if err != nil {
			return nil, nil, err
		}
		tables = append(tables, t)
		for k, v := range tdata {
			data[k] = v
		}
	}
	if part("timestamps") {
		ts, delays, err := timestamps(ctx, l)
		if err != nil {
			return nil, nil, err
		}
		tables = append(tables, ts)
		data["veth_delays_ns"] = delays
	}
	if part("64b") {
		p64, pdata, err := packets64(ctx, l, spec)
		if err != nil {
			return nil, nil, fmt.Errorf("64-byte frames: %w", err)
		}
		tables = append(tables, p64)
		for k, v := range pdata {
			data[k] = v
		}
	}
	return tables, data, nil
}

// tcpThroughput is iperf3 h1 → dst through r1, without and with the probe (spec), interleaved.
func tcpThroughput(ctx context.Context, l *lab.Lab, spec altmark.ProbeSpec, dst string) (*report.Table, map[string]any, error) {
	var counted int64
	without, with, err := interleaved(l, spec, func(p altmark.Datapath) (float64, error) {
		res, err := l.Iperf(ctx, "h1", "h2", dst, "-t", fmt.Sprint(duration.Seconds()))
		if p != nil {
			for n := int64(0); n < 2; n++ {
				cs, _, _ := p.Read(n)
				for _, c := range cs {
					counted += c.Packets
				}
			}
		}
		return res.ReceivedBPS / 1e9, err
	})
	if err != nil {
		return nil, nil, err
	}
	wo, wi := report.Median(without), report.Median(with)
	t := &report.Table{Title: "altmark probe: TCP throughput through r1 (iperf3, 1 flow)",
		Columns: []string{"r1", "Gbit/s (median)", "min–max", "ratio", "per-round ratio min–max"}}
	t.Add("no probe", wo, report.Range("%.3g", without), 1.0, "")
	t.Add("probe on both interfaces, in and out", wi, report.Range("%.3g", with), wi/wo, report.Range("%.3f", pairedRatios(with, without)))
	t.Goal(probeGoal(wi / wo))
	t.Notes = append(t.Notes, fmt.Sprintf("%d interleaved rounds of %v; veths with GSO/GRO as the lab sets them (a GSO packet is one probe run; it counts gso_segs packets). The probe counted %d packets over the probed rounds.", *rounds, *duration, counted))
	return t, map[string]any{"gbps_without": without, "gbps_with": with, "packets_counted": counted}, nil
}

// probeGoal is the probe's throughput goal: it costs a router at most 5 %.
func probeGoal(ratio float64) report.Goal {
	return report.AtLeast("ratio to no probe", ratio, 0.95)
}

// pairedRatios are xs[i]/base[i], each round against the baseline of the same round.
func pairedRatios(xs, base []float64) []float64 {
	var r []float64
	for i, x := range xs {
		if i < len(base) {
			r = append(r, x/base[i])
		}
	}
	return r
}

// timestamps probes both ends of h1's veth to r1 (h1 egress, r1 ingress), sends 2,000 pings
// 1 ms apart and matches the samples by hash: each difference is the veth's true delay (µs)
// plus the error of the two timestamps (one clock here: the probes' own placement).
func timestamps(ctx context.Context, l *lab.Lab) (*report.Table, []int64, error) {
	h1, err := l.Node("h1")
	if err != nil {
		return nil, nil, err
	}
	h2, err := l.Node("h2")
	if err != nil {
		return nil, nil, err
	}
	a, b := h1.Ifaces[0], h1.Ifaces[0].Peer()
	open := func(node, ifname, dir string) (altmark.Datapath, error) {
		var p altmark.Datapath
		err := nsrun.Do(l.Netns(node), func() error {
			var err error
			p, err = altmark.OpenProbe(altmark.ProbeSpec{Points: []altmark.Point{{Ifname: ifname, Direction: dir}}, PeriodNs: int64(time.Second),
				Carrier: "dscp", DSCPBits: [2]uint8{0, 1}, HashBits: 1, NMax: 65536})
			return err
		})
		return p, err
	}
	pa, err := open("h1", l.IfName(a), "out")
	if err != nil {
		return nil, nil, err
	}
	defer pa.Close()
	pb, err := open(b.Node.Name, l.IfName(b), "in")
	if err != nil {
		return nil, nil, err
	}
	defer pb.Close()
	cmd, err := l.Command(ctx, "h1", "ping", "-q", "-i", "0.001", "-c", "2000", h2.Ifaces[0].IPv4.Addr().String())
	if err != nil {
		return nil, nil, err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, nil, fmt.Errorf("ping: %v: %s", err, out)
	}
	at := map[int64]int64{}
	var sa []altmark.Sample
	for n := int64(0); n < 2; n++ {
		_, s, err := pa.Read(n)
		if err != nil {
			return nil, nil, err
		}
		sa = append(sa, s...)
		_, s, err = pb.Read(n)
		if err != nil {
			return nil, nil, err
		}
		for _, x := range s {
			at[x.Hash] = x.TAINs
		}
	}
	var d []int64
	for _, x := range sa {
		if t, ok := at[x.Hash]; ok {
			d = append(d, t-x.TAINs)
		}
	}
	if len(d) == 0 {
		return nil, nil, fmt.Errorf("timestamps: no sample matched")
	}
	slices.Sort(d)
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	t := &report.Table{Title: "altmark probe: timestamp agreement across one veth (h1 egress → r1 ingress)",
		Columns: []string{"matched samples", "min µs", "median µs", "p99 µs", "max µs"}}
	t.Add(len(d), us(d[0]), us(d[len(d)/2]), us(d[len(d)*99/100]), us(d[len(d)-1]))
	t.Notes = append(t.Notes, "2,000 pings 1 ms apart, hash length 1; both probes read the same CLOCK_TAI, so the "+
		"difference is the veth's delay (the egress hook to the peer's ingress hook) plus the timestamps' placement, an upper bound on their error.")
	return t, d, nil
}
