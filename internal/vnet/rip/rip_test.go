package rip

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/vnet/clock"
)

func TestMessageRoundTrip(t *testing.T) {
	t.Parallel()
	m := Message{Command: CmdResponse, Entries: []Entry{
		{netip.MustParsePrefix("198.18.1.0/24"), 3}, {netip.MustParsePrefix("0.0.0.0/0"), 16}, {netip.MustParsePrefix("198.18.2.4/32"), 0}}}
	b := Append(nil, &m)
	got, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(m) {
		t.Fatalf("got %v want %v", got, m)
	}
	for _, bad := range [][]byte{{0, 1}, {0, 3, 0, 0}, {0, 2, 0, 1, 0}, {0, 1, 0, 1, 0, 0, 0, 1, 1, 2, 3, 4, 255, 255, 255, 0}} {
		if _, err := Parse(bad); err == nil {
			t.Fatalf("accepted %v", bad)
		}
	}
	noncontig := Append(nil, &Message{Command: CmdResponse, Entries: []Entry{{netip.MustParsePrefix("198.18.1.0/24"), 1}}})
	noncontig[len(noncontig)-1] = 0x0f
	if _, err := Parse(noncontig); err != ErrMask {
		t.Fatalf("non-contiguous mask: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(Append(nil, &Message{Command: CmdResponse, Entries: []Entry{{netip.MustParsePrefix("198.18.1.0/24"), 3}}}))
	f.Add(Append(nil, &Message{Command: CmdRequest}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			return
		}
		if len(m.Entries) > MaxEntries {
			t.Fatal("too many entries accepted")
		}
		for _, e := range m.Entries {
			if e.Cost > Infinity || e.Prefix.Masked() != e.Prefix {
				t.Fatalf("bad entry %v", e)
			}
		}
		m2, err := Parse(Append(nil, &m))
		if err != nil || fmt.Sprint(m2) != fmt.Sprint(m) {
			t.Fatalf("round trip %v %v", m2, err)
		}
	})
}

// simNet wires routers together over a virtual clock with 1 ms links.
type simNet struct {
	clk     *clock.Virtual
	routers []*Router
	tables  [][]Route
	links   [][2][2]int // [end][node, iface]
	down    map[int]bool
	sent    []sentMsg
}

type sentMsg struct {
	from, iface int
	msg         Message
}

func linkPrefix(l, end int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(l), byte(end + 1)}), 24)
}

// newSim builds routers from an edge list over n nodes.
func newSim(t *testing.T, n int, edges [][2]int) *simNet {
	s := &simNet{clk: clock.NewVirtual(), tables: make([][]Route, n), down: map[int]bool{}}
	ifaces := make([][]Iface, n)
	ifLink := make([][]int, n)
	for l, e := range edges {
		var ends [2][2]int
		for k := 0; k < 2; k++ {
			node := e[k]
			ends[k] = [2]int{node, len(ifaces[node])}
			ifaces[node] = append(ifaces[node], Iface{Prefix: linkPrefix(l, k), Peer: linkPrefix(l, 1-k).Addr(), Up: true})
			ifLink[node] = append(ifLink[node], l)
		}
		s.links = append(s.links, ends)
	}
	for i := 0; i < n; i++ {
		i := i
		send := func(ifc int, dst netip.Addr, b []byte) {
			l := ifLink[i][ifc]
			m, err := Parse(b)
			if err != nil {
				t.Fatalf("router %d sent invalid message: %v", i, err)
			}
			s.sent = append(s.sent, sentMsg{i, ifc, m})
			if s.down[l] {
				return
			}
			ends := s.links[l]
			peer := ends[0]
			if peer[0] == i {
				peer = ends[1]
			}
			src := ifaces[i][ifc].Prefix.Addr()
			msg := append([]byte(nil), b...)
			s.clk.AfterFunc(time.Millisecond, func() { s.routers[peer[0]].Input(peer[1], src, msg) })
		}
		r := New(s.clk, DefaultConfig(), ifaces[i], send, func(rs []Route) { s.tables[i] = rs })
		s.routers = append(s.routers, r)
	}
	for _, r := range s.routers {
		r.Start()
	}
	return s
}

func (s *simNet) setLink(l int, up bool) {
	s.down[l] = !up
	for _, end := range s.links[l] {
		s.routers[end[0]].SetIfaceUp(end[1], up)
	}
}

// expected computes the correct metric of every link subnet at every router by BFS.
func (s *simNet) expected() []map[netip.Prefix]int {
	n := len(s.routers)
	adj := make([][]int, n)
	for l, e := range s.links {
		if !s.down[l] {
			adj[e[0][0]] = append(adj[e[0][0]], e[1][0])
			adj[e[1][0]] = append(adj[e[1][0]], e[0][0])
		}
	}
	out := make([]map[netip.Prefix]int, n)
	for src := 0; src < n; src++ {
		dist := make([]int, n)
		for i := range dist {
			dist[i] = -1
		}
		dist[src] = 0
		q := []int{src}
		for len(q) > 0 {
			x := q[0]
			q = q[1:]
			for _, y := range adj[x] {
				if dist[y] < 0 {
					dist[y] = dist[x] + 1
					q = append(q, y)
				}
			}
		}
		out[src] = map[netip.Prefix]int{}
		for l, e := range s.links {
			if s.down[l] {
				continue
			}
			best := -1
			for _, end := range e {
				if d := dist[end[0]]; d >= 0 && (best < 0 || d < best) {
					best = d
				}
			}
			if best >= 0 {
				out[src][linkPrefix(l, 0).Masked()] = best
			}
		}
	}
	return out
}

