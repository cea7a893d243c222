package prio

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/progrun"
	"github.com/flowplane/flowplane/internal/stats"
	"github.com/flowplane/flowplane/internal/testenv"
)

const (
	trusted   = "198.18.1.10" // inside policy.Trust
	untrusted = "198.18.2.10" // outside it
	server    = "198.18.3.10"
	trusted6  = "fd00:1::10"
	server6   = "fd00:3::10"
)

// classifier loads the program for a policy (nothing attached).
func classifier(t testing.TB, p *RouterPolicy) *classifierObjects {
	t.Helper()
	return classifierWith(t, p, cacheSlots)
}

// classifierWith is classifier with slots flow cache slots per CPU (0: none).
func classifierWith(t testing.TB, p *RouterPolicy, slots uint32) *classifierObjects {
	t.Helper()
	testenv.Privileged(t)
	if p.Trust == nil {
		p.Trust = []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("fd00:1::/64")}
	}
	objs, err := loadClassifierReusing(p, slots, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	return objs
}

// classify runs one frame on the first CPU the test may use and returns the class it was
// given: a flow's packets on one CPU, as a NIC's RSS keeps them.
func classify(t *testing.T, objs *classifierObjects, frame []byte) uint32 {
	t.Helper()
	return classifyOn(t, cpus(t)[0], objs, frame)
}

// classifyOn runs one frame on cpu: a test run executes on the calling thread's CPU, and the
// classifier's flow cache is per CPU.
func classifyOn(t *testing.T, cpu int, objs *classifierObjects, frame []byte) uint32 {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatalf("run on CPU %d: %v", cpu, err)
	}
	defer func() { _ = unix.SchedSetaffinity(0, &all) }()
	r, ctx, err := progrun.ExecSKB(objs.PrioClassify, frame, progrun.SKBMD{})
	if err != nil {
		t.Fatal(err)
	}
	if int32(r.Ret) != -1 {
		t.Errorf("verdict %d, want TCX_NEXT (-1): the classifier never decides a packet's fate", int32(r.Ret))
	}
	return ctx.Priority
}

// cpus are the CPUs this test may run on.
func cpus(t *testing.T) []int {
	t.Helper()
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	var out []int
	for i := range 1024 {
		if all.IsSet(i) {
			out = append(out, i)
		}
	}
	return out
}

func class(band, leaf int) uint32 { return ClassID(Major, band, leaf) }

