package tcp

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"testing"
	"time"
)

func TestSimultaneousOpen(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	c1, err := a.mux.Dial(a.addr, 5000, b.addr, 6000)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := b.mux.Dial(b.addr, 6000, a.addr, 5000)
	if err != nil {
		t.Fatal(err)
	}
	n.run(10*time.Second, "simultaneous open", func() bool {
		e1, _ := c1.Established()
		e2, _ := c2.Established()
		return e1 && e2
	})
	data := randomData(100000, 5)
	sameData(t, transfer(t, n, c1, c2, data, time.Minute), data)
}

func TestSimultaneousCloseGoesThroughClosing(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	n.keep = true
	c, s := connect(t, n, a, b)
	_ = c.CloseWrite()
	_ = s.CloseWrite() // both FINs cross in flight
	if c.State() != FinWait1 || s.State() != FinWait1 {
		t.Fatalf("states %v %v", c.State(), s.State())
	}
	n.run(time.Second, "closing", func() bool { return c.State() == TimeWait && s.State() == TimeWait })
	sawClosing := false
	_ = sawClosing
	// Both sides time out of TIME-WAIT after 2*MSL and only then.
	n.clk.Advance(2*testConfig().MSL - 100*time.Millisecond)
	if c.State() != TimeWait {
		t.Fatalf("left TIME-WAIT early: %v", c.State())
	}
	n.clk.Advance(time.Second)
	if c.State() != Closed || s.State() != Closed {
		t.Fatalf("after 2MSL: %v %v", c.State(), s.State())
	}
	if len(a.mux.Conns()) != 0 || len(b.mux.Conns()) != 0 {
		t.Fatal("connections not released")
	}
}

func TestActiveCloseAndTimeWaitReacksFIN(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	c, s := connect(t, n, a, b)
	_ = c.Close()
	n.run(time.Second, "fin-wait-2", func() bool { return c.State() == FinWait2 && s.State() == CloseWait })
	// Lose the final ACK: the peer retransmits its FIN and TIME-WAIT must answer it.
	lost := 0
	n.filter = func(from netip.Addr, seg *Segment) action {
		if from == a.addr && seg.Flags == ACK && lost == 0 {
			lost++
			return drop
		}
		return pass
	}
	_ = s.Close()
	n.run(10*time.Second, "last-ack resolved", func() bool { return s.State() == Closed })
	if lost != 1 || c.State() != TimeWait {
		t.Fatalf("lost %d, active closer in %v", lost, c.State())
	}
	if err := s.Err(); err != nil {
		t.Fatalf("passive closer ended with %v", err)
	}
}

func TestHalfCloseKeepsOtherDirection(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	c, s := connect(t, n, a, b)
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	n.run(time.Second, "eof", func() bool { _, err := s.Read(buf); return err == io.EOF })
	if _, err := c.Write([]byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after CloseWrite: %v", err)
	}
	data := randomData(300000, 6)
	sameData(t, transfer(t, n, s, c, data, time.Minute), data)
}

func TestConnectToClosedPortIsRefused(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	c, err := a.mux.Dial(a.addr, 0, b.addr, 81)
	if err != nil {
		t.Fatal(err)
	}
	n.run(time.Second, "refused", func() bool { _, err := c.Established(); return err != nil })
	if _, err := c.Established(); !errors.Is(err, ErrRefused) {
		t.Fatalf("got %v, want ErrRefused", err)
	}
	if b.mux.RSTsSent.Load() != 1 {
		t.Fatal("no RST counted")
	}
}

func TestPortInUse(t *testing.T) {
	t.Parallel()
	_, _, b := newTestNet(t, testConfig())
	if _, err := b.mux.Listen(b.addr, 80); err != nil {
		t.Fatal(err)
	}
	if _, err := b.mux.Listen(netip.Addr{}, 80); !errors.Is(err, ErrPortInUse) {
		t.Fatalf("got %v", err)
	}
}

// injectTo delivers a hand-made segment to h as if from the peer.
func inject(h *testHost, from netip.Addr, s *Segment) {
	pkt := make([]byte, HeaderLen+40+len(s.Payload))
	hl := HeaderLen + OptionsLen(&s.Opts)
	copy(pkt[hl:], s.Payload)
	PutHeader(pkt, s, len(s.Payload), from.As4(), h.addr.As4())
	h.mux.Input(from, h.addr, pkt[:hl+len(s.Payload)], nil)
}

