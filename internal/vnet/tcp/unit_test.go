package tcp

import (
	"net/netip"
	"testing"
	"time"
)

func TestSeqWraparoundComparisons(t *testing.T) {
	t.Parallel()
	a, b := Seq(0xfffffff0), Seq(0x10)
	if !a.LT(b) || !b.GT(a) || b.Diff(a) != 0x20 || a.Add(0x20) != b {
		t.Fatal("comparisons across 2^32 wrong")
	}
}

func TestRenoWindowRules(t *testing.T) {
	t.Parallel()
	r := &Reno{}
	s := CCState{MSS: 1000}
	r.Init(&s)
	if s.Cwnd != 10000 {
		t.Fatalf("initial window %d, want 10 segments (RFC 6928)", s.Cwnd)
	}
	r.OnAck(&s, 5000, 0)
	if s.Cwnd != 12000 { // slow start with ABC L=2: at most 2 MSS per ACK
		t.Fatalf("slow start: %d", s.Cwnd)
	}
	s.InFlight = 20000
	r.OnCongestion(&s)
	if s.Ssthresh != 10000 || s.Cwnd != 10000 {
		t.Fatalf("loss: ssthresh %d cwnd %d, want flight/2", s.Ssthresh, s.Cwnd)
	}
	for i := 0; i < 10; i++ { // one window of ACKs in congestion avoidance: +1 MSS
		r.OnAck(&s, 1000, 0)
	}
	if s.Cwnd != 11000 {
		t.Fatalf("congestion avoidance: %d", s.Cwnd)
	}
	s.InFlight = 11000
	r.OnTimeout(&s)
	if s.Cwnd != 1000 || s.Ssthresh != 5500 {
		t.Fatalf("timeout: cwnd %d ssthresh %d", s.Cwnd, s.Ssthresh)
	}
}

func TestCubicBacksOffByBetaAndRegrows(t *testing.T) {
	t.Parallel()
	c := &Cubic{}
	s := CCState{MSS: 1000, SRTT: 10 * time.Millisecond}
	c.Init(&s)
	s.Cwnd, s.Ssthresh = 100000, 1<<30
	c.OnCongestion(&s)
	if s.Cwnd != 70000 {
		t.Fatalf("cwnd after loss %d, want beta 0.7 of 100000", s.Cwnd)
	}
	// Feed ACKs for 2 s of virtual time: the window must climb back to W_max and beyond.
	for i := 0; i < 2000; i++ {
		s.Now += time.Millisecond
		c.OnAck(&s, 10000, s.SRTT)
	}
	if s.Cwnd <= 100000 {
		t.Fatalf("cwnd %d did not regrow past W_max", s.Cwnd)
	}
}

func TestScoreboardAndLossBoundary(t *testing.T) {
	t.Parallel()
	var sb scoreboard
	una, max := Seq(1000), Seq(20000)
	sb.Add(Block{5000, 6000}, una, max)
	sb.Add(Block{7000, 9000}, una, max)
	sb.Add(Block{6000, 7000}, una, max) // merges the two
	if len(sb.blocks) != 1 || sb.blocks[0] != (Block{5000, 9000}) {
		t.Fatalf("blocks %v", sb.blocks)
	}
	sb.Add(Block{100, 200}, una, max) // below SND.UNA: ignored
	sb.Add(Block{30000, 31000}, una, max)
	if len(sb.blocks) != 1 {
		t.Fatalf("bogus blocks kept: %v", sb.blocks)
	}
	// 4000 bytes SACKed, MSS 1000: bytes below 9000-2000 have > 2 MSS SACKed above.
	if l := sb.lostBelow(una, 1000); l != 7000 {
		t.Fatalf("lost boundary %d", l)
	}
	if n := sb.unsacked(1000, 10000); n != 5000 {
		t.Fatalf("unsacked %d", n)
	}
	sb.Ack(6000)
	if sb.blocks[0] != (Block{6000, 9000}) {
		t.Fatalf("after ack %v", sb.blocks)
	}
}

