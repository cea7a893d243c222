package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/altmark"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/xdpgen"
)

// 64-byte frames: xdpgen sends one UDP flow h1 → h2 at full speed for send64; h2's XDP sink
// counts what r1 forwarded over window64 in the middle.
const (
	send64   = 3 * time.Second
	window64 = 2 * time.Second
)

// packets64 measures the packets per second r1 forwards of 64-byte frames (kernel forwarding on
// one CPU: the generator's), without and with the probe on both directions of both interfaces,
// in interleaved rounds.
func packets64(ctx context.Context, l *lab.Lab, spec altmark.ProbeSpec) (*report.Table, map[string]any, error) {
	dev := func(node string, i int) (string, net.HardwareAddr, int, error) {
		n, err := l.Node(node)
		if err != nil {
			return "", nil, 0, err
		}
		name := l.IfName(n.Ifaces[i])
		var mac net.HardwareAddr
		var idx int
		err = nsrun.Do(l.Netns(node), func() error {
			ifc, err := net.InterfaceByName(name)
			if err == nil {
				mac, idx = ifc.HardwareAddr, ifc.Index
			}
			return err
		})
		return name, mac, idx, err
	}
	_, h1MAC, h1Index, err := dev("h1", 0)
	if err != nil {
		return nil, nil, err
	}
	r1In, r1MAC, _, err := dev("r1", 0)
	if err != nil {
		return nil, nil, err
	}
	h2Dev, _, _, err := dev("h2", 0)
	if err != nil {
		return nil, nil, err
	}
	h1n, _ := l.Node("h1")
	h2n, _ := l.Node("h2")
	h1, h2 := h1n.Ifaces[0].IPv4.Addr(), h2n.Ifaces[0].IPv4.Addr()
	// A frame XDP-transmitted into a veth is received only by a peer with NAPI (GRO on), and r1
	// must know h2's MAC before the first frame.
	for _, c := range [][]string{{"r1", "ethtool", "-K", r1In, "gro", "on"}, {"h1", "ping", "-c", "1", "-W", "2", h2.String()}} {
		cmd, err := l.Command(ctx, c[0], c[1], c[2:]...)
		if err != nil {
			return nil, nil, err
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, nil, fmt.Errorf("%v: %v: %s", c, err, out)
		}
	}
	sink, err := xdpgen.AttachSink(xdpgen.SinkConfig{Netns: l.Netns("h2"), Ifname: h2Dev, Proto: 17, Port: 9})
	if err != nil {
		return nil, nil, err
	}
	defer sink.Close()
	frame := packet.IP(h1.String(), h2.String()).MAC(h1MAC, r1MAC).UDP(5000, 9).Payload(make([]byte, 18)).Bytes()
	measure := func() (float64, error) {
		done := make(chan error, 1)
		var progress atomic.Uint64
		go func() {
			_, err := xdpgen.Send(ctx, xdpgen.Config{Netns: l.Netns("h1"), Ifindex: h1Index, Frame: frame, Duration: send64, Progress: &progress})
			done <- err
		}()
		time.Sleep((send64 - window64) / 2)
		c0, err0 := sink.Count()
		t0 := time.Now()
		time.Sleep(window64)
		c1, err1 := sink.Count()
		secs := time.Since(t0).Seconds()
		if err := <-done; err != nil {
			return 0, err
		}
		if err0 != nil || err1 != nil {
			return 0, fmt.Errorf("sink count: %v %v", err0, err1)
		}
		return float64(c1-c0) / secs, nil
	}
	series, err := interleavedModes(l, spec, []mode{modeNone, modeEmpty, modeProbe}, func(altmark.Datapath) (float64, error) { return measure() })
	if err != nil {
		return nil, nil, err
	}
	without, empty, with := series[0], series[1], series[2]
	wo, we, wi := report.Median(without), report.Median(empty), report.Median(with)
	t := &report.Table{Title: "altmark probe: 64-byte frames forwarded by r1 (xdpgen h1 → h2, one flow)",
		Columns: []string{"r1", "Mpackets/s (median)", "min–max", "Gbit/s at 64 B", "ratio", "per-round ratio min–max"}}
	mpps := func(xs []float64) string {
		m := make([]float64, len(xs))
		for i, x := range xs {
			m[i] = x / 1e6
		}
		return report.Range("%.3g", m)
	}
	t.Add("no probe", wo/1e6, mpps(without), wo*64*8/1e9, 1.0, "")
	t.Add("empty tcx programs on the same four points (the hooks' own cost)", we/1e6, mpps(empty), we*64*8/1e9, we/wo, report.Range("%.3f", pairedRatios(empty, without)))
	t.Add("probe on both interfaces, in and out", wi/1e6, mpps(with), wi*64*8/1e9, wi/wo, report.Range("%.3f", pairedRatios(with, without)))
	t.Goal(probeGoal(wi / wo))
	t.Notes = append(t.Notes, fmt.Sprintf("%d interleaved rounds; received at h2's XDP sink over %v in the middle of %v at the generator's full speed. Kernel forwarding on r1 runs on the generator's CPU: this is packets/s per core.", *rounds, window64, send64))
	return t, map[string]any{"pps_64b_without": without, "pps_64b_empty_tcx": empty, "pps_64b_with": with}, nil
}

// interleaved runs measure *rounds times without and with the probe on r1 (spec), alternating,
// and returns both series; measure gets the open probe (nil without) to read it before it
// closes.
func interleaved(l *lab.Lab, spec altmark.ProbeSpec, measure func(altmark.Datapath) (float64, error)) (without, with []float64, err error) {
	s, err := interleavedModes(l, spec, []mode{modeNone, modeProbe}, measure)
	if err != nil {
		return nil, nil, err
	}
	return s[0], s[1], nil
}

// mode is what r1's interfaces carry in a round.
type mode int

const (
	modeNone  mode = iota // nothing attached
	modeEmpty             // a tcx program returning TCX_NEXT on every point: the hook's own cost
	modeProbe             // the probe
)

// interleavedModes runs measure *rounds times in each mode, alternating, and returns a series
// per mode.
func interleavedModes(l *lab.Lab, spec altmark.ProbeSpec, modes []mode, measure func(altmark.Datapath) (float64, error)) ([][]float64, error) {
	out := make([][]float64, len(modes))
	for r := 0; r < *rounds; r++ {
		for i, m := range modes {
			var p altmark.Datapath
			var closers []io.Closer
			err := nsrun.Do(l.Netns("r1"), func() error {
				switch m {
				case modeProbe:
					var err error
					p, err = altmark.OpenProbe(spec)
					return err
				case modeEmpty:
					prog, err := emptyTCX()
					if err != nil {
						return err
					}
					closers = append(closers, prog)
					for _, pt := range spec.Points {
						ifc, err := net.InterfaceByName(pt.Ifname)
						if err != nil {
							return err
						}
						at := ebpf.AttachTCXIngress
						if pt.Direction == "out" {
							at = ebpf.AttachTCXEgress
						}
						lk, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: prog, Attach: at})
						if err != nil {
							return err
						}
						closers = append(closers, lk)
					}
				}
				return nil
			})
			if err != nil {
				for _, c := range closers {
					c.Close()
				}
				return nil, err
			}
			v, err := measure(p)
			if p != nil {
				p.Close()
			}
			for j := len(closers) - 1; j >= 0; j-- {
				closers[j].Close()
			}
			if err != nil {
				return nil, err
			}
			out[i] = append(out[i], v)
		}
	}
	return out, nil
}
