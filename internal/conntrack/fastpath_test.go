package conntrack

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/flowplane/flowplane/internal/packet"
)

// TestEstablishedFastPath: the data path's inline path for ESTABLISHED ACK segments whose route
// is cached (est_fast) decides exactly as track does. The same script runs on two fixtures; on
// the second, every packet finds its connection's route cache cleared, so it always takes the
// general path (route lookup, track, ct_tcp_update). After each packet the verdict, the
// counters' changes and the entry (windows, state, flags, last_*, retransmissions, packets,
// bytes, the timeout's length) must be the same.
func TestEstablishedFastPath(t *testing.T) {
	t.Parallel()
	ci, si := uint32(1000), uint32(5000)
	ts := func(b *packet.Builder) *packet.Builder { // NOP, NOP, timestamp: the usual options
		return b.Option(1, nil).Option(1, nil).Option(8, make([]byte, 8))
	}
	c2s := func(flags string, seq, ack uint32, n int) *packet.Builder {
		return packet.IP(inHost, outHost).TCP(40000, 80, flags).Seq(seq).Ack(ack).Payload(make([]byte, n))
	}
	s2c := func(flags string, seq, ack uint32, n int) *packet.Builder {
		return packet.IP(outHost, inHost).TCP(80, 40000, flags).Seq(seq).Ack(ack).Payload(make([]byte, n))
	}
	type seg struct {
		name string
		b    *packet.Builder
		out  bool
	}
	script := []seg{
		{"syn", packet.IP(inHost, outHost).TCP(40000, 80, "S").Seq(ci).MSS(1460).WScale(7).SACKPermitted(), false},
		{"synack", packet.IP(outHost, inHost).TCP(80, 40000, "SA").Seq(si).Ack(ci + 1).MSS(1460).WScale(7).SACKPermitted(), true},
		{"ack", c2s("A", ci+1, si+1, 0), false},
		{"data", c2s("PA", ci+1, si+1, 1000), false},
		{"data, no PSH", c2s("A", ci+1001, si+1, 1000), false},
		{"data with timestamps", ts(c2s("PA", ci+2001, si+1, 500)), false},
		{"server acks part", s2c("A", si+1, ci+1001, 0), true},
		{"server data with timestamps", ts(s2c("PA", si+1, ci+2501, 300)), true},
		{"server acks all, URG", s2c("UA", si+301, ci+2501, 0), true},
		{"client acks, ECE CWR", c2s("AEC", ci+2501, si+301, 0), false},
		{"retransmission 1", c2s("A", ci+2501, si+301, 0), false},
		{"retransmission 2", c2s("A", ci+2501, si+301, 0), false},
		{"retransmission 3", c2s("A", ci+2501, si+301, 0), false},
		{"retransmission 4", c2s("A", ci+2501, si+301, 0), false},
		{"old segment, ignored", c2s("PA", ci-100000, si+301, 10), false},
		{"far beyond the window", c2s("PA", ci+50_000_000, si+301, 10), false},
		{"ack of unsent data", s2c("A", si+301, ci+900_000, 0), true},
		{"sack block", packet.IP(outHost, inHost).TCP(80, 40000, "A").Seq(si+301).Ack(ci+2501).SACK(ci+2501, ci+2502), true},
		{"data after all that", c2s("PA", ci+2501, si+301, 100), false},
		{"fin", c2s("FA", ci+2601, si+301, 0), false},
		{"ack in FIN_WAIT", s2c("A", si+301, ci+2602, 0), true},
	}
	fast, slow := newFixture(t, nil), newFixture(t, nil)
	for i, s := range script {
		var got [2]string
		for j, f := range []*fixture{fast, slow} {
			if f == slow {
				f.clearRoutes()
			}
			ifindex := f.in.Index
			if s.out {
				ifindex = f.out.Index
			}
			before := f.counters()
			ret, _ := f.run(s.b.Bytes(), ifindex)
			got[j] = fmt.Sprintf("verdict %d, counters %v, entries %s", ret, diff(before, f.counters()), f.comparable())
			if j == 0 {
				t.Logf("%02d %s: verdict %d, counters %v", i, s.name, ret, diff(before, f.counters()))
			}
		}
		if got[0] != got[1] {
			t.Fatalf("%02d %s:\n fast path: %s\n general:   %s", i, s.name, got[0], got[1])
		}
	}
	// The fast path was there to take: the client's direction has a cached route.
	if es := fast.entries(); len(es) != 1 || es[0].raw.Route[0].Checked == 0 || es[0].raw.Route[1].Checked == 0 {
		t.Errorf("no cached route on the fast fixture: %+v", es)
	}
}

// clearRoutes forgets every confirmed connection's cached routes.
func (f *fixture) clearRoutes() {
	f.t.Helper()
	var k, v []byte
	var keys, vals [][]byte
	it := f.tables.Main.Iterate()
	for it.Next(&k, &v) {
		keys, vals = append(keys, append([]byte(nil), k...)), append(vals, append([]byte(nil), v...))
	}
	if err := it.Err(); err != nil {
		f.t.Fatal(err)
	}
	for i := range keys {
		var e ctCtEntry
		if _, err := binary.Decode(vals[i], binary.LittleEndian, &e); err != nil {
			f.t.Fatal(err)
		}
		e.Route[0].Checked, e.Route[1].Checked = 0, 0
		if err := f.tables.Main.Put(keys[i], &e); err != nil {
			f.t.Fatal(err)
		}
	}
}

// comparable lists the entries without what differs between two fixtures (routes, interface
// numbers) or with the clock (expiry and creation: only the timeout's length, in seconds).
func (f *fixture) comparable() string {
	f.t.Helper()
	var out string
	now, err := clockNow()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, e := range f.entries() {
		var zero ctCtEntry
		r := e.raw
		// Rounded to 10 s: the two fixtures run a moment apart.
		timeout := (int64(r.Expires) - int64(now) + 5e9) / 1e10 * 10
		r.Expires, r.Created, r.Route, r.Ifindex = 0, 0, zero.Route, zero.Ifindex
		out += fmt.Sprintf("%s %s confirmed=%v timeout≈%ds %+v; ", e.Orig.Src, e.State, e.Confirmed, timeout, r)
	}
	return out
}