func counter(t testing.TB, objs *classifierObjects, s classifierPrioStat) uint64 {
	t.Helper()
	n, err := stats.Sum(objs.PrioStats, uint32(s))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBacklogOptionPositions: our option wherever Linux may put it among the usual options,
// truncated and malformed option lists, IPv6, untrusted senders and traffic that is no flow.
// Backlog thresholds 10 KB, 100 KB, 1 MB: bands 0-3, default band 4.
func TestBacklogOptionPositions(t *testing.T) {
	t.Parallel()
	objs := classifier(t, &RouterPolicy{Scheme: Backlog, Leaves: 1, Thresholds: []uint64{10e3, 100e3, 1e6}})
	def := class(4, 0)
	port := uint16(1000)
	next := func() uint16 { port++; return port } // a new flow per case: no state carries over
	for _, c := range []struct {
		name  string
		frame func(sport uint16) []byte
		want  uint32
	}{
		{"alone", func(p uint16) []byte { return tcpFrame(trusted, server, p, 80, ours(10, 5000)) }, class(0, 0)},
		{"after NOP NOP TS", func(p uint16) []byte {
			return tcpFrame(trusted, server, p, 80, opts(optNOP, optNOP, optTS, ours(10, 50e3)))
		}, class(1, 0)},
		{"before NOP NOP TS", func(p uint16) []byte {
			return tcpFrame(trusted, server, p, 80, opts(ours(10, 500e3), optNOP, optNOP, optTS))
		}, class(2, 0)},
		{"after SACK", func(p uint16) []byte {
			return tcpFrame(trusted, server, p, 80, opts(optNOP, optNOP, optSACK, ours(10, 5e6)))
		}, class(3, 0)},
		{"among MSS SACKPERM TS WS", func(p uint16) []byte {
			return tcpFrame(trusted, server, p, 80, opts(optMSS, optSACKP, optTS, ours(10, 5000), optNOP, optWS))
		}, class(0, 0)},
		{"after end of options", func(p uint16) []byte {
			return tcpFrame(trusted, server, p, 80, opts([]byte{0, 0, 0, 0}, ours(10, 5000)))
		}, def},
		{"other ExID", func(p uint16) []byte {
			o := ours(10, 5000)
			o[3] ^= 1
			return tcpFrame(trusted, server, p, 80, o)
		}, def},
		{"no options", func(p uint16) []byte { return tcpFrame(trusted, server, p, 80, nil) }, def},
		{"NOP NOP TS alone", func(p uint16) []byte { return tcpFrame(trusted, server, p, 80, opts(optNOP, optNOP, optTS)) }, def},
		{"option length 0", func(p uint16) []byte {
			return tcpFrame(trusted, server, p, 80, opts([]byte{30, 0, 0, 0}, ours(10, 5000)))
		}, def},
		{"option length 1", func(p uint16) []byte {
			return tcpFrame(trusted, server, p, 80, opts([]byte{30, 1, 0, 0}, ours(10, 5000)))
		}, def},
		{"option past the header", func(p uint16) []byte {
			o := ours(10, 5000)
			o[1] = 12 // claims 12 bytes, 8 are there
			return tcpFrame(trusted, server, p, 80, o)
		}, def},
		{"kind without length at the end", func(p uint16) []byte {
			return tcpFrame(trusted, server, p, 80, opts(optNOP, optNOP, optNOP, []byte{30}))
		}, def},
		{"header longer than the packet", func(p uint16) []byte {
			return ipFrame(trusted, server, 6, tcpSeg(p, 80, ours(10, 5000), 0, 15)[:28])
		}, def},
		{"IPv6", func(p uint16) []byte {
			return tcpFrame(trusted6, server6, p, 80, opts(optNOP, optNOP, optTS, ours(10, 50e3)))
		}, class(1, 0)},
		{"untrusted sender", func(p uint16) []byte { return tcpFrame(untrusted, server, p, 80, ours(10, 5000)) }, def},
		{"UDP", func(p uint16) []byte { return udpFrame(trusted, server, p, 53) }, def},
		{"ICMP", func(uint16) []byte { return icmpFrame(trusted, server) }, def},
		{"not IP", func(uint16) []byte {
			f := icmpFrame(trusted, server)
			f[12], f[13] = 0x08, 0x06 // ARP
			return f
		}, def},
		{"IPv4 header longer than the packet", func(uint16) []byte {
			f := icmpFrame(trusted, server)[:14+24]
			f[14] = 0x4f // IHL 15: 60 bytes
			return f
		}, def},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := classify(t, objs, c.frame(next())); got != c.want {
				t.Errorf("class %x, want %x", got, c.want)
			}
		})
	}
	for s, want := range map[classifierPrioStat]uint64{
		classifierPrioStatPRIO_STAT_MALFORMED: 6, classifierPrioStatPRIO_STAT_UNTRUSTED: 1,
		classifierPrioStatPRIO_STAT_OTHER: 2, classifierPrioStatPRIO_STAT_PARSED: 7,
	} {
		if got := counter(t, objs, s); got != want {
			t.Errorf("counter %d = %d, want %d", s, got, want)
		}
	}
}

