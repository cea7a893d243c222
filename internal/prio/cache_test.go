package prio

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/stats"
)

// cacheFlows are the senders of the flow cache tests: trusted IPv4 and IPv6, and one
// untrusted sender whose information does not count.
var cacheFlows = []struct {
	src, dst string
	sport    uint16
}{
	{trusted, server, 7001}, {trusted, server, 7002}, {"198.18.1.11", server, 7003},
	{trusted6, server6, 7004}, {untrusted, server, 7005},
}

// cachePackets is a reproducible packet sequence over cacheFlows: bursts of one flow, sizes
// from a pure ACK to a full segment, and advertisements that a sender repeats for a while and
// then steps across the band edges (or leaves out, as the host writer does between changes).
func cachePackets(n int) [][]byte {
	r := rand.New(rand.NewPCG(1, 2))
	type adv struct {
		occ     uint8
		backlog uint32
	}
	cur := make([]adv, len(cacheFlows))
	var out [][]byte
	f := 0
	for range n {
		if r.IntN(8) == 0 {
			f = r.IntN(len(cacheFlows))
		}
		if r.IntN(10) == 0 {
			cur[f] = adv{uint8(r.IntN(101)), []uint32{1e3, 5e3, 50e3, 500e3, 2e6}[r.IntN(5)]}
		}
		o := opts(optNOP, optNOP, optTS)
		if r.IntN(5) < 3 {
			o = opts(optNOP, optNOP, optTS, ours(cur[f].occ, cur[f].backlog))
		}
		c := cacheFlows[f]
		out = append(out, ipFrame(c.src, c.dst, 6, tcpSeg(c.sport, 80, o, []int{0, 100, 1400}[r.IntN(3)], 0)))
	}
	return out
}

// flowState is the classifier's flow table with the flow cache's unsynced bytes merged in, as
// `prio status` reads it, without the fields that hold clock readings.
func flowState(t *testing.T, objs *classifierObjects) map[classifierPrioFlowKey]classifierPrioFlow {
	t.Helper()
	table, err := flowTable(objs.PrioFlows)
	if err != nil {
		t.Fatal(err)
	}
	if err := mergeCache(objs.PrioCache, table); err != nil {
		t.Fatal(err)
	}
	for k, v := range table {
		v.LastSeen, v.LastChange = 0, 0
		table[k] = v
	}
	return table
}

// TestFlowCacheAgreesWithTable: the cache's fast path decides what the flow table decides. The
// same packets go through a classifier without the cache, with it, and with a cache of one
// slot (each flow's packets evict another's copy), all on one CPU: every packet gets the same
// class, every counter but `cached` agrees, and so does every flow's state once the cache's
// unsynced bytes are merged in.
func TestFlowCacheAgreesWithTable(t *testing.T) {
	t.Parallel()
	packets := cachePackets(3000)
	for name, p := range map[string]RouterPolicy{
		"fair":                 {Scheme: Fair, Leaves: 4},
		"backlog":              {Scheme: Backlog, Leaves: 4, Thresholds: []uint64{10e3, 100e3, 1e6}},
		"backlog max_claim":    {Scheme: Backlog, Leaves: 4, Thresholds: []uint64{10e3, 100e3, 1e6}, MaxClaim: 1},
		"occupancy":            {Scheme: Occupancy, Leaves: 4},
		"occupancy move_gap":   {Scheme: Occupancy, Leaves: 4, MoveGap: time.Hour},
		"backlog held moves":   {Scheme: Backlog, Leaves: 4, Thresholds: []uint64{10e3, 100e3, 1e6}, ChangeInterval: time.Hour},
		"occupancy held moves": {Scheme: Occupancy, Leaves: 4, ChangeInterval: time.Hour},
		"pias":                 {Scheme: PIAS, Leaves: 4, Thresholds: []uint64{20e3, 200e3}, IdleReset: time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var classes [][]uint32
			var counters [][]uint64
			var states []map[classifierPrioFlowKey]classifierPrioFlow
			for _, slots := range []uint32{0, cacheSlots, 1} {
				objs := classifierWith(t, &p, slots)
				var got []uint32
				for _, f := range packets {
					got = append(got, classify(t, objs, f))
				}
				all, err := stats.All(objs.PrioStats)
				if err != nil {
					t.Fatal(err)
				}
				cached := statusCounters(all)["cached"]
				if slots > 0 && cached == 0 {
					t.Errorf("%d slots: no packet took the fast path", slots)
				}
				t.Logf("%d slots: %d of %d packets from the cache", slots, cached, len(packets))
				all[classifierPrioStatPRIO_STAT_TABLE] = 0
				classes, counters, states = append(classes, got), append(counters, all), append(states, flowState(t, objs))
			}
			for i, slots := range []uint32{cacheSlots, 1} {
				for j := range packets {
					if classes[i+1][j] != classes[0][j] {
						t.Fatalf("%d slots: packet %d got class %x, the table alone gives %x", slots, j, classes[i+1][j], classes[0][j])
					}
				}
				for s := range counters[0] {
					if counters[i+1][s] != counters[0][s] {
						t.Errorf("%d slots: counter %d = %d, the table alone counts %d", slots, s, counters[i+1][s], counters[0][s])
					}
				}
				for k, want := range states[0] {
					if got := states[i+1][k]; got != want {
						t.Errorf("%d slots: flow %s → %s:\n got %+v\nwant %+v", slots, endpoint(k.Saddr, k.Sport), endpoint(k.Daddr, k.Dport), got, want)
					}
				}
				if len(states[i+1]) != len(states[0]) {
					t.Errorf("%d slots: %d flows, the table alone has %d", slots, len(states[i+1]), len(states[0]))
				}
			}
		})
	}
}

