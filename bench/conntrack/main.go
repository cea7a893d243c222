// Command conntrack benchmarks flowplane's conntrack (XDP, and tc with GRO on r1) against plain
// kernel forwarding and nftables over nf_conntrack, in one lab and one run: TCP iperf3 with 1
// and 8 flows, 64-byte UDP forwarding rate, XDP ns/packet for established traffic
// (BPF_PROG_TEST_RUN), and an established flow under a SYN flood that fills the unconfirmed
// table. The 64-byte traffic and the flood come from xdpgen (BPF_PROG_TEST_RUN live frames) and
// are counted by its XDP sink on h2. It prints markdown tables of ratios and writes
// bench/results/conntrack.json. Run as root: go run ./bench/conntrack (-modes flowplane-tc
// -rounds 1 for a quick check of one mode)
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/conntrack"
	"github.com/flowplane/flowplane/internal/conntrack/ctperf"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/xdpgen"
)

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
	rounds   = 5
	// kernel-gro is kernel forwarding with GRO on r1's veths (a veth's default is off, a NIC's
	// on): r1 then forwards 64 KB aggregates, which an XDP program never sees. flowplane-tc is
	// flowplane with --hook tc and GRO on r1's veths: its tcx program sees those aggregates.
	modes = []string{"kernel", "kernel-gro", "nftables", "flowplane", "flowplane-tc"}
	// -modes picks a subset for a quick check: it prints each mode's medians only (no ratios,
	// no SYN flood, no JSON).
	onlyModes  = flag.String("modes", "", "comma-separated subset of "+strings.Join(modes, ",")+" for a quick check (default: all, full report)")
	flagRounds = flag.Int("rounds", rounds, "interleaved rounds")
	onlyCost   = flag.Bool("cost", false, "measure only the per-packet cost against the floor program (seconds, not minutes)")
)

// The 64-byte test: one UDP flow h1:udpSport → h2:udpDport, established by one datagram each way,
// then xdpgen at full speed from h1 for udpSend; h2's sink counts what arrives.
const (
	udpSport, udpDport = 5000, 9
	udpSend            = 3 * time.Second
	udpWindow          = 2 * time.Second // forwarded rate: counted over this window inside udpSend
)

// The SYN flood: xdpgen SYNs from h1 to h2:floodPort from floodAddrs spoofed addresses of h1's
// subnet (198.18.0.100 on) × floodPorts source ports, so 240,000 tuples rotate through
// flowplane's unconfirmed table of floodTable entries (its default size): first floodFill SYNs at
// full speed, which fill it and start evicting, then floodRate per second, each evicting one
// entry (80,000 during a 4 s iperf3 run: more than the whole table). h2's sink drops them: no
// SYN-ACK or RST comes back (a RST would close the entries, a SYN-ACK confirm them) and r1 never
// needs ARP for the spoofed addresses.
const (
	floodTable  = 65536
	floodFill   = floodTable * 5 / 4
	floodRate   = 20000
	floodRounds = 5
	floodPort   = 80
	floodSport  = 2000
	floodPorts  = 60000
	floodAddrs  = 4
)

var floodSrc = netip.MustParseAddr("198.18.0.100")

// Result is one mode's measurements.
type Result struct {
	TCP1Gbps     float64 `json:"tcp_1_flow_gbps"`
	TCP8Gbps     float64 `json:"tcp_8_flows_gbps"`
	TCP1Retrans  float64 `json:"tcp_1_flow_retransmits"`
	TCP8Retrans  float64 `json:"tcp_8_flows_retransmits"`
	UDP64pps     float64 `json:"udp_64b_rx_pps"`
	UDP64Offered float64 `json:"udp_64b_offered_pps"`
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
	Cost         map[string]*Cost    `json:"cost_vs_floor"` // "ipv4", "ipv6"
	Flood        *Flood              `json:"syn_flood,omitempty"`
	Notes        []string            `json:"notes"`
}

// Cost is conntrack's XDP cost for an established TCP segment against the floor program's
// (bpf/conntrack/floor.bpf.c), BPF_PROG_TEST_RUN, medians over the measurements. The floor is
// what any stateful XDP forwarder must do for that segment and nothing else: conntrack's
// parsing, its canonical key (struct ct_key, 40 bytes for IPv4 and IPv6 alike), one lookup in a
// hash table of conntrack's size, key and value, and conntrack's forwarding (the route cached in
// the entry, TTL and MACs, bpf_redirect_map into a devmap). Conntrack keeps that key and that
// redirect, so the floor does too.
type Cost struct {
	ConntrackNs float64   `json:"conntrack_ns"`
	FloorNs     float64   `json:"floor_ns"`
	Ratio       float64   `json:"ratio"` // median of the per-measurement ratios
	Ratios      []float64 `json:"ratios"`
}

// Flood is the SYN-flood experiment (flowplane only): medians over the rounds, every round, and
// one run with the generator at full speed.
type Flood struct {
	RatePPS          float64      `json:"rate_pps"`
	UnconfirmedTable int          `json:"unconfirmed_table_size"`
	PrefillSYNs      int          `json:"prefill_syns"` // sent at full speed before the rate
	AloneGbps        float64      `json:"alone_gbps"`
	ControlGbps      float64      `json:"control_gbps"`
	FloodGbps        float64      `json:"under_flood_gbps"`
	Ratio            float64      `json:"ratio_vs_alone"`   // median of per-round flood/alone
	RatioControl     float64      `json:"ratio_vs_control"` // median of per-round flood/control
	ControlRatio     float64      `json:"control_vs_alone"` // median of per-round control/alone
	EntryKept        bool         `json:"established_entry_kept"`
	Rounds           []FloodRound `json:"rounds"`
	FullSpeed        *GenRun      `json:"full_speed"`
}

