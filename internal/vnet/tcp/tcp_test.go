package tcp

import (
	"net/netip"
	"testing"
	"time"
)

func TestHandshakeAndTransfer(t *testing.T) {
	t.Parallel()
	n, a, b := newTestNet(t, testConfig())
	c, s := connect(t, n, a, b)
	if ci := c.Info(); !ci.SACK || !ci.Timestamps || ci.WScale[1] == 0 {
		t.Fatalf("options not negotiated: %+v", ci)
	}
	data := randomData(1<<20, 1)
	got := transfer(t, n, c, s, data, time.Minute)
	sameData(t, got, data)
	if st := c.Info().Stats; st.Retransmits != 0 || st.Timeouts != 0 {
		t.Fatalf("retransmissions on a perfect link: %+v", st)
	}
}

func closeBoth(t *testing.T, n *testNet, c, s *Conn) {
	t.Helper()
	_ = c.Close()
	_ = s.Close()
	n.run(5*time.Minute, "teardown", func() bool { return c.State() == Closed && s.State() == Closed })
}

func TestTransferAcrossSequenceWraparound(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	isn := uint32(0xffffffff - 100000)
	cfg.ISN = func() uint32 { isn += 1000; return isn }
	n, a, b := newTestNet(t, cfg)
	c, s := connect(t, n, a, b)
	data := randomData(3<<20, 2)
	sameData(t, transfer(t, n, c, s, data, time.Minute), data)
	sameData(t, transfer(t, n, s, c, data, time.Minute), data)
}

func TestLossyLinkAllRecoveryModes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cc   string
		sack bool
	}{{"reno-sack", "reno", true}, {"cubic-sack", "cubic", true}, {"reno-newreno", "reno", false}, {"cubic-newreno", "cubic", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.CC, cfg.SACK = tc.cc, tc.sack
			n, a, b := newTestNet(t, cfg)
			c, s := connect(t, n, a, b)
			n.loss, n.dup, n.reord = 0.02, 0.01, 0.02
			data := randomData(2<<20, 3)
			sameData(t, transfer(t, n, c, s, data, 10*time.Minute), data)
			st := c.Info().Stats
			if st.Retransmits == 0 || st.FastRetransmits == 0 {
				t.Fatalf("no loss recovery seen: %+v", st)
			}
			t.Logf("%s: %+v", tc.name, st)
		})
	}
}

func TestFastRetransmitOnSingleLoss(t *testing.T) {
	t.Parallel()
	for _, sack := range []bool{true, false} {
		cfg := testConfig()
		cfg.SACK = sack
		n, a, b := newTestNet(t, cfg)
		c, s := connect(t, n, a, b)
		dropped := false
		n.filter = func(from netip.Addr, seg *Segment) action {
			if !dropped && len(seg.Payload) > 0 && seg.Seq.Diff(c.iss) > 200000 {
				dropped = true
				return drop
			}
			return pass
		}
		data := randomData(1<<20, 4)
		sameData(t, transfer(t, n, c, s, data, time.Minute), data)
		st := c.Info().Stats
		if !dropped || st.FastRetransmits != 1 || st.Timeouts != 0 {
			t.Fatalf("sack=%v: want one fast retransmit and no timeout: %+v", sack, st)
		}
	}
}