func (s *simNet) correct() error { return s.matches(s.expected()) }

func (s *simNet) matches(want []map[netip.Prefix]int) error {
	for i, tab := range s.tables {
		ok := len(tab) == len(want[i])
		for _, r := range tab {
			if m, found := want[i][r.Prefix]; !found || m != r.Metric {
				ok = false
				break
			}
		}
		if !ok {
			got := map[netip.Prefix]int{}
			for _, r := range tab {
				got[r.Prefix] = r.Metric
			}
			return fmt.Errorf("router %d: table %v, want %v", i, got, want[i])
		}
	}
	return nil
}

func (s *simNet) converge(t *testing.T, limit time.Duration, what string) time.Duration {
	t.Helper()
	start := s.clk.Now()
	want := s.expected()
	if !s.clk.RunUntil(limit, func() bool { return s.matches(want) == nil }) {
		t.Fatalf("%s: not converged after %v: %v", what, limit, s.correct())
	}
	return s.clk.Now() - start
}

func line(n int) [][2]int {
	var e [][2]int
	for i := 0; i+1 < n; i++ {
		e = append(e, [2]int{i, i + 1})
	}
	return e
}

func TestConvergesOnLineAndRing(t *testing.T) {
	t.Parallel()
	s := newSim(t, 10, line(10))
	s.converge(t, time.Second, "line start-up")
	ring := append(line(10), [2]int{9, 0})
	s = newSim(t, 10, ring)
	s.converge(t, time.Second, "ring start-up")
}

func TestLinkDownReconvergesWithinOneSecond(t *testing.T) {
	t.Parallel()
	ring := append(line(10), [2]int{9, 0})
	s := newSim(t, 10, ring)
	s.converge(t, time.Second, "start-up")
	s.clk.Advance(7 * time.Second)
	s.setLink(4, false) // the ring becomes a line: routes must swing the long way round
	took := s.converge(t, time.Second, "after link down")
	t.Logf("converged %v after link down", took)
	// The table must stay correct (no count-to-infinity flapping) over later updates.
	for i := 0; i < 30; i++ {
		s.clk.Advance(time.Second)
		if err := s.correct(); err != nil {
			t.Fatalf("%ds after: %v", i, err)
		}
	}
	s.setLink(4, true)
	s.converge(t, time.Second, "after link up")
}

func TestPartitionPoisonsAndCollects(t *testing.T) {
	t.Parallel()
	s := newSim(t, 10, line(10))
	s.converge(t, time.Second, "start-up")
	s.setLink(4, false) // split into two halves: unreachable subnets must vanish, not count up
	s.converge(t, time.Second, "partition")
	// Garbage collection deletes the poisoned entries.
	s.clk.Advance(DefaultConfig().GC + time.Second)
	for i, r := range s.routers {
		for _, rt := range r.Routes() {
			if rt.Metric >= Infinity {
				t.Fatalf("router %d still holds %v after garbage collection", i, rt)
			}
		}
	}
}

func TestSplitHorizonPoisonedReverse(t *testing.T) {
	t.Parallel()
	s := newSim(t, 3, line(3))
	s.converge(t, time.Second, "start-up")
	s.sent = nil
	s.clk.Advance(6 * time.Second)   // at least one periodic update from everyone
	far := linkPrefix(1, 0).Masked() // the 1-2 link, learned by router 0 through router 1
	seen := false
	for _, m := range s.sent {
		if m.from != 0 || m.msg.Command != CmdResponse {
			continue
		}
		for _, e := range m.msg.Entries {
			if e.Prefix == far {
				seen = true
				if e.Cost != Infinity {
					t.Fatalf("router 0 advertised %v back to its next hop with cost %d", far, e.Cost)
				}
			}
		}
	}
	if !seen {
		t.Fatal("router 0 never advertised the route back (poisoned reverse missing)")
	}
}

func TestSilentNeighbourExpires(t *testing.T) {
	t.Parallel()
	s := newSim(t, 3, line(3))
	s.converge(t, time.Second, "start-up")
	s.down[0] = true // link 0-1 silently drops everything; interfaces stay up
	s.clk.Advance(11 * time.Second)
	if len(s.tables[0]) != 2 {
		t.Fatalf("route expired too early: %v", s.tables[0])
	}
	s.clk.Advance(2 * time.Second)
	for _, rt := range s.tables[0] {
		if rt.Prefix == linkPrefix(1, 0).Masked() {
			t.Fatalf("route not expired after 13s: still %v", rt)
		}
	}
}

