// Command conntrack benchmarks flowplane's XDP conntrack against plain kernel forwarding and
// nftables over nf_conntrack, in one lab and one run: TCP iperf3 with 1 and 8 flows, 64-byte UDP
// forwarding rate, XDP ns/packet for established traffic (BPF_PROG_TEST_RUN), and an established
// flow under a SYN flood that fills the unconfirmed table. It prints markdown tables of ratios
// and writes bench/results/conntrack.json. Run as root: go run ./bench/conntrack
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/conntrack"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/pin"
)

const topology = `
nodes:
  h1: {}
  r1: {kind: router}
  h2: {}
links:
  - endpoints: [h1, r1]
  - endpoints: [r1, h2]
`

const nftRules = `table inet fpctbench {
	chain fpfwd {
		type filter hook forward priority 0; policy drop;
		ct state invalid drop
		ct state established,related accept
		iifname "%s" ct state new accept
	}
}`

var (
	duration = 4 * time.Second
	rounds   = 3
	modes    = []string{"kernel", "nftables", "flowplane"}
)

// Result is one mode's measurements.
type Result struct {
	TCP1Gbps float64 `json:"tcp_1_flow_gbps"`
	TCP8Gbps float64 `json:"tcp_8_flows_gbps"`
	UDP64pps float64 `json:"udp_64b_rx_pps"`
}

// Report is the JSON written to bench/results/conntrack.json.
type Report struct {
	Date         time.Time           `json:"date"`
	Kernel       string              `json:"kernel"`
	CPUs         int                 `json:"cpus"`
	DurationS    float64             `json:"iperf_seconds"`
	Results      map[string]*Result  `json:"results"`
	Samples      map[string][]Result `json:"samples"`
	NsPerPkt     float64             `json:"xdp_ns_per_packet_established"`
	NsPerPktNoop float64             `json:"xdp_ns_per_packet_xdp_pass_only"`
	Flood        *Flood              `json:"syn_flood,omitempty"`
	Notes        []string            `json:"notes"`
}