// FloodRound is one round: the flow alone, beside the same generator sending one fixed SYN
// (control), and beside the rotating flood.
type FloodRound struct {
	AloneGbps float64 `json:"alone_gbps"`
	Control   *GenRun `json:"control"`
	Flood     *GenRun `json:"flood"`
}

// GenRun is one iperf3 run beside a running generator.
type GenRun struct {
	Gbps              float64 `json:"gbps"`
	OfferedPPS        float64 `json:"offered_pps"`   // the generator's frames per second
	ForwardedPPS      float64 `json:"forwarded_pps"` // SYNs reaching h2 during the iperf3 run
	UnconfirmedBefore int     `json:"unconfirmed_entries_at_iperf_start"`
	UnconfirmedAfter  int     `json:"unconfirmed_entries_at_iperf_end"`
	NewEntries        uint64  `json:"new_entries_during_iperf"`
	Evicted           int64   `json:"evicted_during_iperf"` // new − growth of the table − confirmed
	Invalid           uint64  `json:"invalid_during_iperf"`
	EntryKept         bool    `json:"established_entry_kept"`
}

func main() {
	flag.Parse()
	rounds = *flagRounds
	if *onlyModes != "" {
		var sel []string
		for _, m := range strings.Split(*onlyModes, ",") {
			if !slices.Contains(modes, m) {
				fmt.Fprintf(os.Stderr, "unknown mode %q (known: %s)\n", m, strings.Join(modes, ", "))
				os.Exit(2)
			}
			sel = append(sel, m)
		}
		modes = sel
	}
	if rounds < 1 {
		fmt.Fprintln(os.Stderr, "-rounds: want at least 1")
		os.Exit(2)
	}
	// A lost terminal or output pipe (| head) stops the bench as ^C does, and it cleans up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("bench conntrack", "err", err)
		os.Exit(1)
	}
}

type bench struct {
	l        *lab.Lab
	h1, h2   netip.Addr
	h16, h26 netip.Addr        // IPv6
	dev      map[string]string // "h1", "h2", "r1:in", "r1:out"
	// The generator sends from h1's veth to r1's inside veth.
	h1Index        int
	h1MAC, r1InMAC net.HardwareAddr
}