func TestOutOfOrderQueueMergesAndReportsSACK(t *testing.T) {
	t.Parallel()
	var q oooQueue
	q.Insert(300, make([]byte, 100))
	q.Insert(100, make([]byte, 100))
	q.Insert(150, make([]byte, 200)) // bridges both
	if len(q.runs) != 1 || q.runs[0].seq != 100 || len(q.runs[0].data) != 300 || q.bytes != 300 {
		t.Fatalf("runs %+v bytes %d", q.runs, q.bytes)
	}
	q.Insert(1000, []byte("x"))
	var blocks [4]Block
	if n := q.Blocks(blocks[:3]); n != 2 || blocks[0] != (Block{1000, 1001}) {
		t.Fatalf("sack blocks %v (latest first)", blocks[:n])
	}
	if d := q.PopAt(150); len(d) != 250 {
		t.Fatalf("pop trimmed %d", len(d))
	}
}

func TestRTTEstimatorRFC6298(t *testing.T) {
	t.Parallel()
	n, a, _ := newTestNet(t, testConfig())
	c := newConn(a.mux, Tuple{a.addr, 1, netip.MustParseAddr("198.18.0.2"), 2})
	_ = n
	c.updateRTT(100 * time.Millisecond)
	if c.srtt != 100*time.Millisecond || c.rttvar != 50*time.Millisecond || c.rto != 300*time.Millisecond {
		t.Fatalf("first sample: srtt %v rttvar %v rto %v", c.srtt, c.rttvar, c.rto)
	}
	c.updateRTT(200 * time.Millisecond)
	if c.srtt != 112500*time.Microsecond || c.rttvar != 62500*time.Microsecond {
		t.Fatalf("second sample: srtt %v rttvar %v", c.srtt, c.rttvar)
	}
	c.updateRTT(time.Millisecond)
	for i := 0; i < 50; i++ {
		c.updateRTT(time.Millisecond)
	}
	if c.rto != c.cfg.MinRTO {
		t.Fatalf("rto %v below the floor %v", c.rto, c.cfg.MinRTO)
	}
}

func TestPAWSDropsOldTimestamp(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	_, s := connect(t, n, a, b)
	id := s.ID()
	old := Segment{SrcPort: id.RemotePort, DstPort: id.LocalPort, Seq: s.rcvNxt, Ack: s.sndNxt, Flags: ACK, Window: 100,
		Payload: []byte("stale"), Opts: Options{HasTS: true, TSVal: s.tsRecent - 1000}}
	inject(b, a.addr, &old)
	if s.Info().Stats.PAWSDropped != 1 || s.Buffered() != 0 {
		t.Fatalf("segment with an old timestamp accepted")
	}
}

func TestRingGrowsAndWraps(t *testing.T) {
	t.Parallel()
	r := newRing(100000)
	if len(r.buf) != ringStart || r.Cap() != 100000 {
		t.Fatalf("start %d cap %d", len(r.buf), r.Cap())
	}
	src := randomData(300000, 13)
	var out []byte
	in := 0
	buf := make([]byte, 7777)
	for len(out) < len(src) {
		in += r.Write(src[in:min(in+12345, len(src))])
		k := r.Read(buf)
		out = append(out, buf[:k]...)
	}
	sameData(t, out, src)
	if len(r.buf) > r.Cap() || r.Free() != r.Cap() {
		t.Fatalf("buffer %d cap %d free %d", len(r.buf), r.Cap(), r.Free())
	}
}

// Out-of-order data extends runs in place and the number of holes is bounded, so a peer
// scattering single bytes cannot make the receiver allocate per byte without limit.
func TestOutOfOrderQueueBoundsHoles(t *testing.T) {
	t.Parallel()
	var q oooQueue
	for k := 0; k < 2*maxRuns; k++ {
		q.Insert(Seq(1000+2*k), []byte{byte(k)})
	}
	if len(q.runs) != maxRuns || q.bytes != maxRuns {
		t.Fatalf("%d runs, %d bytes; want both %d", len(q.runs), q.bytes, maxRuns)
	}
	var r oooQueue
	r.Insert(100, []byte("ab"))
	r.Insert(102, []byte("cd"))
	r.Insert(101, []byte("bcde"))
	if len(r.runs) != 1 || string(r.runs[0].data) != "abcde" || r.bytes != 5 {
		t.Fatalf("runs %+v, bytes %d", r.runs, r.bytes)
	}
	var sb scoreboard
	for k := 0; k < 2*maxRuns; k++ {
		sb.Add(Block{Seq(1000 + 2*k), Seq(1001 + 2*k)}, 0, 1<<20)
	}
	if len(sb.blocks) != maxRuns {
		t.Fatalf("scoreboard kept %d blocks, want %d", len(sb.blocks), maxRuns)
	}
}