// Flood is the SYN-flood experiment.
type Flood struct {
	BaselineGbps     float64 `json:"baseline_gbps"`
	UnderFloodGbps   float64 `json:"under_flood_gbps"`
	Ratio            float64 `json:"ratio"`
	UnconfirmedPeak  int     `json:"unconfirmed_entries_during_flood"`
	UnconfirmedTable int     `json:"unconfirmed_table_size"`
	EntryKept        bool    `json:"established_entry_kept"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("bench conntrack", "err", err)
		os.Exit(1)
	}
}

type bench struct {
	l      *lab.Lab
	h1, h2 netip.Addr
	dev    map[string]string // "h1", "h2", "r1:in", "r1:out"
}

func run(ctx context.Context) error {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "cb" + hex.EncodeToString(b)
	top, err := lab.Parse("bench-conntrack.yaml", []byte(topology), name)
	if err != nil {
		return err
	}
	l, err := lab.Up("bench-conntrack.yaml", []byte(topology), top)
	if err != nil {
		return fmt.Errorf("lab up: %w", err)
	}
	defer func() {
		if err := lab.Down(name); err != nil {
			slog.Warn("lab down", "err", err)
		}
	}()
	bn := &bench{l: l, dev: map[string]string{}}
	for _, x := range []struct {
		key, node string
		i         int
	}{{"h1", "h1", 0}, {"h2", "h2", 0}, {"r1:in", "r1", 0}, {"r1:out", "r1", 1}} {
		n, err := l.Node(x.node)
		if err != nil {
			return err
		}
		bn.dev[x.key] = l.IfName(n.Ifaces[x.i])
		if x.key == "h1" {
			bn.h1 = n.Ifaces[0].IPv4.Addr()
		}
		if x.key == "h2" {
			bn.h2 = n.Ifaces[0].IPv4.Addr()
		}
	}
	// The same host settings in every mode: NAPI on the hosts' veths (needed to receive XDP
	// redirects) and full checksums from the hosts (redirected frames lose CHECKSUM_PARTIAL).
	for _, h := range []string{"h1", "h2"} {
		if out, err := bn.cmd(ctx, h, "ethtool", "-K", bn.dev[h], "gro", "on", "tx", "off"); err != nil {
			return fmt.Errorf("ethtool on %s: %v: %s", h, err, out)
		}
	}
	if out, err := bn.cmd(ctx, "h1", "ping", "-c", "2", "-W", "2", bn.h2.String()); err != nil {
		return fmt.Errorf("lab does not forward: %v: %s", err, out)
	}
	rep := &Report{Date: time.Now().UTC(), CPUs: numCPU(), DurationS: duration.Seconds(), Results: map[string]*Result{}}
	if u, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		rep.Kernel = strings.TrimSpace(string(u))
	}
	// Rounds interleave the modes so that load from elsewhere on the machine hits all of them;
	// the tables report each measurement's median over the rounds.
	samples := map[string][]Result{}
	for round := 1; round <= rounds; round++ {
		for _, m := range modes {
			slog.Info("measuring", "round", round, "mode", m)
			stopMode, err := bn.setMode(ctx, m)
			if err != nil {
				return fmt.Errorf("%s: %w", m, err)
			}
			var r Result
			if r.TCP1Gbps, err = bn.tcp(ctx, 1); err == nil {
				if r.TCP8Gbps, err = bn.tcp(ctx, 8); err == nil {
					r.UDP64pps, err = bn.udp64(ctx)
				}
			}
			stopMode()
			if err != nil {
				return fmt.Errorf("%s: %w", m, err)
			}
			samples[m] = append(samples[m], r)
		}
	}
	for _, m := range modes {
		rep.Samples = samples
		rep.Results[m] = &Result{
			TCP1Gbps: median(samples[m], func(r Result) float64 { return r.TCP1Gbps }),
			TCP8Gbps: median(samples[m], func(r Result) float64 { return r.TCP8Gbps }),
			UDP64pps: median(samples[m], func(r Result) float64 { return r.UDP64pps }),
		}
	}
	if rep.Flood, err = bn.flood(ctx, 0); err != nil {
		return fmt.Errorf("syn flood: %w", err)
	}
	ns, base, err := bn.nsPerPacket()
	if err != nil {
		return err
	}
	rep.NsPerPkt, rep.NsPerPktNoop = float64(ns.Nanoseconds()), float64(base.Nanoseconds())
	rep.Notes = []string{
		"veth lab on one host: all three modes share the same CPUs with iperf3 itself",
		"hosts run with GRO on and tx checksum offload off in every mode (needed for XDP redirect into veth)",
		"udp_64b_rx_pps: hping3 -2 --flood of one UDP flow with 64-byte frames from h1, frames per second arriving at h2 (one sender thread on a shared 2-core VM bounds it)",
	}
	printReport(rep)
	return report.WriteJSON("conntrack", rep)
}

func numCPU() int {
	n, _ := os.ReadFile("/sys/devices/system/cpu/online")
	s := strings.TrimSpace(string(n))
	if a, b, ok := strings.Cut(s, "-"); ok {
		var x, y int
		fmt.Sscan(a, &x)
		fmt.Sscan(b, &y)
		return y - x + 1
	}
	return 1
}

func (b *bench) cmd(ctx context.Context, node string, name string, args ...string) (string, error) {
	c, err := b.l.Command(ctx, node, name, args...)
	if err != nil {
		return "", err
	}
	out, err := c.CombinedOutput()
	return string(out), err
}

// setMode configures r1 for one mode and returns how to undo it.
func (b *bench) setMode(ctx context.Context, mode string) (func(), error) {
	switch mode {
	case "kernel":
		return func() {}, nil
	case "nftables":
		c, err := b.l.Command(ctx, "r1", "nft", "-f", "-")
		if err != nil {
			return nil, err
		}
		c.Stdin = strings.NewReader(fmt.Sprintf(nftRules, b.dev["r1:in"]))
		if out, err := c.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("nft: %v: %s", err, out)
		}
		return func() {
			_, _ = b.cmd(context.Background(), "r1", "nft", "delete", "table", "inet", "fpctbench")
			_, _ = b.cmd(context.Background(), "r1", "conntrack", "-F")
		}, nil
	case "flowplane":
		return b.startFlowplane(&conntrack.Config{})
	}
	return nil, fmt.Errorf("unknown mode %s", mode)
}

func (b *bench) startFlowplane(cfg *conntrack.Config) (func(), error) {
	cfg.Inside, cfg.Outside = []string{b.dev["r1:in"]}, []string{b.dev["r1:out"]}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- nsrun.Do(b.l.Netns("r1"), func() error {
			return conntrack.Serve(ctx, cfg, "", func() { close(ready) })
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		return nil, err
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			slog.Warn("conntrack", "err", err)
		}
		_ = nsrun.Do(b.l.Netns("r1"), func() error {
			inst, err := conntrack.Instance()
			if err != nil {
				return err
			}
			return pin.Remove("conntrack", inst)
		})
	}, nil
}

type iperfOut struct {
	End struct {
		SumReceived struct {
			BPS float64 `json:"bits_per_second"`
		} `json:"sum_received"`
		Sum struct {
			Packets     int     `json:"packets"`
			LostPackets int     `json:"lost_packets"`
			Seconds     float64 `json:"seconds"`
		} `json:"sum"`
	} `json:"end"`
	Error string `json:"error"`
}

var port = 6000

// iperf runs one iperf3 test h1 → h2.
func (b *bench) iperf(ctx context.Context, args ...string) (*iperfOut, error) {
	port++
	p := fmt.Sprint(port)
	srv, err := b.l.Command(ctx, "h2", "iperf3", "-s", "-1", "-p", p)
	if err != nil {
		return nil, err
	}
	if err := srv.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = srv.Wait() }()
	for i := 0; i < 100; i++ {
		if out, _ := b.cmd(ctx, "h2", "ss", "-Hltn", "sport = :"+p); strings.Contains(out, "LISTEN") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	out, err := b.cmd(ctx, "h1", "iperf3", append([]string{"-c", b.h2.String(), "-p", p, "-J", "-t", fmt.Sprint(int(duration.Seconds()))}, args...)...)
	var r iperfOut
	if jerr := json.Unmarshal([]byte(out), &r); jerr != nil {
		return nil, fmt.Errorf("iperf3 %v: %v: %s", args, err, out)
	}
	if r.Error != "" {
		return nil, fmt.Errorf("iperf3 %v: %s", args, r.Error)
	}
	return &r, nil
}

func (b *bench) tcp(ctx context.Context, flows int) (float64, error) {
	r, err := b.iperf(ctx, "-P", fmt.Sprint(flows))
	if err != nil {
		return 0, err
	}
	return r.End.SumReceived.BPS / 1e9, nil
}

// udp64 floods 64-byte UDP frames of one flow (hping3 -2 --flood, fixed ports) from h1 for
// three seconds and returns the rate at which they arrive on h2.
func (b *bench) udp64(ctx context.Context) (float64, error) {
	rx := func() (uint64, error) {
		out, err := b.cmd(ctx, "h2", "ip", "-s", "-j", "link", "show", "dev", b.dev["h2"])
		if err != nil {
			return 0, fmt.Errorf("ip link: %v: %s", err, out)
		}
		var links []struct {
			Stats struct {
				RX struct {
					Packets uint64 `json:"packets"`
				} `json:"rx"`
			} `json:"stats64"`
		}
		if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
			return 0, fmt.Errorf("ip link json: %v: %s", err, out)
		}
		return links[0].Stats.RX.Packets, nil
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// 18 bytes of data: 14 + 20 + 8 + 18 = 60-byte frames, 64 with the FCS.
	hp, err := b.l.Command(fctx, "h1", "hping3", "-q", "-2", "-k", "-s", "5000", "-p", "9", "-d", "18", "--flood", b.h2.String())
	if err != nil {
		return 0, err
	}
	if err := hp.Start(); err != nil {
		return 0, fmt.Errorf("hping3: %w", err)
	}
	time.Sleep(500 * time.Millisecond) // past the first packets' neighbour resolution
	before, err := rx()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	time.Sleep(3 * time.Second)
	after, err := rx()
	elapsed := time.Since(start)
	cancel()
	_ = hp.Wait()
	if err != nil {
		return 0, err
	}
	return float64(after-before) / elapsed.Seconds(), nil
}

// flood measures one established flow while hping3 floods spoofed SYNs from the inside, with a
// small unconfirmed table that the flood fills.
func (b *bench) flood(ctx context.Context, _ float64) (*Flood, error) {
	const unconfirmed = 4096
	f := &Flood{UnconfirmedTable: unconfirmed}
	// Restart conntrack with a small unconfirmed table.
	cfg := &conntrack.Config{}
	cfg.Table.Unconfirmed = unconfirmed
	stop, err := b.startFlowplane(cfg)
	if err != nil {
		return nil, err
	}
	defer stop()
	if f.BaselineGbps, err = b.tcp(ctx, 1); err != nil {
		return nil, err
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hp, err := b.l.Command(fctx, "h1", "hping3", "-q", "-S", "--flood", "--rand-source", "-p", "80", b.h2.String())
	if err != nil {
		return nil, err
	}
	if err := hp.Start(); err != nil {
		return nil, fmt.Errorf("hping3: %w", err)
	}
	time.Sleep(time.Second)
	type res struct {
		gbps float64
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		g, err := b.tcp(ctx, 1)
		ch <- res{g, err}
	}()
	// Watch the tables while the flow runs.
	var tb *conntrack.Tables
	if err := nsrun.Do(b.l.Netns("r1"), func() error {
		var err error
		tb, err = conntrack.OpenPinned()
		return err
	}); err != nil {
		return nil, err
	}
	defer tb.Close()
	f.EntryKept = true
	var r res
	for done := false; !done; {
		select {
		case r = <-ch:
			done = true
		case <-time.After(500 * time.Millisecond):
			es, err := tb.List()
			if err != nil {
				return nil, err
			}
			un, est := 0, 0
			for _, e := range es {
				if !e.Confirmed {
					un++
				} else if e.Proto == "tcp" && e.State == "ESTABLISHED" && e.Orig.Src == b.h1 {
					est++
				}
			}
			f.UnconfirmedPeak = max(f.UnconfirmedPeak, un)
			if est < 2 { // iperf3's control and data connections
				f.EntryKept = false
			}
		}
	}
	cancel()
	_ = hp.Wait()
	if r.err != nil {
		return nil, r.err
	}
	f.UnderFloodGbps = r.gbps
	f.Ratio = f.UnderFloodGbps / f.BaselineGbps
	return f, nil
}

func (b *bench) nsPerPacket() (time.Duration, time.Duration, error) {
	var per, base time.Duration
	err := nsrun.Do(b.l.Netns("r1"), func() error {
		in, err := net.InterfaceByName(b.dev["r1:in"])
		if err != nil {
			return err
		}
		out, err := net.InterfaceByName(b.dev["r1:out"])
		if err != nil {
			return err
		}
		per, base, err = conntrack.NsPerPacketWithBaseline(b.h1, b.h2, in.Index, out.Index, 50000)
		return err
	})
	return per, base, err
}

func printReport(r *Report) {
	k, n, f := r.Results["kernel"], r.Results["nftables"], r.Results["flowplane"]
	fmt.Printf("## conntrack benchmark (%s, %d CPUs, iperf3 %gs, median of %d interleaved rounds)\n\n", r.Kernel, r.CPUs, r.DurationS, rounds)
	fmt.Println("| test | kernel fwd | nftables ct | flowplane | flowplane / kernel | flowplane / nftables |")
	fmt.Println("|---|---|---|---|---|---|")
	row := func(name, unit string, kv, nv, fv float64) {
		fmt.Printf("| %s | %.3g %s | %.3g %s | %.3g %s | %.2f× | %.2f× |\n", name, kv, unit, nv, unit, fv, unit, fv/kv, fv/nv)
	}
	row("TCP iperf3, 1 flow", "Gbit/s", k.TCP1Gbps, n.TCP1Gbps, f.TCP1Gbps)
	row("TCP iperf3, 8 flows", "Gbit/s", k.TCP8Gbps, n.TCP8Gbps, f.TCP8Gbps)
	row("UDP 64 B forwarded", "pkt/s", k.UDP64pps, n.UDP64pps, f.UDP64pps)
	fmt.Printf("\nXDP cost, established TCP segment (BPF_PROG_TEST_RUN): %.0f ns/packet (an XDP_PASS-only program: %.0f ns)\n", r.NsPerPkt, r.NsPerPktNoop)
	if fl := r.Flood; fl != nil {
		fmt.Printf("\nSYN flood (hping3 --flood --rand-source from h1, unconfirmed table %d): 1 flow %.3g → %.3g Gbit/s (%.2f×), unconfirmed entries seen %d, established entries kept: %v\n",
			fl.UnconfirmedTable, fl.BaselineGbps, fl.UnderFloodGbps, fl.Ratio, fl.UnconfirmedPeak, fl.EntryKept)
	}
}

func median(rs []Result, f func(Result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return report.Median(v)
}