// TestFlowCacheAcrossCPUs: a flow whose packets come on two CPUs. A band change on one CPU
// makes the other's copy stale at once: its next packet goes to the new class, so no CPU sends
// a flow back to a better band (pias's "never promoted") or keeps it in its old one. Bytes
// counted on both add up.
func TestFlowCacheAcrossCPUs(t *testing.T) {
	t.Parallel()
	cs := cpus(t)
	if len(cs) < 2 {
		t.Fatalf("needs two CPUs to run on, this test may use %v", cs)
	}
	a, b := cs[0], cs[1]
	t.Run("backlog", func(t *testing.T) {
		objs := classifier(t, &RouterPolicy{Scheme: Backlog, Leaves: 1, Thresholds: []uint64{10e3, 100e3}})
		f := func(o []byte) []byte { return tcpFrame(trusted, server, 7100, 80, opts(optNOP, optNOP, optTS, o)) }
		var sent uint64
		send := func(cpu int, frame []byte) uint32 { sent += uint64(len(frame)); return classifyOn(t, cpu, objs, frame) }
		for range 4 {
			if got := send(a, f(ours(0, 5000))); got != class(0, 0) {
				t.Fatalf("CPU %d: class %x, want %x", a, got, class(0, 0))
			}
		}
		if got := send(b, f(ours(0, 50e3))); got != class(1, 0) {
			t.Fatalf("CPU %d, the backlog grown: class %x, want %x", b, got, class(1, 0))
		}
		for i := range 3 {
			if got := send(a, f(nil)); got != class(1, 0) {
				t.Errorf("CPU %d after the move on CPU %d, packet %d: class %x, want %x", a, b, i, got, class(1, 0))
			}
		}
		for k, v := range flowState(t, objs) {
			if v.Bytes != sent {
				t.Errorf("flow %s: %d bytes, %d sent", endpoint(k.Saddr, k.Sport), v.Bytes, sent)
			}
		}
	})
	t.Run("pias", func(t *testing.T) {
		objs := classifier(t, &RouterPolicy{Scheme: PIAS, Leaves: 1, Thresholds: []uint64{2000}})
		f := tcpFrame(trusted, server, 7101, 80, nil) // 154 bytes
		for range 3 {
			classifyOn(t, a, objs, f)
		}
		for range 20 { // past 2000 bytes on b: demoted
			classifyOn(t, b, objs, f)
		}
		if got := classifyOn(t, a, objs, f); got != class(1, 0) {
			t.Errorf("CPU %d after the flow was demoted on CPU %d: class %x, want %x (never promoted)", a, b, got, class(1, 0))
		}
	})
}

