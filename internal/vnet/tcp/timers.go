package tcp

import (
	"time"

	"github.com/flowplane/flowplane/internal/vnet/clock"
)

// ltimer is a lazily re-armed deadline: set only records the deadline unless the underlying
// timer would fire too late, so restarting the retransmission timer on every ACK costs nothing.
type ltimer struct {
	c        *Conn
	t        clock.Timer
	fn       func()
	deadline time.Duration // 0: stopped
	armedAt  time.Duration // when the underlying timer fires; valid if armed
	armed    bool
}

func (lt *ltimer) init(c *Conn, fn func()) { lt.c, lt.fn = c, fn }

func (lt *ltimer) set(at time.Duration) {
	if at <= 0 {
		at = 1
	}
	lt.deadline = at
	if lt.armed && lt.armedAt <= at {
		return
	}
	lt.arm(at)
}

func (lt *ltimer) arm(at time.Duration) {
	clk := lt.c.mux.host.Clock()
	d := at - clk.Now()
	lt.armed, lt.armedAt = true, at
	if lt.t == nil {
		lt.t = clk.AfterFunc(d, lt.fire)
	} else {
		lt.t.Reset(d)
	}
}

func (lt *ltimer) stop() { lt.deadline = 0 }

// release stops the timer for good, underlying timer included, so a closed connection is not
// kept alive (and woken) by a retransmission or TIME-WAIT timer armed long ago.
func (lt *ltimer) release() {
	lt.deadline = 0
	if lt.armed {
		lt.t.Stop()
		lt.armed = false
	}
}

func (lt *ltimer) active() bool { return lt.deadline != 0 }

func (lt *ltimer) fire() {
	c := lt.c
	c.mu.Lock()
	defer c.mu.Unlock()
	lt.armed = false
	if lt.deadline == 0 {
		return
	}
	if now := c.now(); now < lt.deadline {
		lt.arm(lt.deadline)
		return
	}
	lt.deadline = 0
	lt.fn()
}

// armRtx (re)starts the retransmission timer at RTO with backoff.
func (c *Conn) armRtx() {
	if p := c.pto(); p > 0 {
		c.rtxTimer.set(c.now() + p)
		return
	}
	c.rtxTimer.set(c.now() + c.currentRTO())
}

func (c *Conn) currentRTO() time.Duration {
	rto := c.rto << min(c.backoff, 16)
	return min(rto, c.cfg.MaxRTO)
}

// onRtxTimer handles the retransmission timeout (RFC 6298 5.4-5.7) and persist probes.
func (c *Conn) onRtxTimer() {
	switch c.state {
	case Closed, Listen, TimeWait:
		return
	}
	if c.persisting() {
		c.sendProbe()
		return
	}
	if c.sndUna == c.sndMax {
		return // nothing outstanding
	}
	if c.pto() > 0 {
		c.sendTLP()
		return
	}
	limit := c.cfg.MaxRetries
	if c.sndWnd == 0 && c.state != SynSent && c.state != SynReceived && c.retries <= limit {
		// Our probe is outstanding against a zero window: probe again, with persist backoff.
		// Every ACK the peer sends resets retries, so a live peer is probed forever.
		c.retries++
		c.stats.ZeroWindowProbes++
		c.retransmit(c.sndUna, 1)
		c.persistBackoff++
		c.rtxTimer.set(c.now() + min(c.rto<<min(c.persistBackoff, 16), c.cfg.MaxRTO))
		return
	}
	if c.state == SynSent || c.state == SynReceived {
		limit = c.cfg.SynRetries
	}
	c.retries++
	if c.retries > limit {
		if c.state == SynReceived && c.passive {
			c.destroy(ErrTimeout)
			return
		}
		c.destroy(ErrTimeout)
		return
	}
	c.stats.Timeouts++
	c.backoff++
	c.rttTiming = false // Karn: no samples from retransmitted data
	if c.state == SynSent {
		c.sendSyn(false)
		c.armRtx()
		return
	}
	if c.state == SynReceived {
		c.sendSyn(true)
		c.armRtx()
		return
	}
	c.ccs.InFlight = c.sndMax.Diff(c.sndUna)
	c.ccs.Now = c.now()
	c.cc.OnTimeout(&c.ccs)
	c.inRecovery, c.inflate, c.dupAcks = false, 0, 0
	c.rxts, c.tlpOut, c.forcing = c.rxts[:0], false, false
	c.recover = c.sndMax // RFC 6582 4: no fast retransmit for data sent before the timeout
	c.sndNxt = c.sndUna
	c.output()
	if !c.rtxTimer.active() {
		c.armRtx()
	}
}

// persisting reports whether the peer's window stops us sending queued data with nothing in
// flight: a zero window, or one too small for sender SWS avoidance. Either way only a timer
// (persist, and the SWS override timer of RFC 9293 3.8.6.2.1) can move things on.
func (c *Conn) persisting() bool {
	return c.sndNxt == c.sndUna && c.unsent() > 0 && c.sndWnd < min(c.unsent(), c.mss)
}

// sendProbe sends a zero-window probe: one byte of new data (RFC 9293 3.8.6.1), backing off
// exponentially; the probe is never given up on while the peer keeps acknowledging.
func (c *Conn) sendProbe() {
	n := max(1, min(c.sndWnd, c.unsent(), c.mss))
	if c.sndWnd == 0 {
		c.stats.ZeroWindowProbes++
	}
	c.sndNxt = c.sndNxt.Add(c.sendData(c.sndNxt, n, false))
	c.sndMax = maxSeq(c.sndMax, c.sndNxt)
	c.persistBackoff++
	c.rtxTimer.set(c.now() + min(c.rto<<min(c.persistBackoff, 16), c.cfg.MaxRTO))
}

func (c *Conn) onDelack() {
	if c.ackPending || c.unackedSegs > 0 {
		c.stats.DelayedAcks++
		c.sendAck()
	}
}

func (c *Conn) onKeepalive() {
	if !c.cfg.KeepAlive || (c.state != Established && c.state != CloseWait) {
		return
	}
	if c.kaProbes >= c.cfg.KeepCount {
		c.destroy(ErrTimeout)
		return
	}
	c.kaProbes++
	c.stats.KeepAlivesSent++
	c.sendFlags(c.sndUna.Add(-1), ACK) // seq one below: forces the peer to answer with an ACK
	c.armKeepalive()
}

func (c *Conn) onTimeWait() {
	switch c.state {
	case TimeWait:
		c.destroy(nil)
	case FinWait2:
		c.destroy(ErrTimeout)
	}
}

func (c *Conn) enterTimeWait() {
	c.setState(TimeWait)
	c.rtxTimer.stop()
	c.kaTimer.stop()
	c.twTimer.set(c.now() + 2*c.cfg.MSL)
}