func run(ctx context.Context) error {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "cb" + hex.EncodeToString(b)
	top, err := lab.Parse("bench-conntrack.yaml", []byte(lab.XDPRouter), name)
	if err != nil {
		return err
	}
	l, err := lab.Up("bench-conntrack.yaml", []byte(lab.XDPRouter), top)
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
			bn.h1, bn.h16 = n.Ifaces[0].IPv4.Addr(), n.Ifaces[0].IPv6.Addr()
		}
		if x.key == "h2" {
			bn.h2, bn.h26 = n.Ifaces[0].IPv4.Addr(), n.Ifaces[0].IPv6.Addr()
		}
	}
	// r1 is marked xdp: the lab gives the hosts' veths the same settings in every mode, NAPI
	// (needed to receive XDP redirects) and full checksums (redirected frames lose
	// CHECKSUM_PARTIAL).
	if out, err := bn.cmd(ctx, "h1", "ping", "-c", "2", "-W", "2", bn.h2.String()); err != nil {
		return fmt.Errorf("lab does not forward: %v: %s", err, out)
	}
	for _, x := range []struct {
		node, dev string
		mac       *net.HardwareAddr
		index     *int
	}{{"h1", bn.dev["h1"], &bn.h1MAC, &bn.h1Index}, {"r1", bn.dev["r1:in"], &bn.r1InMAC, new(int)}} {
		if err := nsrun.Do(l.Netns(x.node), func() error {
			ifc, err := net.InterfaceByName(x.dev)
			if err != nil {
				return err
			}
			*x.mac, *x.index = ifc.HardwareAddr, ifc.Index
			return nil
		}); err != nil {
			return fmt.Errorf("interface %s: %w", x.dev, err)
		}
	}
	rep := &Report{Date: time.Now().UTC(), CPUs: numCPU(), DurationS: duration.Seconds(), Results: map[string]*Result{}}
	if u, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		rep.Kernel = strings.TrimSpace(string(u))
	}
	if *onlyCost {
		if rep.Cost, err = bn.cost(ctx); err != nil {
			return err
		}
		costTable(rep).Markdown(os.Stdout)
		return nil
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
			if r.TCP1Gbps, r.TCP1Retrans, err = bn.tcp(ctx, 1); err == nil {
				if r.TCP8Gbps, r.TCP8Retrans, err = bn.tcp(ctx, 8); err == nil {
					r.UDP64pps, r.UDP64Offered, err = bn.udp64(ctx)
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
			TCP1Gbps:     median(samples[m], func(r Result) float64 { return r.TCP1Gbps }),
			TCP8Gbps:     median(samples[m], func(r Result) float64 { return r.TCP8Gbps }),
			TCP1Retrans:  median(samples[m], func(r Result) float64 { return r.TCP1Retrans }),
			TCP8Retrans:  median(samples[m], func(r Result) float64 { return r.TCP8Retrans }),
			UDP64pps:     median(samples[m], func(r Result) float64 { return r.UDP64pps }),
			UDP64Offered: median(samples[m], func(r Result) float64 { return r.UDP64Offered }),
		}
	}
	if *onlyModes != "" {
		printQuick(rep)
		return nil
	}
	if rep.Flood, err = bn.flood(ctx); err != nil {
		return fmt.Errorf("syn flood: %w", err)
	}
	ns, base, err := bn.nsPerPacket()
	if err != nil {
		return err
	}
	rep.NsPerPkt, rep.NsPerPktNoop = float64(ns.Nanoseconds()), float64(base.Nanoseconds())
	if rep.Cost, err = bn.cost(ctx); err != nil {
		return err
	}
	rep.Notes = []string{
		"veth lab on one host: all modes share the same CPUs with iperf3 itself",
		"hosts run with GRO on and tx checksum offload off in every mode (needed for XDP redirect into veth; r1 is marked xdp: true in the lab)",
		"flowplane-tc: flowplane with --hook tc (tcx ingress) and GRO on both of r1's veths, as kernel-gro: the program runs on the skb after GRO and forwards the aggregates with bpf_redirect",
		"kernel-gro: kernel forwarding with GRO on both of r1's veths (a veth's default is off, a NIC's on): r1 forwards GRO aggregates of up to 64 KB, one route lookup and one qdisc pass each; an XDP program runs before GRO and handles every segment",
		"iperf3 client pinned to CPU 0 and server to CPU 1 in every mode (-A); ratios are medians of the ratios within each round",
		"udp_64b_rx_pps: one UDP flow of 64-byte frames (60 + FCS), made established by one datagram each way, sent by xdpgen (BPF_PROG_TEST_RUN live frames, one thread, full speed) from h1 for 3 s; frames per second counted at h2 by an XDP sink (count and drop) over the middle 2 s; the same in all modes",
		"udp_64b_offered_pps: frames the generator put into h1's veth per second, over the same window; on veth the receiving side's NAPI (r1, then h2) runs on the sender's CPU, so the offered rate falls with the router's cost: both rates measure the whole path on one CPU",
		"r1's inside veth gets GRO on during the 64-byte test in every mode: frames XDP-redirected into a veth reach the peer only through its NAPI (flowplane's XDP program provides one anyway)",
		"syn_flood: flowplane only, default tables; xdpgen SYNs from h1, rotating 60,000 source ports x 4 spoofed source addresses of h1's subnet, first 81,920 at full speed (fill), then at a fixed rate; dropped at h2 by an XDP sink so nothing answers; control: the same generator, fill, rate and sink with one fixed tuple (every SYN a retransmission for one entry): the same CPU spent on generating, forwarding and sinking, without table churn; ratios paired per round",
	}
	data, err := asMap(rep)
	if err != nil {
		return err
	}
	return report.Save(report.Result{Name: "conntrack", Tables: tables(rep), Data: data})
}

// asMap is v's JSON object as a map (the result file's data).
func asMap(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m)
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
	case "kernel-gro":
		return b.gro(ctx, b.dev["r1:in"], b.dev["r1:out"])
	case "flowplane-tc":
		undo, err := b.gro(ctx, b.dev["r1:in"], b.dev["r1:out"])
		if err != nil {
			return nil, err
		}
		stop, err := b.startFlowplane(&conntrack.Config{Hook: conntrack.HookTC})
		if err != nil {
			undo()
			return nil, err
		}
		return func() { stop(); undo() }, nil
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
		return b.startFlowplane(&conntrack.Config{Hook: conntrack.HookXDP})
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
			BPS   float64 `json:"bits_per_second"`
			Bytes uint64  `json:"bytes"`
		} `json:"sum_received"`
		SumSent struct {
			Retransmits int `json:"retransmits"`
		} `json:"sum_sent"`
		Sum struct {
			Packets     int     `json:"packets"`
			LostPackets int     `json:"lost_packets"`
			Seconds     float64 `json:"seconds"`
		} `json:"sum"`
	} `json:"end"`
	Error string `json:"error"`
}

var port = 6000

// nextPort is the server port of the next iperf3 test.
func nextPort() int {
	port++
	return port
}

// iperfAffinity pins an iperf3 end to cpu when there are two CPUs or more: the client on 0,
// the server on 1, in every mode. Unpinned, the scheduler sometimes puts both on one CPU and a
// run's throughput moves by a third; pinned, every mode sees the same placement (on veth the
// receive work of r1 and h2 runs in softirq on the sender's CPU either way).
func iperfAffinity(cpu int) []string {
	if numCPU() < 2 {
		return nil
	}
	return []string{"-A", strconv.Itoa(cpu)}
}

// iperf runs one iperf3 test h1 → h2.
func (b *bench) iperf(ctx context.Context, args ...string) (*iperfOut, error) {
	return b.iperfOn(ctx, nextPort(), args...)
}