func TestRSTChallengeACK(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	n.keep = true
	c, s := connect(t, n, a, b)
	id := s.ID()
	// In-window but not exactly RCV.NXT: RFC 5961 3.2 says challenge, do not reset.
	inject(b, a.addr, &Segment{SrcPort: id.RemotePort, DstPort: id.LocalPort, Seq: s.rcvNxt.Add(100), Flags: RST})
	if s.State() != Established || s.Info().Stats.ChallengeAcks != 1 {
		t.Fatalf("in-window RST: state %v challenges %d", s.State(), s.Info().Stats.ChallengeAcks)
	}
	// SYN on an established connection: also a challenge ACK (RFC 5961 4).
	inject(b, a.addr, &Segment{SrcPort: id.RemotePort, DstPort: id.LocalPort, Seq: s.rcvNxt.Add(5), Flags: SYN})
	if s.State() != Established || s.Info().Stats.ChallengeAcks != 2 {
		t.Fatalf("SYN: state %v", s.State())
	}
	// Out of window: silently dropped.
	inject(b, a.addr, &Segment{SrcPort: id.RemotePort, DstPort: id.LocalPort, Seq: s.rcvNxt.Add(-1 << 30), Flags: RST})
	if s.State() != Established {
		t.Fatal("out-of-window RST accepted")
	}
	// Exact: reset.
	inject(b, a.addr, &Segment{SrcPort: id.RemotePort, DstPort: id.LocalPort, Seq: s.rcvNxt, Flags: RST})
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, ErrReset) {
		t.Fatalf("exact RST: read error %v", err)
	}
	_ = c
}

func TestZeroWindowPersistProbes(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.RecvBuf = 64 << 10
	n, a, b := newTestNet(t, cfg)
	c, s := connect(t, n, a, b)
	data := randomData(1<<20, 7)
	off := 0
	// Nobody reads: the window closes, the sender must probe, with backoff, and not give up.
	n.run(time.Minute, "fill", func() bool {
		k, _ := c.Write(data[off:])
		off += k
		return c.Info().SndWnd == 0 && s.Buffered() > cfg.RecvBuf-2*1460
	})
	n.clk.Advance(5 * time.Minute)
	st := c.Info()
	if st.Stats.ZeroWindowProbes < 3 || st.Stats.ZeroWindowProbes > 20 || st.State != Established {
		t.Fatalf("probes %d (want backoff: a few, not hundreds), state %v", st.Stats.ZeroWindowProbes, st.State)
	}
	// Reading reopens the window and the rest flows.
	rest := transfer(t, n, c, s, data[off:], time.Minute)
	if len(rest) != len(data) { // buffered data came out first
		t.Fatalf("got %d bytes of %d", len(rest), len(data))
	}
	sameData(t, rest, data)
}

func TestRTOBackoffFloorAndTimeout(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.MinRTO = 300 * time.Millisecond
	cfg.MaxRetries = 5
	cfg.SACK = false // no tail loss probe: this test is about the RTO alone
	n, a, b := newTestNet(t, cfg)
	c, _ := connect(t, n, a, b)
	if rto := c.Info().RTO; rto != cfg.MinRTO {
		t.Fatalf("rto %v on a 10ms-rtt link, want the floor %v", rto, cfg.MinRTO)
	}
	n.filter = func(netip.Addr, *Segment) action { return drop }
	var times []time.Duration
	n.keep = true
	last := len(n.sent)
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	n.run(10*time.Minute, "give up", func() bool {
		if len(n.sent) > last {
			times = append(times, n.clk.Now())
			last = len(n.sent)
		}
		return c.State() == Closed
	})
	if !errors.Is(c.Err(), ErrTimeout) {
		t.Fatalf("err %v", c.Err())
	}
	for i := 2; i < len(times); i++ {
		gap, prev := times[i]-times[i-1], times[i-1]-times[i-2]
		if gap < 2*prev-time.Millisecond || gap > 2*prev+time.Millisecond {
			t.Fatalf("retransmission gaps %v not doubling", times)
		}
	}
	if len(times) != cfg.MaxRetries+1 {
		t.Fatalf("%d transmissions, want %d", len(times), cfg.MaxRetries+1)
	}
}