// TestFlowCacheSync: a flow's copy goes to the table at least every PRIO_CACHE_SYNC packets
// (the table alone lags by fewer), and a copy whose flow the table let go does not bring the
// old flow's bytes back into the new one.
func TestFlowCacheSync(t *testing.T) {
	t.Parallel()
	objs := classifier(t, &RouterPolicy{Scheme: Backlog, Leaves: 1, Thresholds: []uint64{10e3, 100e3}})
	frame := tcpFrame(trusted, server, 7200, 80, nil)
	size := uint64(len(frame))
	bytes := func(merged bool) uint64 {
		t.Helper()
		table, err := flowTable(objs.PrioFlows)
		if err != nil {
			t.Fatal(err)
		}
		if merged {
			if err := mergeCache(objs.PrioCache, table); err != nil {
				t.Fatal(err)
			}
		}
		if len(table) != 1 {
			t.Fatalf("%d flows in the table, want 1", len(table))
		}
		for _, v := range table {
			return v.Bytes
		}
		return 0
	}
	const lag = 63 // packets: a sync every 64th (docs/prio.md), not the header's constant
	for n := uint64(1); n <= 150; n++ {
		classify(t, objs, frame)
		if got := bytes(false); got+lag*size < n*size || got > n*size {
			t.Fatalf("after %d packets the table counts %d bytes, want %d less at most %d packets", n, got, n*size, lag)
		}
		if got := bytes(true); got != n*size {
			t.Fatalf("after %d packets, with the cache merged: %d bytes, want %d", n, got, n*size)
		}
	}
	var k classifierPrioFlowKey
	var v classifierPrioFlow
	if err := objs.PrioFlows.NextKey(nil, &k); err != nil {
		t.Fatal(err)
	}
	if err := objs.PrioFlows.Delete(k); err != nil { // as the LRU lets a flow go
		t.Fatal(err)
	}
	const since = lag + 6 // past the copy's next sync
	for range since {
		classify(t, objs, frame)
	}
	if err := objs.PrioFlows.Lookup(k, &v); err != nil {
		t.Fatalf("the flow was not made again: %v", err)
	}
	if got := bytes(true); got > since*size || got < 5*size {
		t.Errorf("the flow made again counts %d bytes, want at most the %d sent since (and the last 5 of them at least)", got, since*size)
	}
}

// TestFlowCacheHeldMove: a flow whose advertisement asks for a move that band_change_interval
// holds stays where it is, and once the table has held it, its copy holds the move for the
// packets that repeat the advertisement (a sender swinging across a band edge must not send
// every packet through the flow table).
func TestFlowCacheHeldMove(t *testing.T) {
	t.Parallel()
	objs := classifier(t, &RouterPolicy{Scheme: Backlog, Leaves: 1, Thresholds: []uint64{10e3}, ChangeInterval: time.Hour})
	f := func(backlog uint32) []byte { return tcpFrame(trusted, server, 7302, 80, ours(50, backlog)) }
	if got := classify(t, objs, f(1000)); got != class(0, 0) { // a new flow: band 0 from its information
		t.Fatalf("first packet: class %x, want band 0 (%x)", got, class(0, 0))
	}
	const n = 20
	for i := range n {
		if got := classify(t, objs, f(50e3)); got != class(0, 0) {
			t.Fatalf("packet %d asking for band 1: class %x, want band 0 (%x): the move is held", i, got, class(0, 0))
		}
	}
	if got := counter(t, objs, classifierPrioStatPRIO_STAT_CHANGE_HELD); got != n {
		t.Errorf("%d held moves counted, want %d", got, n)
	}
	// the first asking packet brings new information (the table's); PRIO_CACHE_SYNC sends one
	// in every 64 to the table
	all, err := stats.All(objs.PrioStats)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := statusCounters(all)["cached"], uint64(n-1-(n-1)/64); got < want {
		t.Errorf("%d packets from the cache, want at least %d: the copy did not hold the move", got, want)
	}
}