// iperfOn runs one iperf3 test h1 → h2 with the server on port.
func (b *bench) iperfOn(ctx context.Context, port int, args ...string) (*iperfOut, error) {
	p := fmt.Sprint(port)
	srv, err := b.l.Command(ctx, "h2", "iperf3", append([]string{"-s", "-1", "-p", p}, iperfAffinity(1)...)...)
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
	cargs := append([]string{"-c", b.h2.String(), "-p", p, "-J", "-t", fmt.Sprint(int(duration.Seconds()))}, iperfAffinity(0)...)
	out, err := b.cmd(ctx, "h1", "iperf3", append(cargs, args...)...)
	var r iperfOut
	if jerr := json.Unmarshal([]byte(out), &r); jerr != nil {
		return nil, fmt.Errorf("iperf3 %v: %v: %s", args, err, out)
	}
	if r.Error != "" {
		return nil, fmt.Errorf("iperf3 %v: %s", args, r.Error)
	}
	return &r, nil
}

// tcp runs iperf3 with flows streams: Gbit/s received and segments retransmitted.
func (b *bench) tcp(ctx context.Context, flows int) (float64, float64, error) {
	r, err := b.iperf(ctx, "-P", fmt.Sprint(flows))
	if err != nil {
		return 0, 0, err
	}
	return r.End.SumReceived.BPS / 1e9, float64(r.End.SumSent.Retransmits), nil
}

// frame builds a frame from h1 as it leaves h1's veth for r1.
func (b *bench) frame(src netip.Addr) *packet.Builder {
	return packet.IP(src.String(), b.h2.String()).MAC(b.h1MAC, b.r1InMAC)
}

// gro switches GRO on for those of r1's veths devs that have it off and returns how to put
// them back. GRO gives a veth its NAPI, through which alone a frame XDP-redirected into its
// peer is received (an XDP program on it gives one too), and makes r1 forward aggregates.
func (b *bench) gro(ctx context.Context, devs ...string) (func(), error) {
	var on []string
	undo := func() {
		for _, dev := range on {
			if out, err := b.cmd(context.Background(), "r1", "ethtool", "-K", dev, "gro", "off"); err != nil {
				slog.Warn("ethtool gro off", "dev", dev, "err", err, "out", out)
			}
		}
	}
	for _, dev := range devs {
		out, err := b.cmd(ctx, "r1", "ethtool", "-k", dev)
		if err == nil && strings.Contains(out, "generic-receive-offload: on") {
			continue
		}
		if err == nil {
			out, err = b.cmd(ctx, "r1", "ethtool", "-K", dev, "gro", "on")
		}
		if err != nil {
			undo()
			return nil, fmt.Errorf("ethtool %s: %v: %s", dev, err, out)
		}
		on = append(on, dev)
	}
	return undo, nil
}

// sink attaches xdpgen's counting sink to h2's veth for TCP or UDP to port.
func (b *bench) sink(proto uint8, port uint16) (*xdpgen.Sink, error) {
	return xdpgen.AttachSink(xdpgen.SinkConfig{Netns: b.l.Netns("h2"), Ifname: b.dev["h2"], Proto: proto, Port: port})
}

// udpHello sends one datagram h1:udpSport → h2:udpDport and one back, so that both trackers
// hold the flow as established (nf: ESTABLISHED; flowplane: confirmed, route cached). The first
// is dropped by h2's sink after r1 has seen it; h1 must receive the answer.
func (b *bench) udpHello() error {
	var h1c *net.UDPConn
	if err := nsrun.Do(b.l.Netns("h1"), func() error {
		var err error
		h1c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: b.h1.AsSlice(), Port: udpSport})
		return err
	}); err != nil {
		return fmt.Errorf("udp socket on h1: %w", err)
	}
	defer h1c.Close()
	if _, err := h1c.WriteToUDP([]byte("hello"), &net.UDPAddr{IP: b.h2.AsSlice(), Port: udpDport}); err != nil {
		return fmt.Errorf("udp h1 → h2: %w", err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := nsrun.Do(b.l.Netns("h2"), func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: b.h2.AsSlice(), Port: udpDport}, &net.UDPAddr{IP: b.h1.AsSlice(), Port: udpSport})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("hello"))
		return err
	}); err != nil {
		return fmt.Errorf("udp h2 → h1: %w", err)
	}
	_ = h1c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, _, err := h1c.ReadFromUDP(make([]byte, 64)); err != nil {
		return fmt.Errorf("udp reply h2 → h1 did not arrive: %w", err)
	}
	return nil
}

// udp64 sends 64-byte frames (60 + FCS) of one established UDP flow from h1 with xdpgen at full
// speed and returns the rate at which they arrive at h2 and the rate the generator sent them at,
// both over udpWindow in the middle of the run (the generator's count lags by up to one kernel
// call, ~20 ms, at both ends of the window).
func (b *bench) udp64(ctx context.Context) (forwarded, offered float64, err error) {
	restore, err := b.gro(ctx, b.dev["r1:in"])
	if err != nil {
		return 0, 0, err
	}
	defer restore()
	sink, err := b.sink(17, udpDport)
	if err != nil {
		return 0, 0, err
	}
	defer sink.Close()
	if err := b.udpHello(); err != nil {
		return 0, 0, err
	}
	// 18 bytes of data: 14 + 20 + 8 + 18 = 60-byte frames.
	frame := b.frame(b.h1).UDP(udpSport, udpDport).Payload(make([]byte, 18)).Bytes()
	done := make(chan error, 1)
	var progress atomic.Uint64
	go func() {
		_, err := xdpgen.Send(ctx, xdpgen.Config{Netns: b.l.Netns("h1"), Ifindex: b.h1Index, Frame: frame, Duration: udpSend, Progress: &progress})
		done <- err
	}()
	time.Sleep((udpSend - udpWindow) / 2)
	c0, err0 := sink.Count()
	p0, t0 := progress.Load(), time.Now()
	time.Sleep(udpWindow)
	c1, err1 := sink.Count()
	p1, window := progress.Load(), time.Since(t0)
	if err := errors.Join(<-done, err0, err1); err != nil {
		return 0, 0, err
	}
	return float64(c1-c0) / window.Seconds(), float64(p1-p0) / window.Seconds(), nil
}