// TestOccupancySCTP: the original scheme's chunk 150 (first chunk, flags = occupancy %) and
// our option both drive the occupancy bands: the fuller the buffer, the better the band.
func TestOccupancySCTP(t *testing.T) {
	t.Parallel()
	objs := classifier(t, &RouterPolicy{Scheme: Occupancy, Leaves: 1})
	for _, c := range []struct {
		name  string
		frame []byte
		want  uint32
	}{
		{"chunk 150 at 95%", sctpFrame(trusted, server, 1, 9, 150, 95, 4), class(0, 0)},
		{"chunk 150 at 0%", sctpFrame(trusted, server, 2, 9, 150, 0, 4), class(9, 0)},
		{"chunk 150 at 45%", sctpFrame(trusted, server, 3, 9, 150, 45, 4), class(5, 0)},
		{"chunk 150 of wrong length", sctpFrame(trusted, server, 4, 9, 150, 95, 8), class(10, 0)},
		{"chunk 150 not first", sctpFrame(trusted, server, 5, 9, 0, 95, 16), class(10, 0)},
		{"chunk 150 over 100%", sctpFrame(trusted, server, 6, 9, 150, 200, 4), class(10, 0)},
		{"truncated SCTP", sctpFrame(trusted, server, 7, 9, 150, 95, 4)[:14+20+14], class(10, 0)},
		{"TCP option at 100%", tcpFrame(trusted, server, 8, 80, ours(100, 1e6)), class(0, 0)},
		{"TCP option unknown occupancy", tcpFrame(trusted, server, 9, 80, ours(OccUnknown, 1e6)), class(10, 0)},
	} {
		if got := classify(t, objs, c.frame); got != c.want {
			t.Errorf("%s: class %x, want %x", c.name, got, c.want)
		}
	}
	if got := counter(t, objs, classifierPrioStatPRIO_STAT_SCTP); got != 4 {
		t.Errorf("%d SCTP chunks counted, want 4", got)
	}
}

// TestSchemes: fifo has one class, fair spreads flows over K leaves of one band (a flow keeps
// its leaf), pias demotes a flow as its bytes cross the thresholds and never promotes it.
func TestSchemes(t *testing.T) {
	t.Parallel()
	t.Run("fifo", func(t *testing.T) {
		objs := classifier(t, &RouterPolicy{Scheme: FIFO, Leaves: 1})
		for _, f := range [][]byte{tcpFrame(trusted, server, 1, 2, ours(100, 1)), icmpFrame(trusted, server)} {
			if got := classify(t, objs, f); got != class(0, 0) {
				t.Errorf("class %x, want %x", got, class(0, 0))
			}
		}
	})
	t.Run("fair", func(t *testing.T) {
		objs := classifier(t, &RouterPolicy{Scheme: Fair, Leaves: 8})
		perLeaf := map[uint32]int{}
		for p := range uint16(64) {
			f := tcpFrame(trusted, server, 2000+p, 80, nil)
			c := classify(t, objs, f)
			if c>>16 != Major || c&0xff00 != 0x100 || c&0xff >= 8 {
				t.Fatalf("flow %d: class %x is not a leaf of band 0", p, c)
			}
			if again := classify(t, objs, f); again != c {
				t.Errorf("flow %d moved from leaf %x to %x", p, c, again)
			}
			perLeaf[c]++
		}
		// Flows take leaves in turn: 64 flows, 8 on each of the 8 leaves.
		for leaf := range 8 {
			if n := perLeaf[class(0, leaf)]; n != 8 {
				t.Errorf("leaf %d holds %d flows, want 8 (all: %v)", leaf, n, perLeaf)
			}
		}
	})
	t.Run("pias", func(t *testing.T) {
		objs := classifier(t, &RouterPolicy{Scheme: PIAS, Leaves: 1, Thresholds: []uint64{1000, 5000}})
		f := tcpFrame(trusted, server, 3000, 80, nil) // 154 bytes a packet
		var bands []uint32
		for range 50 {
			bands = append(bands, (classify(t, objs, f)>>8&0xff)-1)
		}
		if bands[0] != 0 || bands[7] != 1 || bands[49] != 2 {
			t.Errorf("bands over 50 packets: %v; want 0 until 1000 bytes, 1 until 5000, then 2", bands)
		}
		for i := 1; i < len(bands); i++ {
			if bands[i] < bands[i-1] {
				t.Fatalf("promoted at packet %d: %v", i, bands)
			}
		}
	})
	t.Run("pias idle reset", func(t *testing.T) {
		// Two packets cross the 200-byte edge, but an idle gap longer than idle_reset
		// between them ends a message: the flow starts over in band 0 instead of moving to
		// band 1.
		objs := classifier(t, &RouterPolicy{Scheme: PIAS, Leaves: 1, Thresholds: []uint64{200}, IdleReset: time.Nanosecond})
		f := tcpFrame(trusted, server, 3001, 80, nil)
		classify(t, objs, f)
		sleepPast(t, time.Nanosecond)
		if got := classify(t, objs, f); got != class(0, 0) {
			t.Errorf("after an idle gap: class %x, want band 0 (%x)", got, class(0, 0))
		}
		if got := counter(t, objs, classifierPrioStatPRIO_STAT_IDLE_RESET); got != 1 {
			t.Errorf("%d idle resets counted, want 1", got)
		}
	})
}

