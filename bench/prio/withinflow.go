package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/match"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/prio"
)

// The within-flow measurement: one long iperf3 flow passes through every state in turn, a
// period each, and a state's goodput is compared with plain forwarding's in the same cycle of
// periods. Rounds of separate flows (throughputCost) carry each connection's own luck (buffer
// autotuning, where its pages and timers fall) and the machine's drift between rounds; within
// one flow, a few seconds apart, both cancel.

// flowState is what the cgroup's writers and r1's tcx egress hook hold for a period.
type flowState struct {
	key, name string
	writer    string // "", "changes" (the bench's writer), "every" (refresh 0: every data segment), or one of bareSockOps
	tcx       string // "", "empty" or "classifier"
}

// flowStates are the states -flow-states picks from, plain forwarding (the baseline) first.
var flowStates = []flowState{
	{"plain", "plain forwarding (veth: noqueue)", "", ""},
	{"tcx-empty", "tcx egress, an empty program", "", "empty"},
	{"writer", "host writer", "changes", ""},
	{"writer-every", "host writer, the option on every data segment (refresh 0)", "every", ""},
	{"calls", "a sock_ops program that returns 1 (the header-option callbacks' calls alone)", "calls", ""},
	{"room", "a sock_ops program that reserves the option's 8 bytes at MSS sizing only (no option)", "room", ""},
	{"room4", "the same, 4 bytes", "room4", ""},
	{"room16", "the same, 16 bytes", "room16", ""},
	{"classifier", "classifier (backlog; packets without the option), no qdisc", "", "classifier"},
	{"writer+classifier", "host writer + classifier (backlog), no qdisc", "changes", "classifier"},
}

// pickFlowStates returns the states named by keys, in flowStates' order; plain must be one.
func pickFlowStates(keys []string) ([]flowState, error) {
	var known []string
	for _, st := range flowStates {
		known = append(known, st.key)
	}
	for _, k := range keys {
		if !slices.Contains(known, k) {
			return nil, fmt.Errorf("-flow-states: unknown state %q (known: %s)", k, strings.Join(known, ", "))
		}
	}
	if !slices.Contains(keys, "plain") {
		return nil, fmt.Errorf("-flow-states: give plain too (the baseline every state is paired with)")
	}
	var states []flowState
	for _, st := range flowStates {
		if slices.Contains(keys, st.key) {
			states = append(states, st)
		}
	}
	return states, nil
}