// sinkCount reads a sink's count; a failed read (it cannot fail while the sink is attached) shows
// as a zero rate in the table rather than ending the benchmark.
func sinkCount(s *xdpgen.Sink) uint64 {
	n, err := s.Count()
	if err != nil {
		slog.Warn("sink count", "err", err)
	}
	return n
}

// flood measures one established iperf3 flow through flowplane (default tables) alone, beside
// the generator sending one fixed SYN at floodRate (control), and beside the rotating SYN flood
// at floodRate, in rounds; then once beside the flood at the generator's full speed.
func (b *bench) flood(ctx context.Context) (*Flood, error) {
	var cfg conntrack.Config
	cfg.Table.Unconfirmed = floodTable
	stop, err := b.startFlowplane(&cfg)
	if err != nil {
		return nil, err
	}
	defer stop()
	sink, err := b.sink(6, floodPort)
	if err != nil {
		return nil, err
	}
	defer sink.Close()
	var tb *conntrack.Tables
	if err := nsrun.Do(b.l.Netns("r1"), func() error {
		var err error
		tb, err = conntrack.OpenPinned()
		return err
	}); err != nil {
		return nil, err
	}
	defer tb.Close()
	f := &Flood{RatePPS: floodRate, UnconfirmedTable: floodTable, PrefillSYNs: floodFill, EntryKept: true}
	// Each round measures the three in a rotated order, each from empty tables; the ratios are
	// paired per round (drift from the machine's other load cancels), the figures are medians.
	for round := 0; round < floodRounds; round++ {
		slog.Info("measuring", "round", round+1, "test", "syn flood")
		var fr FloodRound
		for i := 0; i < 3; i++ {
			if _, err := tb.Flush(); err != nil {
				return nil, err
			}
			switch (round + i) % 3 {
			case 0:
				r, err := b.iperf(ctx, "-P", "1")
				if err != nil {
					return nil, err
				}
				fr.AloneGbps = r.End.SumReceived.BPS / 1e9
			case 1:
				if fr.Control, err = b.besideGenerator(ctx, tb, sink, floodRate, false); err != nil {
					return nil, fmt.Errorf("control: %w", err)
				}
			case 2:
				if fr.Flood, err = b.besideGenerator(ctx, tb, sink, floodRate, true); err != nil {
					return nil, fmt.Errorf("flood: %w", err)
				}
			}
		}
		f.EntryKept = f.EntryKept && fr.Control.EntryKept && fr.Flood.EntryKept
		f.Rounds = append(f.Rounds, fr)
	}
	med := func(g func(FloodRound) float64) float64 {
		v := make([]float64, len(f.Rounds))
		for i, r := range f.Rounds {
			v[i] = g(r)
		}
		return report.Median(v)
	}
	f.AloneGbps = med(func(r FloodRound) float64 { return r.AloneGbps })
	f.ControlGbps = med(func(r FloodRound) float64 { return r.Control.Gbps })
	f.FloodGbps = med(func(r FloodRound) float64 { return r.Flood.Gbps })
	f.Ratio = med(func(r FloodRound) float64 { return r.Flood.Gbps / r.AloneGbps })
	f.RatioControl = med(func(r FloodRound) float64 { return r.Flood.Gbps / r.Control.Gbps })
	f.ControlRatio = med(func(r FloodRound) float64 { return r.Control.Gbps / r.AloneGbps })
	if _, err := tb.Flush(); err != nil {
		return nil, err
	}
	slog.Info("measuring", "test", "syn flood at full generator speed")
	if f.FullSpeed, err = b.besideGenerator(ctx, tb, sink, 0, true); err != nil {
		return nil, fmt.Errorf("full-speed flood: %w", err)
	}
	f.EntryKept = f.EntryKept && f.FullSpeed.EntryKept
	return f, nil
}

