package conntrack

import (
	"context"
	"slices"
	"strings"
	"time"

	"testing"

	"github.com/flowplane/flowplane/internal/packet"
)

// expire moves every entry's expiry into the past, as if its timeout had run out.
func (f *fixture) expire() {
	f.t.Helper()
	now, err := clockNow()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, m := range []*Tables{f.tables} {
		for _, e := range f.entries() {
			v := e.raw
			v.Expires = now - uint64(time.Second)
			tb := m.Emb
			if e.Confirmed {
				tb = m.Main
			}
			if err := tb.Put(&e.key, &v); err != nil {
				f.t.Fatal(err)
			}
		}
	}
}

func TestExpiryOnLookup(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.script(t, []step{
		{name: "query", frame: udp(true, 5000, 53), ret: xdpRedirect, state: "NEW"},
		{name: "reply", frame: udp(false, 5000, 53), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
	})
	f.expire()
	if es := f.entries(); len(es) != 0 {
		t.Fatalf("expired entries listed: %+v", es)
	}
	f.script(t, []step{
		// The expired entry never passes a packet: the reply is now unsolicited.
		{name: "reply after expiry", frame: udp(false, 5000, 53), out: true, ret: xdpDrop, count: "expired", state: "-"},
		{name: "query opens a new one", frame: udp(true, 5000, 53), ret: xdpRedirect, count: "new", state: "NEW"},
	})
}

func TestSweep(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	for p := uint16(1); p <= 300; p++ {
		f.run(udp(true, 1000+p, 53), f.in.Index)
		if p%2 == 0 {
			f.run(udp(false, 1000+p, 53), f.out.Index)
		}
	}
	conf, unconf, err := f.tables.Count()
	if err != nil || conf != 150 || unconf != 150 {
		t.Fatalf("count %d confirmed %d unconfirmed (%v), want 150 and 150", conf, unconf, err)
	}
	if es, err := f.tables.ListConfirmed(); err != nil || len(es) != 150 || !es[0].Confirmed || !es[149].Confirmed {
		t.Fatalf("ListConfirmed: %d entries (%v), want the 150 confirmed", len(es), err)
	}
	removed, live, err := f.tables.Sweep()
	if err != nil || removed != 0 || live != 300 {
		t.Fatalf("sweep of live entries: removed %d live %d err %v", removed, live, err)
	}
	f.expire()
	removed, live, err = f.tables.Sweep()
	if err != nil || removed != 300 || live != 0 {
		t.Fatalf("sweep of expired entries: removed %d live %d err %v", removed, live, err)
	}
	if c := f.counters(); c["swept"] != 300 {
		t.Errorf("swept counter %d, want 300", c["swept"])
	}
	if conf, unconf, _ = f.tables.Count(); conf+unconf != 0 {
		t.Errorf("%d entries left", conf+unconf)
	}
}

// TestFlush flushes both tables, as `flush` does from the pinned maps (with a ct_sweep of its
// own), and checks that every entry removed is reported as DESTROY, like conntrack -F.
func TestFlush(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs := make(chan Event, 64)
	done := make(chan error, 1)
	r, err := OpenEvents(f.tables)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- r.Read(ctx, func(e Event) { evs <- e }) }()
	for p := uint16(1); p <= 10; p++ {
		f.run(udp(true, 1000+p, 53), f.in.Index)
		if p%2 == 0 {
			f.run(udp(false, 1000+p, 53), f.out.Index) // confirmed: ct_main
		}
	}
	f.run(tcpOpen(true, "S", 1, 0), f.in.Index)
	pinned := &Tables{Main: f.tables.Main, Emb: f.tables.Emb, Stats: f.tables.Stats, Settings: f.tables.Settings, Events: f.tables.Events}
	n, err := pinned.Flush()
	if pinned.sweep == nil || !pinned.ownSweep {
		t.Error("flush of pinned tables did not load its own ct_sweep")
	} else {
		pinned.sweep.Close()
	}
	if err != nil || n != 11 || len(f.entries()) != 0 {
		t.Fatalf("flush: %d %v, %d left", n, err, len(f.entries()))
	}
	var destroyed []string
	for len(destroyed) < 11 {
		select {
		case e := <-evs:
			if e.Type == "DESTROY" {
				destroyed = append(destroyed, e.Proto+" "+e.State+" "+e.Orig.String(e.Proto))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("DESTROY events so far: %q", destroyed)
		}
	}
	slices.Sort(destroyed)
	if destroyed[0] != "tcp SYN_SENT src=198.18.1.10 dst=198.18.2.10 sport=40000 dport=80" ||
		destroyed[1] != "udp  src=198.18.1.10 dst=198.18.2.10 sport=1001 dport=53" {
		t.Errorf("DESTROY events %q", destroyed)
	}
	if c := f.counters(); c["swept"] != 0 {
		t.Errorf("flush counted %d entries as swept", c["swept"])
	}
	// The program's own tables flush with its ct_sweep.
	f.run(udp(true, 7000, 53), f.in.Index)
	if n, err := f.tables.Flush(); err != nil || n != 1 {
		t.Errorf("second flush: %d %v", n, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
}

func TestRuntimeTimeouts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	if err := f.tables.SetTimeouts(map[string]timeoutDur{"udp_unreplied": 5 * second}); err != nil {
		t.Fatal(err)
	}
	f.run(udp(true, 5000, 53), f.in.Index)
	if e := f.entries()[0]; e.Timeout > 5 || e.Timeout < 4 {
		t.Errorf("timeout %.1fs after setting udp_unreplied=5s", e.Timeout)
	}
}

func TestTableFull(t *testing.T) {
	t.Parallel()
	cfg := &Config{}
	cfg.Table.Confirmed = 4
	cfg.Table.Unconfirmed = 64
	f := newFixture(t, cfg)
	for p := uint16(1); p <= 4; p++ {
		f.run(udp(true, 1000+p, 53), f.in.Index)
		if ret, _ := f.run(udp(false, 1000+p, 53), f.out.Index); ret != xdpRedirect {
			t.Fatalf("reply %d: verdict %d", p, ret)
		}
	}
	f.script(t, []step{
		{name: "fifth query", frame: udp(true, 2000, 53), ret: xdpRedirect, count: "new"},
		{name: "its reply finds the table full", frame: udp(false, 2000, 53), out: true, ret: xdpDrop, count: "table_full"},
	})
	// A SYN flood of unconfirmed connections cannot evict confirmed ones.
	for i := 0; i < 1000; i++ {
		f.run(packet.IP(inHost, outHost).TCP(uint16(10000+i), 80, "S").Seq(uint32(i)).Bytes(), f.in.Index)
	}
	confirmed := 0
	for _, e := range f.entries() {
		if e.Confirmed {
			confirmed++
		}
	}
	if confirmed != 4 {
		t.Errorf("%d confirmed entries after the flood, want 4", confirmed)
	}
	// The LRU evicted what did not fit, silently; the count is new − removed − present.
	c := f.counters()
	tb := f.d.Tables()
	_, unconf, err := tb.Count()
	if err != nil {
		t.Fatal(err)
	}
	ev := Evicted(c, unconf)
	if c["new"] != 1005 || c["unconfirmed_removed"] != 4 || unconf > 64 || ev != 1005-4-uint64(unconf) || ev < 1005-4-64 {
		t.Errorf("after the flood: new %d, unconfirmed_removed %d (the 4 confirmed), %d unconfirmed left, evicted %d",
			c["new"], c["unconfirmed_removed"], unconf, ev)
	}
	// Removing what is left is counted as removed, not as evicted.
	if _, err := tb.Flush(); err != nil {
		t.Fatal(err)
	}
	c2 := f.counters()
	if _, unconf2, _ := tb.Count(); unconf2 != 0 || Evicted(c2, 0) != ev || c2["unconfirmed_removed"] != 4+uint64(unconf) {
		t.Errorf("after flush: %d left, evicted %d (was %d), removed %d", unconf2, Evicted(c2, 0), ev, c2["unconfirmed_removed"])
	}
	for p := uint16(1); p <= 4; p++ {
		f.run(udp(true, 1000+p, 53), f.in.Index)
		f.run(udp(false, 1000+p, 53), f.out.Index)
	}
	for p := uint16(1); p <= 4; p++ {
		if ret, _ := f.run(udp(false, 1000+p, 53), f.out.Index); ret != xdpRedirect {
			t.Errorf("reply %d after the flood: verdict %d", p, ret)
		}
	}
}

type timeoutDur = time.Duration

const second = time.Second

func TestEvents(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs := make(chan Event, 32)
	done := make(chan error, 1)
	// Before the reader opens: a connection made and flushed, its NEW and DESTROY not reported
	// (conntrack -E shows only what happens after it starts).
	f.run(udp(true, 4999, 53), f.in.Index)
	if n, err := f.tables.Flush(); err != nil || n != 1 {
		t.Fatalf("flush before the reader: %d, %v; want 1 entry", n, err)
	}
	opened := time.Now()
	r, err := OpenEvents(f.tables)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- r.Read(ctx, func(e Event) { evs <- e }) }()
	f.run(tcpOpen(true, "S", 1, 0), f.in.Index)
	f.run(tcp(true, "FA", 2, 0, 0), f.in.Index) // refused: no event
	f.run(tcpOpen(false, "RA", 0, 2), f.out.Index)
	f.run(tcpOpen(true, "S", 100, 0), f.in.Index) // reopens the closed connection
	f.run(udp(true, 5000, 53), f.in.Index)
	f.run(udp(true, 5001, 53), f.in.Index)
	f.expire()
	f.run(udp(true, 5000, 53), f.in.Index) // finds its entry expired: DESTROY, then NEW
	if removed, _, err := f.tables.Sweep(); err != nil || removed != 2 {
		t.Fatalf("sweep removed %d (%v), want the TCP and the other UDP entry", removed, err)
	}
	var got, lines []string
	for len(got) < 9 {
		select {
		case e := <-evs:
			got = append(got, e.Type+" "+e.State+" "+e.Orig.String(e.Proto))
			lines = append(lines, e.String())
			if e.Time.Before(opened.Add(-time.Second)) || e.Time.After(time.Now().Add(time.Second)) {
				t.Errorf("event %s dated %v, opened at %v", got[len(got)-1], e.Time, opened)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("events so far: %q", got)
		}
	}
	orig := "src=198.18.1.10 dst=198.18.2.10 sport=40000 dport=80"
	u0, u1 := "src=198.18.1.10 dst=198.18.2.10 sport=5000 dport=53", "src=198.18.1.10 dst=198.18.2.10 sport=5001 dport=53"
	want := []string{"NEW SYN_SENT " + orig, "DESTROY CLOSE " + orig, "NEW SYN_SENT " + orig,
		"NEW  " + u0, "NEW  " + u1, "DESTROY  " + u0, "NEW  " + u0,
		"DESTROY  " + u1, "DESTROY SYN_SENT " + orig} // the sweep, in hash order
	slices.Sort(got[7:])
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("events\n%q\nwant\n%q", got, want)
	}
	// The text lines as conntrack -E prints them (but for the timeout).
	if want := "    [NEW] tcp      6 SYN_SENT " + orig + " [UNREPLIED] src=198.18.2.10 dst=198.18.1.10 sport=80 dport=40000"; lines[0] != want {
		t.Errorf("text line\n%q\nwant\n%q", lines[0], want)
	}
	if want := "[DESTROY] tcp      6 CLOSE " + orig + " [UNREPLIED] src=198.18.2.10 dst=198.18.1.10 sport=80 dport=40000"; lines[1] != want {
		t.Errorf("text line\n%q\nwant\n%q", lines[1], want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
	// --timestamp: conntrack -E -o timestamp's prefix, microseconds padded.
	e := Event{Time: time.Unix(1700000000, 4567891), Type: "NEW", Proto: "udp"}
	if got, want := e.Stamped(), "[1700000000.004567]\t"+e.String(); got != want {
		t.Errorf("--timestamp line %q, want %q", got, want)
	}
}