// throughputWithinFlow measures b.c.flowStates within one iperf3 flow s1 → d1 in offload
// mode mode: b.c.flowCycles cycles of a b.c.flowPeriod per state, each cycle starting one state
// later than the one before; the first fifth of a period is not counted (the switch settles).
//
// The writers are switched by attaching and detaching them on a cgroup of its own that iperf3's
// client joined with both attached (each keeps its own socket storage, made when the
// connection was): the connection keeps the header-option callbacks they turned on, and with
// no program on the cgroup the kernel's callback returns without reserving room (the off
// periods pay that call, once per send and per MSS sizing).
func (b *bench) throughputWithinFlow(ctx context.Context, mode string) error {
	objs, err := b.flowPrograms()
	if err != nil {
		return err
	}
	defer objs.close()
	cg := b.cg + "w"
	if err := os.Mkdir(cg, 0o755); err != nil {
		return fmt.Errorf("cgroup of the switched writer: %w", err)
	}
	defer func() { _ = cgroup.Remove(cg) }()
	sw := &flowSwitch{b: b, cg: cg, objs: objs, writers: map[string]link.Link{}}
	defer sw.set(flowStates[0]) // leave nothing attached (plain)
	if err := sw.attachWriters(); err != nil {
		return err
	}

	cycles, states, period := b.c.flowCycles, b.c.flowStates, b.c.flowPeriod
	settle := period / 5
	// iperf3 outlives the periods (attaching takes time too); it is stopped at the end
	total := time.Duration(cycles*len(states))*period*2 + 10*time.Second
	srv, err := b.command(ctx, "d1", "iperf3", "-s", "-1")
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return fmt.Errorf("iperf3 server on d1: %w", err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	time.Sleep(300 * time.Millisecond)
	dst := netip.MustParseAddrPort(splitFirst(b.dsts)).Addr().String()
	cli, err := b.command(ctx, "s1", "iperf3", "-c", dst, "-C", b.c.costCC, "-t", strconv.Itoa(int(total.Seconds())+1))
	if err != nil {
		return err
	}
	fd, err := cgroup.Into(cli.Cmd, cg)
	if err != nil {
		return err
	}
	err = cli.Start()
	fd.Close()
	if err != nil {
		return fmt.Errorf("iperf3 client on s1: %w", err)
	}
	defer func() { _ = cli.Process.Kill(); _ = cli.Wait() }()
	time.Sleep(2 * time.Second) // connected, past slow start

	got := map[string][]float64{}
	for cycle := range cycles {
		for i := range states {
			if err := ctx.Err(); err != nil {
				return err
			}
			st := states[(cycle+i)%len(states)]
			if err := sw.set(st); err != nil {
				return err
			}
			time.Sleep(settle)
			bps, err := b.receivedDuring(period - settle)
			if err != nil {
				return err
			}
			got[st.name] = append(got[st.name], bps)
		}
		slog.Info("throughput within one flow", "cycle", cycle+1, "of", cycles)
	}
	b.flowTable(mode, states, period, got)
	return nil
}

// flowTable reports each state's goodput against plain forwarding's in the same cycle.
func (b *bench) flowTable(mode string, states []flowState, period time.Duration, got map[string][]float64) {
	t := &report.Table{
		Title:   "Cost within one flow: one iperf3 flow through an unshaped r1, " + offloadShort[mode] + b.delayNote(),
		Columns: []string{"state", "Gbit/s (median)", "ratio to plain, per cycle: geometric mean (95 % interval)", "median (min–max)"},
	}
	plain := got[states[0].name]
	for _, st := range states {
		var paired []float64
		for i, v := range got[st.name] {
			paired = append(paired, v/plain[i])
		}
		t.Add(st.name, percentile(got[st.name], 50)/1e9, ratioInterval(paired),
			fmt.Sprintf("%.3f (%.3f–%.3f)", report.Median(paired), slices.Min(paired), slices.Max(paired)))
		if st.key == "writer+classifier" {
			// docs/prio.md's cost goal: the writer and the classifier keep one flow at 0.97
			// of plain forwarding (the geometric mean over the cycles).
			t.Goal(report.AtLeast("geometric mean ratio to plain", geoMean(paired), 0.97))
		}
	}
	t.Notes = append(t.Notes, fmt.Sprintf("One iperf3 flow (%s; one CPU, as above; %s) held each state for %v, of which the last %v counted (goodput: bytes the receiving socket took), in %d cycles of all states, each cycle starting one state later. The writers are detached and attached on a cgroup of its own (the connection keeps its callbacks; off, the kernel's callback finds no program), the programs on r1's tcx egress likewise.", b.c.costCC, offloadTitle[mode], period, period-period/5, len(plain)))
	b.table(t)
	b.res.Data[b.key("within_flow_bps_"+offloadKey[mode])] = got
}

// flowObjects are the programs the within-flow states switch.
type flowObjects struct {
	writers           map[string]*ebpf.Program // by flowState.writer
	classifier, empty *ebpf.Program
	closers           []io.Closer
}

func (o *flowObjects) close() {
	for _, c := range o.closers {
		c.Close()
	}
}

// flowPrograms loads the writers (every connection advertises; the bench's refresh, and 0),
// backlog's classifier with its flow cache, and an empty tc program.
func (b *bench) flowPrograms() (o *flowObjects, err error) {
	o = &flowObjects{writers: map[string]*ebpf.Program{}}
	defer func() {
		if err != nil {
			o.close()
		}
	}()
	var c io.Closer
	for name, hp := range map[string]*prio.HostPolicy{
		"changes": {Refresh: prio.DefaultRefresh, MinInterval: prio.DefaultMinInterval},
		"every":   {},
	} {
		hp.File, hp.Advertise = "bench", []match.Match{match.Any()}
		if o.writers[name], c, err = prio.HostProgram(hp); err != nil {
			return nil, err
		}
		o.closers = append(o.closers, c)
	}
	for name, prog := range bareSockOps() {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SockOps, License: "GPL", Instructions: prog})
		if err != nil {
			return nil, fmt.Errorf("load the %s program: %w", name, err)
		}
		o.writers[name] = p
		o.closers = append(o.closers, p)
	}
	p, err := b.policy("backlog", nil)
	if err != nil {
		return nil, err
	}
	if o.classifier, c, err = prio.ClassifierProgram(p, true); err != nil {
		return nil, err
	}
	o.closers = append(o.closers, c)
	if o.empty, err = emptyTC(); err != nil {
		return nil, err
	}
	o.closers = append(o.closers, o.empty)
	return o, nil
}