// besideGenerator runs one iperf3 flow while xdpgen sends SYNs from h1 at rate (0: full speed),
// rotating tuples or always the same one, and reads the tables around the flow: how full the
// unconfirmed table was, how many entries the flood created and evicted, and whether the flow's
// own entries lived through it.
func (b *bench) besideGenerator(ctx context.Context, tb *conntrack.Tables, sink *xdpgen.Sink, rate float64, rotate bool) (*GenRun, error) {
	cfg := xdpgen.Config{Netns: b.l.Netns("h1"), Ifindex: b.h1Index, Rate: rate,
		Frame: b.frame(floodSrc).TCP(floodSport, floodPort, "S").Seq(1).MSS(1460).Bytes()}
	if rotate {
		cfg.SrcPorts, cfg.SrcAddrs = floodPorts, floodAddrs
	}
	var progress atomic.Uint64
	cfg.Progress = &progress
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// At a rate, the generator first sends floodFill SYNs at full speed (the table fills and
	// starts evicting within a fraction of a second), then goes on at the rate from where the
	// fill ended. The control does the same with its one tuple.
	filled, done := make(chan struct{}), make(chan error, 1)
	go func(cfg xdpgen.Config) {
		var err error
		if cfg.Rate > 0 {
			fill := cfg
			fill.Rate, fill.Count, fill.Progress = 0, floodFill, nil
			cfg.First, err = xdpgen.Send(gctx, fill)
		}
		close(filled)
		if err == nil {
			_, err = xdpgen.Send(gctx, cfg)
		}
		done <- err
	}(cfg)
	stopGen := func() error {
		cancel()
		err := <-done
		if errors.Is(err, context.Canceled) && ctx.Err() == nil {
			err = nil
		}
		return err
	}
	// One second at the rate (or at full speed) before the flow starts.
	<-filled
	select {
	case <-time.After(time.Second):
	case err := <-done:
		return nil, fmt.Errorf("generator stopped: %v", err)
	}
	g := &GenRun{}
	c0, err := tb.ReadCounters()
	if err != nil {
		_ = stopGen()
		return nil, err
	}
	_, g.UnconfirmedBefore, err = tb.Count()
	if err != nil {
		_ = stopGen()
		return nil, err
	}
	// The flow's entries are read every half second (the confirmed table only: listing the
	// full unconfirmed one would take CPU from the flow) and once more at the end: each must stay
	// there with a byte count that only grows, and the data connection's must have counted at
	// least every byte h2 received (an entry lost and picked up again would start from zero).
	p := nextPort()
	type result struct {
		r   *iperfOut
		err error
	}
	res := make(chan result, 1)
	s0, p0, t0 := sinkCount(sink), progress.Load(), time.Now()
	go func() {
		r, err := b.iperfOn(ctx, p, "-P", "1")
		res <- result{r, err}
	}()
	seen, lost := map[uint16]uint64{}, false
	look := func() error {
		es, err := tb.ListConfirmed()
		if err != nil {
			return err
		}
		now := map[uint16]uint64{}
		for _, e := range es {
			if e.Proto == "tcp" && e.Orig.Src == b.h1 && e.Orig.Dst == b.h2 && int(e.Orig.Dport) == p {
				now[e.Orig.Sport] = e.Bytes[0]
			}
		}
		for sport, n := range seen {
			if m, ok := now[sport]; !ok || m < n {
				lost = true
			}
		}
		maps.Copy(seen, now)
		return nil
	}
	var r result
	for finished := false; !finished; {
		select {
		case r = <-res:
			finished = true
		case <-time.After(500 * time.Millisecond):
			if err := look(); err != nil {
				_ = stopGen()
				return nil, err
			}
		}
	}
	s1, p1, el := sinkCount(sink), progress.Load(), time.Since(t0)
	c1, cerr := tb.ReadCounters()
	lerr := look()
	_, un1, uerr := tb.Count()
	if err := errors.Join(r.err, cerr, lerr, uerr, stopGen()); err != nil {
		return nil, err
	}
	g.Gbps = r.r.End.SumReceived.BPS / 1e9
	g.OfferedPPS = float64(p1-p0) / el.Seconds()
	g.ForwardedPPS = float64(s1-s0) / el.Seconds()
	g.NewEntries = c1["new"] - c0["new"]
	g.UnconfirmedAfter = un1
	for _, n := range conntrack.StatNames {
		if strings.HasPrefix(n, "invalid_") {
			g.Invalid += c1[n] - c0[n]
		}
	}
	data := uint64(0)
	for _, n := range seen {
		data = max(data, n)
	}
	g.EntryKept = !lost && data >= r.r.End.SumReceived.Bytes
	g.Evicted = int64(g.NewEntries) - int64(g.UnconfirmedAfter-g.UnconfirmedBefore) - int64(c1["established"]-c0["established"])
	return g, nil
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
		per, base, err = ctperf.NsPerPacketWithBaseline(b.h1, b.h2, in.Index, out.Index, 50000)
		return err
	})
	return per, base, err
}