// sleepPast sleeps until more than d has passed on the classifier's coarse clock, as the
// classifier compares it (d plus a tick, read a tick late at worst).
func sleepPast(t *testing.T, d time.Duration) {
	t.Helper()
	tick, err := coarseTick()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(d + 3*tick)
}

// TestCapAndChangeLimit: a claim above max_claim is lowered to it, and a flow changes band at
// most once per band_change_interval (the refused moves are counted), except for the move its
// first information makes.
func TestCapAndChangeLimit(t *testing.T) {
	t.Parallel()
	objs := classifier(t, &RouterPolicy{Scheme: Backlog, Leaves: 1, Thresholds: []uint64{10e3, 100e3}, MaxClaim: 1, ChangeInterval: time.Hour})
	if got := classify(t, objs, tcpFrame(trusted, server, 1, 80, ours(0, 100))); got != class(1, 0) {
		t.Errorf("a claim of band 0 with max_claim 1: class %x, want %x", got, class(1, 0))
	}
	if counter(t, objs, classifierPrioStatPRIO_STAT_CAPPED) != 1 {
		t.Error("the capped claim was not counted")
	}
	f := func(backlog uint32) []byte { return tcpFrame(trusted, server, 2, 80, ours(0, backlog)) }
	if got := classify(t, objs, f(50e3)); got != class(1, 0) {
		t.Fatalf("first packet: class %x, want %x", got, class(1, 0))
	}
	for range 3 {
		if got := classify(t, objs, f(1e6)); got != class(1, 0) {
			t.Errorf("moved to %x within the interval", got)
		}
	}
	if n := counter(t, objs, classifierPrioStatPRIO_STAT_CHANGE_HELD); n != 3 {
		t.Errorf("%d held moves counted, want 3", n)
	}
	// A new connection's handshake carries no option: it starts in the default band, and its
	// first information moves it at once, whatever the interval.
	h := func(opt []byte) []byte { return tcpFrame(trusted, server, 4, 80, opt) }
	if got := classify(t, objs, h(nil)); got != class(3, 0) {
		t.Errorf("a flow without information: class %x, want the default band's %x", got, class(3, 0))
	}
	if got := classify(t, objs, h(ours(0, 50e3))); got != class(1, 0) {
		t.Errorf("its first information: class %x, want %x at once", got, class(1, 0))
	}
	objs2 := classifier(t, &RouterPolicy{Scheme: Backlog, Leaves: 1, Thresholds: []uint64{10e3, 100e3}})
	g := func(backlog uint32) []byte { return tcpFrame(trusted, server, 3, 80, ours(0, backlog)) }
	for i, c := range []struct {
		backlog uint32
		band    int
	}{{5000, 0}, {50e3, 1}, {1e6, 2}, {5000, 0}} {
		if got := classify(t, objs2, g(c.backlog)); got != class(c.band, 0) {
			t.Errorf("step %d (backlog %d): class %x, want %x", i, c.backlog, got, class(c.band, 0))
		}
	}
	if n := counter(t, objs2, classifierPrioStatPRIO_STAT_BAND_CHANGE); n != 3 {
		t.Errorf("%d band changes counted, want 3", n)
	}
	// Trust is looked up at a flow's first packet and kept with the flow: an untrusted
	// sender's later packets stay in the default band too.
	for i := range 2 {
		if got := classify(t, objs2, tcpFrame(untrusted, server, 5, 80, ours(0, 100))); got != class(3, 0) {
			t.Errorf("untrusted packet %d: class %x, want the default band's %x", i, got, class(3, 0))
		}
	}
	if n := counter(t, objs2, classifierPrioStatPRIO_STAT_UNTRUSTED); n != 2 {
		t.Errorf("%d untrusted packets counted, want 2", n)
	}
}