func TestNagleCoalescesSmallWrites(t *testing.T) {
	t.Parallel()
	for _, nagle := range []bool{true, false} {
		cfg := testConfig()
		cfg.Nagle = nagle
		n, a, b := newTestNet(t, cfg)
		c, s := connect(t, n, a, b)
		n.keep = true
		n.sent = nil
		for i := 0; i < 50; i++ {
			if _, err := c.Write([]byte("ab")); err != nil {
				t.Fatal(err)
			}
		}
		buf := make([]byte, 200)
		got := 0
		n.run(time.Second, "small writes", func() bool { k, _ := s.Read(buf); got += k; return got == 100 })
		data := 0
		for _, seg := range n.sent {
			if seg.SrcPort == c.id.LocalPort && seg.Len() > 0 {
				data++
			}
		}
		if nagle && data > 3 || !nagle && data != 50 {
			t.Fatalf("nagle=%v: %d data segments for 50 writes", nagle, data)
		}
	}
}

func TestDelayedAck(t *testing.T) {
	t.Parallel()
	for _, delayed := range []bool{true, false} {
		cfg := testConfig()
		cfg.DelayedAck = delayed
		n, a, b := newTestNet(t, cfg)
		c, s := connect(t, n, a, b)
		n.keep = true
		n.sent = nil
		_, _ = c.Write([]byte("one segment"))
		n.clk.Advance(n.delay + time.Millisecond) // segment arrived
		acks := func() int {
			k := 0
			for _, seg := range n.sent {
				if seg.SrcPort == s.id.LocalPort && seg.Flags == ACK {
					k++
				}
			}
			return k
		}
		if delayed && acks() != 0 || !delayed && acks() != 1 {
			t.Fatalf("delayed=%v: %d ACKs right after one segment", delayed, acks())
		}
		n.clk.Advance(cfg.AckDelay)
		if acks() != 1 {
			t.Fatalf("delayed=%v: %d ACKs after the ack delay", delayed, acks())
		}
	}
}

func TestKeepaliveDetectsDeadPeer(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	n, a, b := newTestNet(t, cfg)
	c, s := connect(t, n, a, b)
	c.SetKeepAlive(true, time.Minute)
	n.clk.Advance(3 * time.Minute)
	if c.State() != Established || c.Info().Stats.KeepAlivesSent == 0 {
		t.Fatalf("keepalive against a live peer: %v, %d probes", c.State(), c.Info().Stats.KeepAlivesSent)
	}
	n.filter = func(netip.Addr, *Segment) action { return drop }
	n.run(time.Hour, "keepalive timeout", func() bool { return c.State() == Closed })
	if !errors.Is(c.Err(), ErrTimeout) {
		t.Fatalf("err %v", c.Err())
	}
	_ = s
}

func TestOptionsOffWhenPeerLacksThem(t *testing.T) {
	t.Parallel()
	n, a, _ := newTestNet(t, testConfig())
	old := testConfig()
	old.SACK, old.Timestamps, old.WindowScale = false, false, false
	b := n.add("198.18.0.3", old)
	c, s := connect(t, n, a, b)
	for _, ci := range []Info{c.Info(), s.Info()} {
		if ci.SACK || ci.Timestamps || ci.WScale != [2]uint8{} {
			t.Fatalf("options negotiated with a peer that has none: %+v", ci)
		}
	}
	if c.Info().MSS != 1460 {
		t.Fatalf("mss %d", c.Info().MSS)
	}
	data := randomData(500000, 8)
	sameData(t, transfer(t, n, c, s, data, time.Minute), data)
}

func TestCloseWithUnreadDataResets(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	c, s := connect(t, n, a, b)
	_, _ = c.Write([]byte("unread"))
	n.clk.Advance(time.Second)
	_ = s.Close()
	n.run(time.Second, "reset", func() bool { return c.State() == Closed })
	if !errors.Is(c.Err(), ErrReset) {
		t.Fatalf("err %v", c.Err())
	}
}

func TestInvalidStateAndClosed(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	c, s := connect(t, n, a, b)
	_ = c.Close()
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	closeBoth(t, n, c, s)
}

