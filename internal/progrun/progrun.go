// Package progrun runs BPF programs on crafted packets with BPF_PROG_TEST_RUN: the contexts of
// XDP and TC runs, one run with its output packet, and timed runs. progtest builds table tests
// on it; benchmarks use it directly (it does not import testing).
package progrun

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf"
)

// Result is what one run gave back.
type Result struct {
	Ret uint32 // the program's return value (XDP action, TC verdict, …)
	Out []byte // the packet after the program
}

// XDPMD is struct xdp_md, the context of an XDP test run.
type XDPMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// SKBMD is the head of struct __sk_buff up to ifindex, the context of a TC test run (the kernel
// zero-fills the rest; len and pkt_type must be zero).
type SKBMD struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto, Priority uint32
	IngressIfindex, Ifindex                                                               uint32
}

// Context is the test-run context of prog's type for a frame that arrives on ifindex (0: no
// interface, and no context for TC: the kernel's default).
func Context(prog *ebpf.Program, frame []byte, ifindex int) any {
	switch prog.Type() {
	case ebpf.XDP:
		return XDPMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifindex)}
	case ebpf.SchedCLS, ebpf.SchedACT:
		if ifindex != 0 {
			return SKBMD{IngressIfindex: uint32(ifindex), Ifindex: uint32(ifindex)}
		}
	}
	return nil
}

// Accepts reports whether BPF_PROG_TEST_RUN takes frame for prog: the kernel refuses (EINVAL)
// a frame shorter than an Ethernet header, and for a tc program a frame that does not fit one
// page's linear skb data, or an IPv4 or IPv6 frame (by its EtherType) shorter than the fixed IP
// header, though a device may well deliver one. Fuzz targets skip what it refuses.
func Accepts(prog *ebpf.Program, frame []byte) bool {
	if len(frame) < 14 {
		return false
	}
	if t := prog.Type(); t != ebpf.SchedCLS && t != ebpf.SchedACT {
		return true
	}
	// The page less the skb's headroom (NET_SKB_PAD) and struct skb_shared_info (320 bytes on
	// 64-bit).
	if len(frame) > os.Getpagesize()-64-320 {
		return false
	}
	switch binary.BigEndian.Uint16(frame[12:]) {
	case 0x0800:
		return len(frame) >= 14+20
	case 0x86dd:
		return len(frame) >= 14+40
	}
	return true
}

// Exec runs prog once on in as if it arrived on ifindex. It reports errors instead of failing a
// test, so it can run on a thread locked into another namespace (nsrun.Do).
func Exec(prog *ebpf.Program, in []byte, ifindex int) (Result, error) {
	opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256), Context: Context(prog, in, ifindex)} // room to grow
	ret, err := prog.Run(opts)
	if err != nil {
		return Result{}, fmt.Errorf("BPF_PROG_TEST_RUN: %w", err)
	}
	return Result{Ret: ret, Out: opts.DataOut}, nil // resliced to the kernel's data_size_out
}

// ExecSKB runs a TC program once on in with context ctx and returns the context after the
// run too (skb->priority, mark, … as the program left them).
func ExecSKB(prog *ebpf.Program, in []byte, ctx SKBMD) (Result, SKBMD, error) {
	var out SKBMD
	whole := make([]byte, 512) // the kernel writes all of struct __sk_buff back
	opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256), Context: ctx, ContextOut: whole}
	ret, err := prog.Run(opts)
	if err != nil {
		return Result{}, out, fmt.Errorf("BPF_PROG_TEST_RUN: %w", err)
	}
	if err := binary.Read(bytes.NewReader(whole), binary.NativeEndian, &out); err != nil {
		return Result{}, out, err
	}
	return Result{Ret: ret, Out: opts.DataOut}, out, nil
}

// Bench runs prog repeat times on in and returns the last verdict and the kernel's mean time
// per run. Each run sees the packet the previous one left. cilium/ebpf's timed run takes no
// context, so the program sees no ingress interface.
func Bench(prog *ebpf.Program, in []byte, repeat int) (uint32, time.Duration, error) {
	ret, per, err := prog.Benchmark(in, repeat, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("BPF_PROG_TEST_RUN ×%d: %w", repeat, err)
	}
	return ret, per, nil
}
