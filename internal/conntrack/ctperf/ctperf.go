// Package ctperf measures conntrack's per-packet cost with BPF_PROG_TEST_RUN. It builds frames
// with internal/packet (gopacket), so only benchmarks and tests import it, never bin/flowplane.
package ctperf

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/flowplane/flowplane/internal/conntrack"
	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/progrun"
)

// NsPerPacket measures the data path's cost for an established TCP connection with
// BPF_PROG_TEST_RUN: it loads a private copy of the program (nothing attached or pinned) in the
// calling thread's namespace, opens client → server through it (the client behind inIfindex,
// the server behind outIfindex; both must be routable with resolved neighbours, as on a lab
// router after some traffic), then times repeat runs of a 1400-byte data segment in batches
// and returns the median batch's time per run.
func NsPerPacket(client, server netip.Addr, inIfindex, outIfindex, repeat int) (time.Duration, error) {
	per, _, err := NsPerPacketWithBaseline(client, server, inIfindex, outIfindex, repeat)
	return per, err
}

// NsPerPacketWithBaseline is NsPerPacket plus the same measurement of an XDP program that only
// returns XDP_PASS: the test-run harness's own cost on this machine.
func NsPerPacketWithBaseline(client, server netip.Addr, inIfindex, outIfindex, repeat int) (time.Duration, time.Duration, error) {
	per, err := nsPerPacket(client, server, inIfindex, outIfindex, repeat)
	if err != nil {
		return 0, 0, err
	}
	noop, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		return 0, 0, fmt.Errorf("load baseline program: %w", err)
	}
	defer noop.Close()
	data := packet.IP(client.String(), server.String()).TCP(40000, 5201, "PA").Payload(make([]byte, 1400)).Bytes()
	_, base, err := progrun.Bench(noop, data, repeat)
	if err != nil {
		return 0, 0, fmt.Errorf("baseline benchmark: %w", err)
	}
	return per, base, nil
}

func nsPerPacket(client, server netip.Addr, inIfindex, outIfindex, repeat int) (time.Duration, error) {
	c, err := Measure(client, server, inIfindex, outIfindex, repeat)
	return c.Conntrack, err
}

// Cost is one measurement of an established TCP segment's cost (medians of batches).
type Cost struct {
	Conntrack time.Duration // the conntrack XDP program
	Floor     time.Duration // the floor program (bpf/conntrack/floor.bpf.c) on the same packet
}

// Ratio is Conntrack / Floor.
func (c Cost) Ratio() float64 { return float64(c.Conntrack) / float64(c.Floor) }