func TestListenBacklogAndAcceptMany(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	n, a, b := newTestNet(t, cfg)
	l, _ := b.mux.Listen(netip.Addr{}, 80)
	var cs []*Conn
	for i := 0; i < 300; i++ {
		c, err := a.mux.Dial(a.addr, 0, b.addr, 80)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	accepted := 0
	n.run(5*time.Minute, "accept all", func() bool {
		for {
			if _, err := l.Accept(); err != nil {
				break
			}
			accepted++
		}
		return accepted == len(cs)
	})
	if b.mux.ListenOverflow.Load() == 0 {
		t.Fatal("backlog of 128 never overflowed with 300 simultaneous SYNs")
	}
}

func TestFinWait2TimesOutAfterClose(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	c, s := connect(t, n, a, b)
	_ = c.Close()
	n.run(time.Second, "fin-wait-2", func() bool { return c.State() == FinWait2 })
	n.clk.Advance(2*testConfig().MSL + time.Second) // the peer never closes
	if c.State() != Closed || len(a.mux.Conns()) != 0 {
		t.Fatalf("orphaned FIN-WAIT-2 kept: %v", c.State())
	}
	_ = s
}

func TestTailLossProbeAvoidsTimeout(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	c, s := connect(t, n, a, b)
	data := randomData(100*1448, 11)
	last := c.iss.Add(1 + len(data) - 1448) // the final full segment
	dropped := 0
	n.filter = func(from netip.Addr, seg *Segment) action {
		if from == a.addr && len(seg.Payload) > 0 && seg.Seq.GEQ(last.Add(-2*1448)) && dropped < 3 {
			dropped++ // the last three segments, each once
			return drop
		}
		return pass
	}
	start := n.clk.Now()
	off := 0
	buf := make([]byte, 1<<20)
	got := 0
	n.run(10*time.Second, "tail", func() bool {
		k, _ := c.Write(data[off:])
		off += k
		r, _ := s.Read(buf)
		got += r
		return got == len(data)
	})
	st := c.Info().Stats
	if dropped != 3 || st.Timeouts != 0 || st.TailLossProbes == 0 {
		t.Fatalf("dropped %d, timeouts %d, probes %d: tail loss must be repaired by a probe", dropped, st.Timeouts, st.TailLossProbes)
	}
	if took := n.clk.Now() - start; took > 150*time.Millisecond {
		t.Fatalf("took %v: no faster than the RTO", took)
	}
}

func TestLostRetransmissionDetectedWithoutTimeout(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.SendBuf, cfg.RecvBuf = 4<<20, 4<<20 // room to send new data during recovery
	n, a, b := newTestNet(t, cfg)
	c, s := connect(t, n, a, b)
	target := c.iss.Add(1 + 300*1448)
	seen := 0
	n.filter = func(from netip.Addr, seg *Segment) action {
		if from == a.addr && seg.Seq == target && len(seg.Payload) > 0 && seen < 2 {
			seen++ // the segment and its first retransmission
			return drop
		}
		return pass
	}
	data := randomData(2000*1448, 12)
	sameData(t, transfer(t, n, c, s, data, time.Minute), data)
	st := c.Info().Stats
	if seen != 2 || st.Timeouts != 0 || st.LostRetransmits == 0 {
		t.Fatalf("dropped %d, timeouts %d, lost retransmissions detected %d", seen, st.Timeouts, st.LostRetransmits)
	}
}

func TestTimeWaitReusedByNewerSYNAndIgnoresRST(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	l, _ := b.mux.Listen(b.addr, 80)
	c, err := a.mux.Dial(a.addr, 4000, b.addr, 80)
	if err != nil {
		t.Fatal(err)
	}
	var s *Conn
	n.run(time.Second, "accept", func() bool { s, _ = l.Accept(); return s != nil })
	_ = s.Close() // the server closes first and keeps TIME-WAIT
	n.run(time.Second, "fin", func() bool { return c.State() == CloseWait })
	_ = c.Close()
	n.run(time.Second, "time-wait", func() bool { return s.State() == TimeWait && c.State() == Closed })
	id := s.ID()
	inject(b, a.addr, &Segment{SrcPort: id.RemotePort, DstPort: id.LocalPort, Seq: s.rcvNxt, Flags: RST})
	if s.State() != TimeWait {
		t.Fatal("RST ended TIME-WAIT (RFC 1337)")
	}
	c2, err := a.mux.Dial(a.addr, 4000, b.addr, 80) // same four-tuple, newer timestamps
	if err != nil {
		t.Fatal(err)
	}
	n.run(time.Second, "reopen", func() bool { ok, _ := c2.Established(); return ok })
}

// A data segment that also carries SACK blocks has less room for payload: the sender must send
// fewer bytes, account for exactly what it sent, and put its FIN after the last byte.
func TestSACKOptionsShrinkPayloadNotStream(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	c, s := connect(t, n, a, b)
	dropped := false
	n.filter = func(from netip.Addr, seg *Segment) action {
		if from == a.addr && !dropped && len(seg.Payload) > 0 {
			dropped = true // a hole at s: its segments now carry SACK blocks
			return drop
		}
		return pass
	}
	if _, err := c.Write(randomData(20*1448, 11)); err != nil {
		t.Fatal(err)
	}
	n.run(time.Second, "hole at receiver", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.ooo.runs) > 0
	})
	// s answers with full-sized segments and a FIN while it still reports the hole.
	want := randomData(14*1448, 12) // more than the initial window: the FIN rides on a later segment
	if k, err := s.Write(want); err != nil || k != len(want) {
		t.Fatal(k, err)
	}
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	buf := make([]byte, 64<<10)
	n.run(time.Minute, "read to EOF", func() bool { return drain(t, c, buf, &got) })
	sameData(t, got.Bytes(), want)
}