// TestChangeIntervalOnRealClock: a flow whose advertisements swing across a band edge at every
// packet changes band no sooner than band_change_interval after its last change, measured on
// the real clock around the calls (the classifier reads the coarse one), and still changes.
func TestChangeIntervalOnRealClock(t *testing.T) {
	t.Parallel()
	const interval = 20 * time.Millisecond
	objs := classifier(t, &RouterPolicy{Scheme: Backlog, Leaves: 1, Thresholds: []uint64{10e3, 100e3}, ChangeInterval: interval})
	f := func(backlog uint32) []byte { return tcpFrame(trusted, server, 6, 80, ours(0, backlog)) }
	last, lastStart := classify(t, objs, f(5000)), time.Now()
	changes := 0
	for i := 0; changes < 4 && time.Since(lastStart) < 10*time.Second; i++ {
		start := time.Now()
		got := classify(t, objs, f([]uint32{50e3, 5000}[i%2]))
		if got == last {
			continue
		}
		if d := time.Since(lastStart); d < interval {
			t.Fatalf("change %d came %v after the previous one, within the interval %v", changes+1, d, interval)
		}
		last, lastStart = got, start
		changes++
	}
	if changes < 4 {
		t.Errorf("%d band changes in 10 s of a flow swinging between two bands", changes)
	}
}

func TestOptionRoundTrip(t *testing.T) {
	t.Parallel()
	for _, o := range []Option{{0, 0}, {100, 64}, {55, 1 << 20}, {OccUnknown, 0xffffff * 64}} {
		got, ok := Decode(o.Encode())
		if !ok || got != o {
			t.Errorf("%+v → %x → %+v, %v", o, o.Encode(), got, ok)
		}
	}
	if o, _ := Decode(Option{Backlog: 1}.Encode()); o.Backlog != 64 {
		t.Errorf("1 byte is advertised as %d; backlog rounds up to whole units", o.Backlog)
	}
	for _, b := range [][]byte{nil, {253, 8, 0x46, 0x51, 0, 0, 0, 0}, {253, 10, 0x46, 0x50, 0, 0, 0, 0}, {254, 8, 0x46, 0x50, 0, 0, 0, 0}} {
		if _, ok := Decode(b); ok {
			t.Errorf("%x decoded", b)
		}
	}
	_ = fmt.Sprint
}

// TestMoveGap: with move_gap set, a flow that keeps sending stays in its band however its
// occupancy changes (the refused moves are counted), and moves once it has been silent that
// long. Its first information still moves it at once.
func TestMoveGap(t *testing.T) {
	t.Parallel()
	f := func(port uint16, occ uint8) []byte { return tcpFrame(trusted, server, port, 80, ours(occ, 1000)) }
	busy := classifier(t, &RouterPolicy{Scheme: Occupancy, Leaves: 1, MoveGap: time.Hour})
	if got := classify(t, busy, f(1, 95)); got != class(0, 0) {
		t.Fatalf("first information (95 %% full): class %x, want band 0 at once (%x)", got, class(0, 0))
	}
	for range 3 {
		if got := classify(t, busy, f(1, 5)); got != class(0, 0) {
			t.Errorf("moved to %x mid-burst", got)
		}
	}
	if n := counter(t, busy, classifierPrioStatPRIO_STAT_MOVE_WAIT); n != 3 {
		t.Errorf("%d moves put off counted, want 3", n)
	}
	quiet := classifier(t, &RouterPolicy{Scheme: Occupancy, Leaves: 1, MoveGap: time.Nanosecond})
	classify(t, quiet, f(2, 95))
	sleepPast(t, time.Nanosecond)
	if got := classify(t, quiet, f(2, 5)); got != class(9, 0) {
		t.Errorf("after a silence: class %x, want band 9 (%x)", got, class(9, 0))
	}
}