// Measure opens client → server through a private copy of conntrack's XDP program (see
// NsPerPacket), copies the connection's entry (key, and route cached for each direction) into
// the floor program's table of the same size, and times both on the same 1400-byte data
// segment in alternating batches: the medians are measured under the same load.
func Measure(client, server netip.Addr, inIfindex, outIfindex, repeat int) (Cost, error) {
	d, err := conntrack.LoadUnpinned(&conntrack.Config{Inside: []string{"in"}, Outside: []string{"out"}, Hook: conntrack.HookXDP})
	if err != nil {
		return Cost{}, err
	}
	defer d.Close()
	if err := d.AddInterface(inIfindex, true); err != nil {
		return Cost{}, err
	}
	if err := d.AddInterface(outIfindex, false); err != nil {
		return Cost{}, err
	}
	// Frames are addressed to the interface they arrive on, which conntrack checks.
	macs := map[int]net.HardwareAddr{}
	for _, i := range []int{inIfindex, outIfindex} {
		ifc, err := net.InterfaceByIndex(i)
		if err != nil {
			return Cost{}, err
		}
		macs[i] = ifc.HardwareAddr
		if err := d.SetMAC(i, ifc.HardwareAddr); err != nil {
			return Cost{}, err
		}
	}
	c, s := client.String(), server.String()
	steps := []struct {
		frame   []byte
		ifindex int
	}{
		{packet.IP(c, s).TCP(40000, 5201, "S").Seq(1000).WScale(7).MAC(packet.SrcMAC, macs[inIfindex]).Bytes(), inIfindex},
		{packet.IP(s, c).TCP(5201, 40000, "SA").Seq(5000).Ack(1001).WScale(7).MAC(packet.SrcMAC, macs[outIfindex]).Bytes(), outIfindex},
		{packet.IP(c, s).TCP(40000, 5201, "A").Seq(1001).Ack(5001).MAC(packet.SrcMAC, macs[inIfindex]).Bytes(), inIfindex},
	}
	var fwdMAC net.HardwareAddr // where conntrack sends client → server: the server's MAC
	for i, st := range steps {
		r, err := progrun.Exec(d.Program(), st.frame, st.ifindex)
		if err != nil {
			return Cost{}, fmt.Errorf("handshake packet %d: %w", i, err)
		}
		if len(r.Out) >= 6 {
			fwdMAC = append(net.HardwareAddr(nil), r.Out[:6]...)
		}
		if r.Ret != 4 {
			return Cost{}, fmt.Errorf("handshake packet %d: verdict %d, want XDP_REDIRECT (routes and neighbours resolved?)", i, r.Ret)
		}
	}
	// The same in-window segment again and again: a retransmission, so the state stays put.
	// Each run decrements the TTL in place (the test run reuses one buffer), so runs go in
	// batches that stay above TTL 1. Each BPF_PROG_TEST_RUN call costs milliseconds of setup
	// (it swaps the XDP dispatcher), so batches are as large as the TTL allows.
	// Timed runs take no context: the frame arrives on the loopback device (ifindex 1). Each
	// run forwards the buffer the previous one rewrote, addressed to the server by then: that
	// is lo's MAC for conntrack's destination check, which so runs in full.
	if err := d.SetMAC(1, fwdMAC); err != nil {
		return Cost{}, err
	}
	data := packet.IP(c, s).TTL(255).TCP(40000, 5201, "PA").Seq(1001).Ack(5001).Payload(make([]byte, 1400)).MAC(packet.SrcMAC, fwdMAC).Bytes()
	const batch = 250
	run := func(prog *ebpf.Program) (time.Duration, error) {
		ret, per, err := progrun.Bench(prog, append([]byte(nil), data...), batch)
		if err != nil {
			return 0, fmt.Errorf("benchmark: %w", err)
		}
		if ret != 4 {
			cs, _ := d.Tables().ReadCounters()
			return 0, fmt.Errorf("benchmark verdict %d, want XDP_REDIRECT (counters %v)", ret, cs)
		}
		return per, nil
	}
	// A first batch caches the route for the test run's ingress (the loopback device).
	if _, err := run(d.Program()); err != nil {
		return Cost{}, err
	}
	fl, err := loadFloorWith(d, inIfindex, outIfindex)
	if err != nil {
		return Cost{}, err
	}
	defer fl.Close()
	// The result is the median batch: a batch is short (~0.1 ms), so most run undisturbed by
	// the machine's other work, which inflates a mean over all runs by whatever else ran.
	var cts, fls []time.Duration
	for runs := 0; runs < repeat; runs += batch {
		per, err := run(d.Program())
		if err != nil {
			return Cost{}, err
		}
		cts = append(cts, per)
		if per, err = run(fl.CtFloor); err != nil {
			return Cost{}, fmt.Errorf("floor: %w", err)
		}
		fls = append(fls, per)
	}
	slices.Sort(cts)
	slices.Sort(fls)
	return Cost{Conntrack: cts[len(cts)/2], Floor: fls[len(fls)/2]}, nil
}

// loadFloor loads the floor program with conntrack's table size and copies d's confirmed
// entries (byte for byte: the same struct ct_key and ct_entry) into its table.
func loadFloorWith(d *conntrack.Datapath, ifindexes ...int) (*floorObjects, error) {
	spec, err := loadFloor()
	if err != nil {
		return nil, fmt.Errorf("load floor spec: %w", err)
	}
	main := d.Tables().Main
	info, err := main.Info()
	if err != nil {
		return nil, err
	}
	spec.Maps["floor_table"].MaxEntries = info.MaxEntries
	var objs floorObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("load floor program: %w", err)
	}
	var k, v []byte
	it := main.Iterate()
	for it.Next(&k, &v) {
		if err := objs.FloorTable.Put(k, v); err != nil {
			objs.Close()
			return nil, fmt.Errorf("copy entry: %w", err)
		}
	}
	if err := it.Err(); err != nil {
		objs.Close()
		return nil, err
	}
	for _, i := range ifindexes {
		if err := objs.FloorPorts.Put(uint32(i), uint32(i)); err != nil {
			objs.Close()
			return nil, fmt.Errorf("floor devmap: %w", err)
		}
	}
	return &objs, nil
}