// TestFlowCacheClocks: the copies keep the clock readings the table path weighs. A pias flow
// served from its copy still starts over after idling, and an occupancy flow that kept sending
// from its copy is still mid-burst for move_gap.
func TestFlowCacheClocks(t *testing.T) {
	t.Parallel()
	t.Run("pias idle reset", func(t *testing.T) {
		t.Parallel()
		// An idle_reset long enough that the first three packets, sent back to back, are not
		// apart by it on a loaded machine (the clock is coarse: 1 ns would be a tick).
		const idle = time.Second
		objs := classifier(t, &RouterPolicy{Scheme: PIAS, Leaves: 1, Thresholds: []uint64{200}, IdleReset: idle})
		f := tcpFrame(trusted, server, 7300, 80, nil) // 154 bytes: band 1 from the second packet
		for i := range 3 {
			if got := classify(t, objs, f); got != class(min(i, 1), 0) {
				t.Fatalf("packet %d: class %x, want %x", i, got, class(min(i, 1), 0))
			}
		}
		sleepPast(t, idle)
		if got := classify(t, objs, f); got != class(0, 0) {
			t.Errorf("after idling: class %x, want band 0 (%x)", got, class(0, 0))
		}
		if n := counter(t, objs, classifierPrioStatPRIO_STAT_IDLE_RESET); n != 1 {
			t.Errorf("%d idle resets counted, want 1", n)
		}
	})
	t.Run("move_gap", func(t *testing.T) {
		t.Parallel()
		const gap, every = time.Second, 150 * time.Millisecond
		objs := classifier(t, &RouterPolicy{Scheme: Occupancy, Leaves: 1, MoveGap: gap})
		f := func(occ uint8) []byte { return tcpFrame(trusted, server, 7301, 80, ours(occ, 1000)) }
		start := time.Now()
		for time.Since(start) < gap+2*every { // longer than move_gap, from the flow's copy
			if got := classify(t, objs, f(95)); got != class(0, 0) {
				t.Fatalf("class %x, want band 0 (%x)", got, class(0, 0))
			}
			time.Sleep(every)
		}
		if got := classify(t, objs, f(5)); got != class(0, 0) {
			t.Errorf("moved to %x mid-burst: its last packet came %v ago, move_gap is %v", got, every, gap)
		}
		if n := counter(t, objs, classifierPrioStatPRIO_STAT_MOVE_WAIT); n != 1 {
			t.Errorf("%d moves put off counted, want 1", n)
		}
	})
}

// statusCounters are the classifier's counters as `prio status` reports them.
func statusCounters(all []uint64) map[string]uint64 {
	raw := map[string]uint64{}
	for i, n := range routerStatNames() {
		raw[n] = all[i]
	}
	return routerCounters(raw)
}

// TestStatusCounters: status adds up what the classifier counts: every packet once in packets,
// and in cached a flow's packets that the table did not take, under fifo (which parses nothing)
// and backlog.
func TestStatusCounters(t *testing.T) {
	t.Parallel()
	frames := [][]byte{icmpFrame(trusted, server), tcpFrame(trusted, server, 7400, 80, nil)[:40]}
	for range 10 {
		frames = append(frames, tcpFrame(trusted, server, 7401, 80, nil))
	}
	for scheme, want := range map[Scheme]map[string]uint64{
		FIFO:    {"packets": 12, "cached": 0, "no_option": 0},
		Backlog: {"packets": 12, "cached": 9, "no_option": 10, "other": 1, "malformed": 1},
	} {
		objs := classifier(t, &RouterPolicy{Scheme: scheme, Leaves: 1, Thresholds: []uint64{10e3}})
		for _, f := range frames {
			classify(t, objs, f)
		}
		all, err := stats.All(objs.PrioStats)
		if err != nil {
			t.Fatal(err)
		}
		got := statusCounters(all)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s %d, want %d (all: %v)", scheme, k, got[k], v, got)
			}
		}
	}
}
