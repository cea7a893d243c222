// Command altmark-mark benchmarks the altmark marker's cost per packet with BPF_PROG_TEST_RUN,
// per carrier, against an empty tcx program (return TCX_NEXT) measured in the same run. Two
// measures: the kernel's mean over a repeated run of one packet (the program sees the packet
// the previous run left, so an inserted AltMark header is updated in place from the second run
// on: that row is left out), and the median of single runs on a fresh packet each (which
// includes the test-run harness's per-run overhead, the same for the baseline). Prints markdown
// tables and writes bench/results/altmark-mark.json. Run as root: go run ./bench/altmark-mark
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/altmark"
	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/progrun"
)

var (
	repeat = flag.Int("repeat", 200000, "runs of one repeated BPF_PROG_TEST_RUN")
	single = flag.Int("single", 3000, "single runs (fresh packet each) per case and round")
	rounds = flag.Int("rounds", 5, "interleaved rounds; medians are reported")
)

type bcase struct {
	name, cfg string
	pkt       []byte
	grows     bool // the packet grows: no repeated measure
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		slog.Error("altmark-mark bench", "err", err)
		os.Exit(1)
	}
}

func run() error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return err
	}
	payload := make([]byte, 100)
	tcp4 := packet.IP("198.18.0.1", "198.18.1.2").TCP(40000, 80, "A").Payload(payload).Bytes()
	tcp6 := packet.IP("fd00::1", "fd00:0:0:1::2").TCP(40000, 80, "A").Payload(payload).Bytes()
	opt := []byte{0x12, 4, 0, 0, 0, 0}
	tcp6opt := packet.IP("fd00::1", "fd00:0:0:1::2").IPv6Ext(60, opt).TCP(40000, 80, "A").Payload(payload).Bytes()
	cases := []bcase{
		{"empty tcx program (baseline)", "", tcp4, false},
		{"dscp, IPv4 TCP", "carrier: dscp\n", tcp4, false},
		{"dscp, IPv6 TCP", "carrier: dscp\n", tcp6, false},
		{"dscp + double marking (per-flow state), IPv4 TCP", "carrier: dscp\ndouble: {packets: 4}\n", tcp4, false},
		{"ipv4-flag, IPv4 TCP", "carrier: ipv4-flag\n", tcp4, false},
		{"ipv4-flag with 1 backbone prefix, IPv4 TCP", "carrier: ipv4-flag\nbackbone: [198.18.255.0/24]\n", tcp4, false},
		{"ipv6-altmark insert, fixed FlowMonID", "carrier: ipv6-altmark\nflowmon_id: 7\nmtu: 1500\n", tcp6, true},
		{"ipv6-altmark insert, per-flow FlowMonID + double", "carrier: ipv6-altmark\ndouble: {packets: 4}\nmtu: 1500\n", tcp6, true},
		{"ipv6-altmark update in place, fixed FlowMonID", "carrier: ipv6-altmark\nflowmon_id: 7\n", tcp6opt, false},
		{"ipv6-altmark, not selected (dst prefix)", "carrier: ipv6-altmark\nselect: {dst: [\"fd00:9::/32\"]}\n", tcp6, false},
	}
	progs := make([]*ebpf.Program, len(cases))
	for i, c := range cases {
		if c.cfg == "" {
			p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
			if err != nil {
				return fmt.Errorf("empty program: %w", err)
			}
			defer p.Close()
			progs[i] = p
			continue
		}
		cfg, err := altmark.ParseMarkConfig(c.name, []byte(c.cfg))
		if err != nil {
			return err
		}
		m, err := altmark.LoadMarkerProgram(cfg)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		defer m.Close()
		progs[i] = m.Prog
	}
	rep := make([][]float64, len(cases))
	sgl := make([][]float64, len(cases))
	for r := 0; r < *rounds; r++ {
		for i, c := range cases {
			if !c.grows {
				_, per, err := progrun.Bench(progs[i], c.pkt, *repeat)
				if err != nil {
					return fmt.Errorf("%s: %w", c.name, err)
				}
				rep[i] = append(rep[i], float64(per.Nanoseconds()))
			}
			xs := make([]float64, 0, *single)
			for range *single {
				_, per, err := progs[i].Benchmark(c.pkt, 1, nil)
				if err != nil {
					return fmt.Errorf("%s: %w", c.name, err)
				}
				xs = append(xs, float64(per.Nanoseconds()))
			}
			sgl[i] = append(sgl[i], report.Median(xs))
		}
	}
	baseRep, baseSgl := report.Median(rep[0]), report.Median(sgl[0])
	t := &report.Table{
		Title:   "altmark marker: ns per packet through BPF_PROG_TEST_RUN vs an empty tcx program",
		Columns: []string{"case", "repeated run ns/pkt", "repeated min–max", "× empty", "single runs median ns", "single min–max", "− empty ns"},
		Notes: []string{fmt.Sprintf("%d rounds, medians over the rounds (min–max: over the rounds); repeated: %d runs of one packet (kernel mean); single: %d runs of a fresh packet per round (median, includes the harness's per-run cost, subtracted in the last column).",
			*rounds, *repeat, *single),
			"Packets: 154-byte IPv4 / 174-byte IPv6 TCP frames (100-byte payload); the insert rows grow them by 8 bytes."},
	}
	data := map[string]any{}
	for i, c := range cases {
		r, s := report.Median(rep[i]), report.Median(sgl[i])
		rs, rr, ratio := "—", "—", "—"
		if !c.grows {
			rs, rr, ratio = fmt.Sprintf("%.1f", r), report.Range("%.1f", rep[i]), fmt.Sprintf("%.2f", r/baseRep)
		}
		t.Add(c.name, rs, rr, ratio, fmt.Sprintf("%.0f", s), report.Range("%.0f", sgl[i]), fmt.Sprintf("%+.0f", s-baseSgl))
		data[c.name] = map[string]any{"repeated_ns": rep[i], "single_median_ns": sgl[i]}
	}
	return report.Save(report.Result{Name: "altmark-mark", Tables: []*report.Table{t}, Data: data})
}
