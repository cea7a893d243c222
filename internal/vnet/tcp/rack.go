package tcp

import "time"

// Two additions from RACK-TLP (RFC 8985) that matter most when the RTT is tiny next to the RTO
// floor, as on loopback: a lost retransmission is detected from SACKs of data sent after it
// (instead of waiting for the RTO), and a tail loss probe retransmits the last segment after
// about two RTTs of silence so the SACK it draws starts fast recovery.

// rxtRec remembers a retransmission during SACK recovery: the range and SND.MAX at the time,
// so data sent later that gets SACKed proves the retransmission lost.
type rxtRec struct{ lo, hi, mark Seq }

func (c *Conn) noteRetransmit(lo, hi Seq) {
	if c.sackOK && c.inRecovery && len(c.rxts) < 1024 {
		c.rxts = append(c.rxts, rxtRec{lo, hi, c.sndMax})
	}
}

// detectLostRetransmits re-opens retransmitted ranges that are still missing although more than
// DupThresh segments sent after them have been SACKed.
func (c *Conn) detectLostRetransmits() {
	k := 0
	for _, r := range c.rxts {
		if r.hi.LEQ(c.sndUna) {
			continue
		}
		if sacked, _ := c.sb.Sacked(maxSeq(r.lo, c.sndUna)); sacked {
			continue
		}
		if c.sb.bytesAbove(r.mark) >= dupThresh*c.mss {
			c.stats.LostRetransmits++
			if lo := maxSeq(r.lo, c.sndUna); lo.LT(c.highRxt) {
				c.highRxt = lo // NextSeg sends it again
			}
			continue
		}
		c.rxts[k] = r
		k++
	}
	c.rxts = c.rxts[:k]
}

// pto is the probe timeout (RFC 8985 7.2), or 0 when no probe should be scheduled.
func (c *Conn) pto() time.Duration {
	if !c.sackOK || c.inRecovery || c.tlpOut || c.srtt == 0 || c.sndWnd == 0 || c.backoff > 0 {
		return 0
	}
	switch c.state {
	case Established, CloseWait, FinWait1, Closing, LastAck:
	default:
		return 0
	}
	p := max(2*c.srtt, 10*time.Millisecond)
	if c.sndMax.Diff(c.sndUna) <= c.mss {
		p = max(p, c.srtt*3/2+200*time.Millisecond) // the peer may delay its ACK of one segment
	}
	if p >= c.currentRTO() {
		return 0
	}
	return p
}

// sendTLP retransmits the last segment in flight as a loss probe.
func (c *Conn) sendTLP() {
	c.stats.TailLossProbes++
	c.tlpOut = true
	flight := c.sndMax.Diff(c.sndUna)
	lo := c.sndMax.Add(-min(c.mss, flight))
	c.retransmit(lo, c.sndMax.Diff(lo))
	c.rtxTimer.set(c.now() + c.currentRTO())
}

// tlpAck handles an ACK while a probe is out: if holes remain below what the peer now holds,
// everything under its highest SACK is taken as lost and recovery starts (RFC 8985 7.4).
func (c *Conn) tlpAck() {
	if !c.tlpOut {
		return
	}
	c.tlpOut = false
	if c.sndUna == c.sndMax || c.inRecovery || len(c.sb.blocks) == 0 {
		return
	}
	c.forceLost, c.forcing = c.sb.blocks[len(c.sb.blocks)-1].Left, true
	if c.sndUna.GEQ(c.recover) {
		c.enterRecovery()
	}
}