// bareSockOps are sock_ops programs that split the writer's cost: "calls" returns 1 (the
// header-option callbacks' calls alone), "roomN" reserves N bytes when the kernel sizes the MSS
// and does nothing else (segments N bytes shorter, no option).
func bareSockOps() map[string]asm.Instructions {
	progs := map[string]asm.Instructions{"calls": {asm.Mov.Imm(asm.R0, 1), asm.Return()}}
	for name, n := range map[string]int32{"room": int32(prio.OptLen), "room4": 4, "room16": 16} {
		// UAPI: op at offset 0, args[0] at 4; BPF_SOCK_OPS_HDR_OPT_LEN_CB is 14,
		// BPF_WRITE_HDR_TCP_CURRENT_MSS 1.
		progs[name] = asm.Instructions{
			asm.LoadMem(asm.R2, asm.R1, 0, asm.Word),
			asm.JNE.Imm(asm.R2, 14, "out"),
			asm.LoadMem(asm.R2, asm.R1, 4, asm.Word),
			asm.JSet.Imm(asm.R2, 1, "reserve"),
			asm.Ja.Label("out"),
			asm.Mov.Imm(asm.R2, n).WithSymbol("reserve"),
			asm.Mov.Imm(asm.R3, 0),
			asm.FnReserveHdrOpt.Call(),
			asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
			asm.Return(),
		}
	}
	return progs
}

// flowSwitch attaches and detaches the writers and r1's tcx program to reach a state.
type flowSwitch struct {
	b       *bench
	cg      string
	objs    *flowObjects
	writers map[string]link.Link // attached writers, by flowState.writer
	tcx     link.Link
	on      string // the program on tcx: "", "empty" or "classifier"
}

func (s *flowSwitch) set(st flowState) error {
	for name, l := range s.writers {
		if name != st.writer {
			l.Close()
			delete(s.writers, name)
		}
	}
	if st.writer != "" && s.writers[st.writer] == nil {
		if err := s.attachWriter(st.writer); err != nil {
			return err
		}
	}
	if st.tcx == s.on {
		return nil
	}
	if s.tcx != nil {
		s.tcx.Close()
		s.tcx, s.on = nil, ""
	}
	prog := map[string]*ebpf.Program{"empty": s.objs.empty, "classifier": s.objs.classifier}[st.tcx]
	if prog == nil {
		return nil
	}
	l, err := s.b.attachTCX(prog)
	if err != nil {
		return err
	}
	s.tcx, s.on = l, st.tcx
	return nil
}

// attachWriters attaches every writer, as before a connection the states switch.
func (s *flowSwitch) attachWriters() error {
	for name := range s.objs.writers {
		if err := s.attachWriter(name); err != nil {
			return err
		}
	}
	return nil
}

func (s *flowSwitch) attachWriter(name string) error {
	l, err := link.AttachCgroup(link.CgroupOptions{Path: s.cg, Attach: ebpf.AttachCGroupSockOps, Program: s.objs.writers[name]})
	if err != nil {
		return fmt.Errorf("attach the writer to %s: %w", s.cg, err)
	}
	s.writers[name] = l
	return nil
}

// receivedDuring is the goodput d1's sockets took over d, in bit/s: bytes received by its TCP
// sockets (tcp_info), read before and after.
func (b *bench) receivedDuring(d time.Duration) (float64, error) {
	n0, t0, err := b.bytesReceived()
	if err != nil {
		return 0, err
	}
	time.Sleep(d)
	n1, t1, err := b.bytesReceived()
	if err != nil {
		return 0, err
	}
	if n1 < n0 {
		return 0, fmt.Errorf("iperf3's flow to d1 ended before the measurement")
	}
	return float64(n1-n0) * 8 / t1.Sub(t0).Seconds(), nil
}

// bytesReceived is the largest bytes_received of d1's TCP sockets (iperf3's data connection)
// and when it was read.
func (b *bench) bytesReceived() (uint64, time.Time, error) {
	var most uint64
	var at time.Time
	err := nsrun.Do(b.l.Netns("d1"), func() error {
		// iperf3 listens on "::": its IPv4 connections are IPv6 sockets
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			socks, err := netlink.SocketDiagTCPInfo(family)
			at = time.Now()
			if err != nil {
				return err
			}
			for _, s := range socks {
				if s.TCPInfo != nil && s.TCPInfo.Bytes_received > most {
					most = s.TCPInfo.Bytes_received
				}
			}
		}
		return nil
	})
	if err != nil {
		return 0, at, fmt.Errorf("tcp_info on d1: %w", err)
	}
	return most, at, nil
}