func TestLargeTablesSplitInto64EntryMessages(t *testing.T) {
	t.Parallel()
	var edges [][2]int
	for i := 1; i <= 100; i++ { // a star: router 0 with 100 links
		edges = append(edges, [2]int{0, i})
	}
	s := newSim(t, 101, edges)
	s.converge(t, 2*time.Second, "star")
	for _, m := range s.sent {
		if len(m.msg.Entries) > MaxEntries {
			t.Fatalf("message with %d entries", len(m.msg.Entries))
		}
	}
}

func TestSpoofedSourceIgnored(t *testing.T) {
	t.Parallel()
	s := newSim(t, 2, line(2))
	s.converge(t, time.Second, "start-up")
	before := s.routers[0].Stats().Ignored
	msg := Append(nil, &Message{Command: CmdResponse, Entries: []Entry{{netip.MustParsePrefix("203.0.113.0/24"), 1}}})
	s.routers[0].Input(0, netip.MustParseAddr("198.18.0.99"), msg) // not the neighbour's address
	if s.routers[0].Stats().Ignored != before+1 || len(s.tables[0]) != 1 {
		t.Fatalf("spoofed update accepted: %v", s.tables[0])
	}
}

func TestPassiveInterfaceAdvertisedButSilent(t *testing.T) {
	t.Parallel()
	clk := clock.NewVirtual()
	var sentOn []int
	ifs := []Iface{{Prefix: linkPrefix(0, 0), Peer: linkPrefix(0, 1).Addr(), Up: true},
		{Prefix: linkPrefix(1, 0), Peer: linkPrefix(1, 1).Addr(), Up: true, Passive: true}}
	r := New(clk, DefaultConfig(), ifs, func(i int, _ netip.Addr, b []byte) { sentOn = append(sentOn, i) }, nil)
	r.Start()
	clk.Advance(11 * time.Second)
	for _, i := range sentOn {
		if i == 1 {
			t.Fatal("RIP sent on a passive interface")
		}
	}
	if len(sentOn) == 0 || len(r.Routes()) != 2 {
		t.Fatalf("sent %v, routes %v", sentOn, r.Routes())
	}
}

// A stub subnet behind a triangle of routers: when it goes away, split horizon alone cannot stop
// r0 and r1 from counting to infinity through each other; triggered updates must end it fast.
func TestTriangleLosesStubWithoutLingeringLoop(t *testing.T) {
	t.Parallel()
	s := newSim(t, 4, [][2]int{{0, 1}, {1, 2}, {2, 0}, {2, 3}})
	s.converge(t, time.Second, "start-up")
	s.clk.Advance(3 * time.Second)
	s.setLink(3, false) // r2-r3: the stub
	took := s.converge(t, 2*time.Second, "stub withdrawn")
	t.Logf("withdrawn everywhere after %v", took)
	for i := 0; i < 20; i++ {
		s.clk.Advance(time.Second)
		if err := s.correct(); err != nil {
			t.Fatalf("%ds later: %v", i+1, err)
		}
	}
}

// With only our end of a link down, its subnet is still reachable through the ring: the
// poisoned connected route gives way to a neighbour's at once, not after garbage collection.
func TestDownedInterfaceSubnetLearnedElsewhere(t *testing.T) {
	t.Parallel()
	s := newSim(t, 3, [][2]int{{0, 1}, {1, 2}, {2, 0}})
	s.converge(t, time.Second, "start-up")
	s.routers[0].SetIfaceUp(0, false) // link 0 (to router 1) down at router 0 only
	p := linkPrefix(0, 0).Masked()
	if !s.clk.RunUntil(time.Second, func() bool {
		for _, r := range s.tables[0] {
			if r.Prefix == p && !r.Connected && r.Iface == 1 && r.Metric == 2 {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("router 0 has no route to %v through router 2: %v", p, s.tables[0])
	}
	s.routers[0].SetIfaceUp(0, true)
	for _, r := range s.tables[0] {
		if r.Prefix == p && !r.Connected {
			t.Fatalf("interface back up but %v not connected: %+v", p, r)
		}
	}
}

func TestTableBoundedAgainstFloodingNeighbour(t *testing.T) {
	t.Parallel()
	s := newSim(t, 2, line(2))
	s.converge(t, time.Second, "start-up")
	peer := linkPrefix(0, 1).Addr()
	for k := 0; k < MaxRoutes/MaxEntries+2; k++ {
		m := Message{Command: CmdResponse}
		for e := 0; e < MaxEntries; e++ {
			m.Entries = append(m.Entries, Entry{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(k), byte(e), 0}), 24), 1})
		}
		s.routers[0].Input(0, peer, Append(nil, &m))
	}
	if n := len(s.routers[0].Routes()); n != MaxRoutes || s.routers[0].Stats().TableFull == 0 {
		t.Fatalf("%d routes (limit %d), %d refused", n, MaxRoutes, s.routers[0].Stats().TableFull)
	}
}