// With our receive window shut, a segment at RCV.NXT still delivers its ACK (RFC 9293 3.10.7.4):
// its data is dropped, and the probe is answered at once.
func TestZeroWindowStillProcessesACK(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.RecvBuf = 64 << 10
	n, a, b := newTestNet(t, cfg)
	c, s := connect(t, n, a, b)
	data := randomData(1<<20, 13)
	off := 0
	n.run(time.Minute, "fill", func() bool {
		k, _ := c.Write(data[off:])
		off += k
		return s.Info().RcvWnd == 0 && s.rcvBuf.Free() == 0
	})
	// s has data of its own in flight towards c; only c's probe (below) acknowledges it.
	n.filter = func(from netip.Addr, _ *Segment) action {
		if from == a.addr {
			return drop
		}
		return pass
	}
	if _, err := s.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	n.clk.Advance(100 * time.Millisecond)
	una := s.Info().InFlight
	id := s.ID()
	s.mu.Lock()
	probe := Segment{SrcPort: id.RemotePort, DstPort: id.LocalPort, Seq: s.rcvNxt, Ack: s.sndMax, Flags: ACK,
		Window: 1000, Payload: []byte{1}, Opts: Options{HasTS: true, TSVal: s.tsRecent + 1}}
	buffered := s.rcvBuf.Len()
	s.mu.Unlock()
	inject(b, a.addr, &probe)
	st := s.Info()
	if st.InFlight != 0 || una == 0 {
		t.Fatalf("ACK in a zero-window probe ignored: in flight %d before, %d after", una, st.InFlight)
	}
	if st.RcvBuffer != buffered {
		t.Fatalf("probe data accepted into a full buffer: %d -> %d", buffered, st.RcvBuffer)
	}
}

// A peer announcing an absurdly small MSS (the SACK-panic pattern, CVE-2019-11477) gets
// Linux's floor of 88 bytes, so segment sizes stay positive with every option on.
func TestTinyPeerMSSIsClamped(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	l, err := b.mux.Listen(b.addr, 80)
	if err != nil {
		t.Fatal(err)
	}
	syn := Segment{SrcPort: 4000, DstPort: 80, Seq: 1000, Flags: SYN, Window: 65535,
		Opts: Options{HasMSS: true, MSS: 1, SACKPermitted: true, HasTS: true, TSVal: 1, HasWScale: true, WScale: 7}}
	inject(b, a.addr, &syn)
	var s *Conn
	for _, c := range b.mux.Conns() {
		s = c
	}
	if s == nil {
		t.Fatal("no connection for the SYN")
	}
	s.mu.Lock()
	ack := Segment{SrcPort: 4000, DstPort: 80, Seq: 1001, Ack: s.iss.Add(1), Flags: ACK, Window: 65535,
		Opts: Options{HasTS: true, TSVal: 2}}
	s.mu.Unlock()
	inject(b, a.addr, &ack)
	if _, err := l.Accept(); err != nil {
		t.Fatal(err)
	}
	// A hole at s, so its segments carry SACK blocks too.
	hole := Segment{SrcPort: 4000, DstPort: 80, Seq: 1101, Ack: s.iss.Add(1), Flags: ACK, Window: 65535,
		Payload: []byte("x"), Opts: Options{HasTS: true, TSVal: 3}}
	inject(b, a.addr, &hole)
	if _, err := s.Write(make([]byte, 10000)); err != nil {
		t.Fatal(err)
	}
	n.clk.Advance(time.Second)
	if in := s.Info(); in.MSS != 88-12 {
		t.Fatalf("mss %d, want 76 (88 less timestamps)", in.MSS)
	}
}