// cost measures conntrack against the floor program, IPv4 and IPv6, costRuns times each
// (families alternating), on r1 of the lab: neighbours resolved first.
func (b *bench) cost(ctx context.Context) (map[string]*Cost, error) {
	for _, a := range []string{b.h1.String(), b.h2.String(), b.h16.String(), b.h26.String()} {
		cmd, err := b.l.Command(ctx, "r1", "ping", "-c", "1", "-W", "2", a)
		if err != nil {
			return nil, err
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ping %s from r1: %w\n%s", a, err, out)
		}
	}
	const costRuns = 9
	type sample struct{ ct, fl, ratio []float64 }
	fams := []struct {
		name           string
		client, server netip.Addr
	}{{"ipv4", b.h1, b.h2}, {"ipv6", b.h16, b.h26}}
	got := map[string]*sample{"ipv4": {}, "ipv6": {}}
	err := nsrun.Do(b.l.Netns("r1"), func() error {
		in, err := net.InterfaceByName(b.dev["r1:in"])
		if err != nil {
			return err
		}
		out, err := net.InterfaceByName(b.dev["r1:out"])
		if err != nil {
			return err
		}
		for range costRuns {
			for _, f := range fams {
				c, err := ctperf.Measure(f.client, f.server, in.Index, out.Index, 20000)
				if err != nil {
					return fmt.Errorf("%s: %w", f.name, err)
				}
				s := got[f.name]
				s.ct, s.fl, s.ratio = append(s.ct, float64(c.Conntrack.Nanoseconds())), append(s.fl, float64(c.Floor.Nanoseconds())), append(s.ratio, c.Ratio())
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cost: %w", err)
	}
	res := map[string]*Cost{}
	for n, s := range got {
		res[n] = &Cost{ConntrackNs: report.Median(s.ct), FloorNs: report.Median(s.fl), Ratio: report.Median(s.ratio), Ratios: s.ratio}
	}
	return res, nil
}

// costTable is conntrack's XDP cost against the floor's, per family.
func costTable(r *Report) *report.Table {
	t := &report.Table{
		Title:   "conntrack: XDP cost of an established TCP segment against the floor (BPF_PROG_TEST_RUN, 1400-byte segment, median of 9 measurements of alternating 250-run batches)",
		Columns: []string{"family", "conntrack", "floor (parse + key + 1 lookup + redirect)", "conntrack / floor", "ratio min–max"},
	}
	for _, n := range []string{"ipv4", "ipv6"} {
		c := r.Cost[n]
		if c == nil {
			continue
		}
		t.Add(n, fmt.Sprintf("%.0f ns", c.ConntrackNs), fmt.Sprintf("%.0f ns", c.FloorNs), fmt.Sprintf("%.2f×", c.Ratio), report.Range("%.2f×", c.Ratios))
		t.Goal(report.AtMost("conntrack / floor", c.Ratio, 1.5))
	}
	return t
}

// tables are the full run's tables: forwarding in every mode, the XDP cost, the SYN flood.
func tables(r *Report) []*report.Table {
	k, g, n, f, tc := r.Results["kernel"], r.Results["kernel-gro"], r.Results["nftables"], r.Results["flowplane"], r.Results["flowplane-tc"]
	t := &report.Table{
		Title: fmt.Sprintf("conntrack: forwarding through r1 in five modes (iperf3 %gs, median of %d interleaved rounds)", r.DurationS, rounds),
		Columns: []string{"test", "kernel fwd", "kernel fwd, GRO on r1", "nftables ct", "flowplane", "flowplane / kernel", "flowplane / kernel with GRO", "flowplane / nftables",
			"flowplane tc, GRO on r1", "flowplane tc / kernel", "flowplane tc / kernel with GRO"},
		Notes: []string{
			"Throughputs are medians over the rounds; ratios are medians of the ratios within each round (the modes of a round run back to back, so slow changes in the shared machine's load cancel), min–max over the rounds in brackets.",
			"The generator runs on one thread of h1; on veth, r1's and h2's receive work runs on the same CPU, so both rates measure the whole path and the offered rate falls with the router's cost.",
		},
	}
	// row adds one measurement; its ratios are the medians of the per-round ratios, and it
	// returns flowplane's ratios to kernel and to nftables.
	row := func(name, unit string, m func(Result) float64) (vsKernel, vsNft float64) {
		var vk, vg, vn, tk, tg []float64
		for i, fs := range r.Samples["flowplane"] {
			ts := r.Samples["flowplane-tc"][i]
			vk, vg, vn = append(vk, m(fs)/m(r.Samples["kernel"][i])), append(vg, m(fs)/m(r.Samples["kernel-gro"][i])), append(vn, m(fs)/m(r.Samples["nftables"][i]))
			tk, tg = append(tk, m(ts)/m(r.Samples["kernel"][i])), append(tg, m(ts)/m(r.Samples["kernel-gro"][i]))
		}
		val := func(x Result) string { return fmt.Sprintf("%.3g %s", m(x), unit) }
		rat := func(xs []float64) string {
			return fmt.Sprintf("%.2f× (%s)", report.Median(xs), report.Range("%.2f", xs))
		}
		t.Add(name, val(*k), val(*g), val(*n), val(*f), rat(vk), rat(vg), rat(vn), val(*tc), rat(tk), rat(tg))
		return report.Median(vk), report.Median(vn)
	}
	for _, flows := range []struct {
		name string
		m    func(Result) float64
	}{{"TCP iperf3, 1 flow", func(r Result) float64 { return r.TCP1Gbps }}, {"TCP iperf3, 8 flows", func(r Result) float64 { return r.TCP8Gbps }}} {
		vk, vn := row(flows.name, "Gbit/s", flows.m)
		// TCP at least as fast as kernel forwarding, and 1.2× nftables.
		t.Goal(report.AtLeast("flowplane / kernel", vk, 1), report.AtLeast("flowplane / nftables", vn, 1.2))
	}
	_, vn := row("UDP 64 B forwarded (xdpgen, 1 established flow)", "pkt/s", func(r Result) float64 { return r.UDP64pps })
	t.Goal(report.AtLeast("flowplane / nftables", vn, 2))
	row("UDP 64 B offered by xdpgen (same runs)", "pkt/s", func(r Result) float64 { return r.UDP64Offered })
	t.Add("TCP retransmissions (iperf3), 1 / 8 flows", fmt.Sprintf("%.0f / %.0f", k.TCP1Retrans, k.TCP8Retrans), fmt.Sprintf("%.0f / %.0f", g.TCP1Retrans, g.TCP8Retrans),
		fmt.Sprintf("%.0f / %.0f", n.TCP1Retrans, n.TCP8Retrans), fmt.Sprintf("%.0f / %.0f", f.TCP1Retrans, f.TCP8Retrans), "", "", "", fmt.Sprintf("%.0f / %.0f", tc.TCP1Retrans, tc.TCP8Retrans), "", "")
	ns := &report.Table{
		Title:   "conntrack: XDP cost of an established TCP segment (BPF_PROG_TEST_RUN)",
		Columns: []string{"program", "ns/packet"},
	}
	ns.Add("conntrack", fmt.Sprintf("%.0f", r.NsPerPkt))
	ns.Add("a program that only returns XDP_PASS", fmt.Sprintf("%.0f", r.NsPerPktNoop))
	out := []*report.Table{t, ns, costTable(r)}
	fl := r.Flood
	if fl == nil {
		return out
	}
	ft := &report.Table{
		Title: fmt.Sprintf("conntrack: SYN flood, flowplane, one iperf3 flow, unconfirmed table %d, %d rounds", fl.UnconfirmedTable, len(fl.Rounds)),
		Columns: []string{"run", "iperf3 1 flow", "vs alone", "vs control", "SYNs offered/s", "SYNs at h2/s", "unconfirmed entries (iperf3 start → end)",
			"new entries", "evicted", "flow's entry kept"},
	}
	last := fl.Rounds[len(fl.Rounds)-1]
	ft.Add("alone", fmt.Sprintf("%.3g Gbit/s", fl.AloneGbps), "1.00×", "", "", "", "", "", "", "")
	gen := func(name string, gbps float64, vsAlone, vsControl string, g *GenRun) {
		ft.Add(name, fmt.Sprintf("%.3g Gbit/s", gbps), vsAlone, vsControl, fmt.Sprintf("%.3g", g.OfferedPPS), fmt.Sprintf("%.3g", g.ForwardedPPS),
			fmt.Sprintf("%d → %d", g.UnconfirmedBefore, g.UnconfirmedAfter), g.NewEntries, g.Evicted, g.EntryKept)
	}
	var alone, control []float64
	for _, r := range fl.Rounds {
		alone, control = append(alone, r.Flood.Gbps/r.AloneGbps), append(control, r.Flood.Gbps/r.Control.Gbps)
	}
	gen(fmt.Sprintf("control: one fixed SYN at %.0f/s", fl.RatePPS), fl.ControlGbps, fmt.Sprintf("%.2f×", fl.ControlRatio), "1.00×", last.Control)
	gen(fmt.Sprintf("flood: rotating SYNs at %.0f/s", fl.RatePPS), fl.FloodGbps, fmt.Sprintf("%.2f× (%s)", fl.Ratio, report.Range("%.2f", alone)),
		fmt.Sprintf("%.2f× (%s)", fl.RatioControl, report.Range("%.2f", control)), last.Flood)
	// The flood neither costs the established flow more than 10 % nor evicts its entry.
	ft.Goal(report.AtLeast("vs alone", fl.Ratio, 0.9), report.Check("established entries", "kept in every run", fl.EntryKept))
	gen("flood at full generator speed (one run)", fl.FullSpeed.Gbps, fmt.Sprintf("%.2f×", fl.FullSpeed.Gbps/fl.AloneGbps), "", fl.FullSpeed)
	ft.Notes = append(ft.Notes, fmt.Sprintf("Throughputs are medians over the rounds, ratios medians of the ratios within each round (min–max in brackets); the other columns are from the last round. "+
		"The generator first sends %d SYNs at full speed (the table fills and starts evicting), then %.0f/s, each evicting one entry; iperf3 starts 1 s later. "+
		"Control: the same generator, rate and sink with one fixed tuple (each SYN a retransmission for one entry): the CPU the generator, the forwarding and the sink take on the two shared CPUs, without table churn. "+
		"flood/control isolates the churn; flood/alone includes that CPU. "+
		"At full speed the generator takes a whole CPU of the two and offers more than r1 drains: the veth ring into r1 overflows (offered ≫ at h2) and the flow's packets compete with the SYNs for it. "+
		"Established entries kept in every run, the full-speed one included: %v.",
		fl.PrefillSYNs, fl.RatePPS, fl.EntryKept))
	return append(out, ft)
}

// printQuick prints the medians of the -modes subset, without ratios.
func printQuick(r *Report) {
	fmt.Printf("## conntrack quick check (%s, %d CPUs, iperf3 %gs, median of %d rounds; modes %s)\n\n", r.Kernel, r.CPUs, r.DurationS, rounds, strings.Join(modes, ", "))
	fmt.Println("| mode | TCP 1 flow Gbit/s | TCP 8 flows Gbit/s | UDP 64 B forwarded pkt/s | UDP 64 B offered pkt/s | retransmits 1 / 8 flows |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, m := range modes {
		x := r.Results[m]
		fmt.Printf("| %s | %.3g | %.3g | %.3g | %.3g | %.0f / %.0f |\n", m, x.TCP1Gbps, x.TCP8Gbps, x.UDP64pps, x.UDP64Offered, x.TCP1Retrans, x.TCP8Retrans)
	}
}

func median(rs []Result, f func(Result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return report.Median(v)
}
