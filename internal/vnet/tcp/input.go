package tcp

import "time"

// negotiate applies the options of the peer's SYN.
func (c *Conn) negotiate(s *Segment) {
	o := &s.Opts
	if o.HasMSS {
		// Linux's TCP_MIN_MSS floor: a tiny MSS would leave no room for data once options are
		// taken off (negative segment sizes) and is how CVE-2019-11477 multiplied segments.
		c.peerMSS = max(int(o.MSS), minMSS)
	}
	c.wsOK = c.cfg.WindowScale && o.HasWScale
	if c.wsOK {
		c.sndShift = o.WScale
	} else {
		c.sndShift, c.rcvShift = 0, 0
	}
	c.sackOK = c.cfg.SACK && o.SACKPermitted
	c.tsOK = c.cfg.Timestamps && o.HasTS
	if c.tsOK {
		c.tsRecent = o.TSVal
	}
	c.mss = min(c.peerMSS, c.advMSS)
	if c.tsOK {
		c.mss -= 12
	}
	c.ccs.MSS = c.mss
	c.cc.Init(&c.ccs)
}

// input processes one segment for this connection (RFC 9293 3.10.7).
func (c *Conn) input(s *Segment, b *Batch) {
	c.stats.SegsIn++
	c.lastRecv = c.now()
	switch c.state {
	case Closed, Listen:
		return
	case SynSent:
		c.inputSynSent(s)
		return
	}
	// Retransmitted SYN while we wait for the handshake's ACK: repeat the SYN-ACK.
	if c.state == SynReceived && s.Flags&SYN != 0 && s.Flags&ACK == 0 && s.Seq == c.irs {
		c.sendSyn(true)
		return
	}
	// PAWS (RFC 7323 5).
	if c.tsOK && s.Opts.HasTS && s.Flags&RST == 0 && int32(s.Opts.TSVal-c.tsRecent) < 0 {
		c.stats.PAWSDropped++
		c.sendAck()
		return
	}
	if !c.acceptable(s) {
		c.stats.UnacceptableSegs++
		if s.Flags&RST == 0 {
			c.sendAck() // also answers zero-window probes and keepalives
		}
		return
	}
	if c.tsOK && s.Opts.HasTS && s.Seq.LEQ(c.lastAckSent) {
		c.tsRecent = s.Opts.TSVal // RFC 7323 4.3
	}
	if s.Flags&RST != 0 {
		if c.state == TimeWait {
			return // RFC 1337: a RST must not cut TIME-WAIT short
		}
		if s.Seq != c.rcvNxt { // RFC 5961 3.2: in window but not exact
			c.challengeAck()
			return
		}
		if c.state == SynReceived && c.passive {
			c.destroy(ErrRefused)
			return
		}
		switch c.state {
		case Closing, LastAck, TimeWait:
			c.destroy(nil)
		default:
			c.destroy(ErrReset)
		}
		return
	}
	if s.Flags&SYN != 0 { // RFC 5961 4: SYN in a synchronized state
		c.challengeAck()
		return
	}
	if s.Flags&ACK == 0 {
		return
	}
	if c.state == SynReceived {
		if s.Ack.LEQ(c.sndUna) || s.Ack.GT(c.sndMax) {
			c.sendFlags(s.Ack, RST)
			return
		}
		c.sndWnd = int(s.Window) << c.sndShift
		c.maxSndWnd = max(c.maxSndWnd, c.sndWnd)
		c.sndWl1, c.sndWl2 = s.Seq, s.Ack
		c.setState(Established)
		c.armKeepalive()
		if c.listener != nil {
			c.listener.ready(c)
		}
		if c.finQueued {
			c.setState(FinWait1)
		}
	}
	if s.Ack.GT(c.sndMax) {
		c.stats.BadAcks++
		c.sendAck()
		return
	}
	if s.Ack.LT(c.sndUna.Add(-c.maxSndWnd)) { // RFC 5961 5.2
		c.challengeAck()
		return
	}
	finWasAcked := c.finAcked()
	c.processAck(s)
	if c.state == Closed {
		return
	}
	if !finWasAcked && c.finAcked() {
		switch c.state {
		case FinWait1:
			c.setState(FinWait2)
			if c.readClosed {
				// Nobody can read any more: do not wait forever for a peer that never closes
				// (Linux's tcp_fin_timeout).
				c.twTimer.set(c.now() + 2*c.cfg.MSL)
			}
		case Closing:
			c.enterTimeWait()
		case LastAck:
			c.destroy(nil)
			return
		}
	}
	if c.state == TimeWait {
		if s.Flags&FIN != 0 { // retransmitted FIN: our ACK was lost
			c.sendAck()
			c.twTimer.set(c.now() + 2*c.cfg.MSL)
		}
		return
	}
	if len(s.Payload) > 0 || s.Flags&FIN != 0 {
		switch c.state {
		case Established, FinWait1, FinWait2:
			c.receive(s, b)
		case CloseWait, Closing, LastAck:
			// Data after the peer's FIN is bogus; acknowledge what we have.
			c.sendAck()
		}
	}
	c.output()
	c.armKeepalive()
	c.kaProbes = 0
}

func (c *Conn) finAcked() bool {
	return c.finQueued && c.sndUna.GT(c.dataEnd())
}

// reuseTimeWait ends TIME-WAIT for a new SYN beyond the old connection's sequence space (RFC
// 9293 3.6.1 and RFC 6191), so a client reusing the port need not wait 2*MSL.
func (c *Conn) reuseTimeWait(s *Segment) bool {
	if c.state != TimeWait || s.Flags&(SYN|ACK|RST) != SYN {
		return false
	}
	newer := s.Seq.GT(c.rcvNxt)
	if c.tsOK && s.Opts.HasTS {
		newer = int32(s.Opts.TSVal-c.tsRecent) > 0
	}
	if newer {
		c.destroy(nil)
	}
	return newer
}

// acceptable is the RFC 9293 3.10.7.4 sequence number test.
func (c *Conn) acceptable(s *Segment) bool {
	wnd := max(c.rcvBuf.Free(), c.rcvAdv.Diff(c.rcvNxt), 0)
	n := s.Len()
	switch {
	case wnd == 0:
		// No data fits, but a segment at RCV.NXT (a zero-window probe) still carries an ACK
		// and window to process (RFC 9293 3.10.7.4 "special allowance"); receive drops its
		// data. Otherwise a sender whose own window is shut never learns its data arrived.
		return s.Seq == c.rcvNxt
	case n == 0:
		return inWindow(s.Seq, c.rcvNxt, wnd)
	default:
		return inWindow(s.Seq, c.rcvNxt, wnd) || inWindow(s.Seq.Add(n-1), c.rcvNxt, wnd)
	}
}

func (c *Conn) challengeAck() {
	c.stats.ChallengeAcks++
	if c.mux.allowChallenge(c.now()) {
		c.sendAck()
	}
}

func (c *Conn) inputSynSent(s *Segment) {
	if s.Flags&ACK != 0 && (s.Ack.LEQ(c.iss) || s.Ack.GT(c.sndMax)) {
		if s.Flags&RST == 0 {
			c.sendFlags(s.Ack, RST)
		}
		return
	}
	if s.Flags&RST != 0 {
		if s.Flags&ACK != 0 {
			c.destroy(ErrRefused)
		}
		return
	}
	if s.Flags&SYN == 0 {
		return
	}
	c.irs = s.Seq
	c.rcvNxt = s.Seq.Add(1)
	c.negotiate(s)
	// The window in our SYN was not scaled (RFC 7323 2.2): the edge it set is rcvNxt+that.
	c.rcvAdv = c.rcvNxt.Add(min(c.rcvBuf.Free(), 0xffff))
	if s.Flags&ACK != 0 {
		c.sndUna = s.Ack
		c.sndWnd = int(s.Window) // a SYN's window is never scaled
		c.maxSndWnd = c.sndWnd
		c.sndWl1, c.sndWl2 = s.Seq, s.Ack
		c.rttSample()
		c.backoff, c.retries = 0, 0
		c.rtxTimer.stop()
		c.setState(Established)
		c.armKeepalive()
		if c.finQueued {
			c.setState(FinWait1)
		}
		c.sendAck()
		c.output()
		return
	}
	// Simultaneous open (RFC 9293 3.5 figure 8).
	c.sndWnd = int(s.Window)
	c.sndWl1, c.sndWl2 = s.Seq, s.Ack
	c.setState(SynReceived)
	c.sendSyn(true)
	c.armRtx()
}

// rttSample takes a measurement if one was running and ACKed (Karn's algorithm: the timing is
// cancelled whenever data is retransmitted).
func (c *Conn) rttSample() {
	if !c.rttTiming {
		if c.state == SynSent && c.backoff == 0 {
			c.updateRTT(c.now() - c.rttStart)
		}
		return
	}
	if c.sndUna.GEQ(c.rttSeq) {
		c.rttTiming = false
		c.updateRTT(c.now() - c.rttStart)
	}
}

// updateRTT is RFC 6298 2.2-2.3.
func (c *Conn) updateRTT(r time.Duration) {
	if r <= 0 {
		r = time.Microsecond
	}
	if c.srtt == 0 {
		c.srtt, c.rttvar = r, r/2
	} else {
		d := c.srtt - r
		if d < 0 {
			d = -d
		}
		c.rttvar = (3*c.rttvar + d) / 4
		c.srtt = (7*c.srtt + r) / 8
	}
	if c.minRTT == 0 || r < c.minRTT {
		c.minRTT = r
	}
	c.rto = max(c.srtt+max(time.Millisecond, 4*c.rttvar), c.cfg.MinRTO)
	c.rto = min(c.rto, c.cfg.MaxRTO)
	c.ccs.SRTT, c.ccs.MinRTT = c.srtt, c.minRTT
}

// processAck handles SEG.ACK: advance SND.UNA, RTT, congestion control and loss recovery.
func (c *Conn) processAck(s *Segment) {
	if c.sackOK {
		for i := 0; i < s.Opts.NSACK; i++ {
			c.sb.Add(s.Opts.SACK[i], c.sndUna, c.sndMax)
		}
	}
	// Window update (RFC 9293 3.10.7.4).
	wndChanged := false
	if c.sndWl1.LT(s.Seq) || (c.sndWl1 == s.Seq && c.sndWl2.LEQ(s.Ack)) {
		w := int(s.Window) << c.sndShift
		wndChanged = w != c.sndWnd
		c.sndWnd = w
		c.maxSndWnd = max(c.maxSndWnd, w)
		c.sndWl1, c.sndWl2 = s.Seq, s.Ack
		if w > 0 {
			c.persistBackoff = 0
		}
	}
	if c.sndWnd == 0 {
		c.retries = 0 // the peer is alive, only its window is shut
	}
	now := c.now()
	c.ccs.Now = now
	if s.Ack.GT(c.sndUna) {
		acked := s.Ack.Diff(c.sndUna)
		c.sndUna = s.Ack
		if c.sndNxt.LT(c.sndUna) {
			c.sndNxt = c.sndUna
		}
		// Drop acknowledged bytes from the send buffer (SYN and FIN occupy no buffer).
		if d := c.sndUna.Diff(c.sndBufSeq); d > 0 {
			d = min(d, c.sndBuf.Len())
			c.sndBuf.Discard(d)
			c.sndBufSeq = c.sndBufSeq.Add(d)
			c.stats.BytesAcked += uint64(d)
			signal(c.wrWake)
		}
		c.sb.Ack(c.sndUna)
		c.rttSample()
		c.backoff, c.retries = 0, 0
		c.dupAcks = 0
		if c.inRecovery {
			if c.sndUna.GEQ(c.recover) {
				c.inRecovery, c.inflate = false, 0
				c.rxts, c.forcing = c.rxts[:0], false
				c.ccs.InFlight = c.sndMax.Diff(c.sndUna)
				c.cc.OnRecoveryEnd(&c.ccs)
			} else if !c.sackOK { // NewReno partial ACK (RFC 6582 3.2 step 3)
				c.retransmit(c.sndUna, c.mss)
				c.inflate = max(c.inflate-acked+c.mss, 0)
			} else if c.highRxt.LT(c.sndUna) {
				c.highRxt = c.sndUna
			}
		} else if flight := c.sndMax.Diff(c.sndUna) + acked; 2*flight >= c.ccs.Cwnd {
			// Grow only a window that is in use (RFC 7661): an application- or
			// receiver-limited sender must not inflate cwnd without evidence.
			c.ccs.InFlight = flight - acked
			c.cc.OnAck(&c.ccs, acked, c.srtt)
		}
		if c.inRecovery && c.sackOK {
			c.detectLostRetransmits()
		}
		c.tlpAck()
		if c.sndUna == c.sndMax {
			c.rtxTimer.stop()
		} else {
			c.armRtx()
		}
		return
	}
	if c.inRecovery && c.sackOK && s.Opts.NSACK > 0 {
		c.detectLostRetransmits()
	}
	if s.Opts.NSACK > 0 {
		c.tlpAck()
	}
	// Duplicate ACK (RFC 5681 2 definition, relaxed with SACK information).
	if s.Ack != c.sndUna || len(s.Payload) > 0 || s.Flags&(SYN|FIN) != 0 || c.sndUna == c.sndMax {
		return
	}
	if wndChanged && s.Opts.NSACK == 0 {
		return
	}
	c.dupAcks++
	c.stats.DupAcks++
	if c.inRecovery {
		if !c.sackOK {
			c.inflate += c.mss
		}
		return
	}
	lost := c.sackOK && c.sb.lostBelow(c.sndUna, c.mss).GT(c.sndUna)
	if (c.dupAcks >= dupThresh || lost) && c.sndUna.GEQ(c.recover) {
		c.enterRecovery()
	}
}

// enterRecovery starts fast retransmit / fast recovery.
func (c *Conn) enterRecovery() {
	c.stats.FastRetransmits++
	c.inRecovery = true
	c.recover = c.sndMax
	c.ccs.InFlight = c.sndMax.Diff(c.sndUna)
	c.cc.OnCongestion(&c.ccs)
	c.highRxt = c.sndUna.Add(c.retransmit(c.sndUna, c.segSize()))
	c.rxts = c.rxts[:0]
	c.noteRetransmit(c.sndUna, c.highRxt)
	if !c.sackOK {
		c.inflate = dupThresh * c.mss
	}
	c.armRtx()
}

// receive queues segment data and handles FIN (RFC 9293 3.10.7.4 seventh and eighth steps).
func (c *Conn) receive(s *Segment, b *Batch) {
	if c.readClosed && len(s.Payload) > 0 {
		// Nobody will read this: tell the peer (as Linux does) rather than let it block.
		c.sendFlags(c.sndNxt, RST|ACK)
		c.destroy(ErrClosed)
		return
	}
	seq, data := s.Seq, s.Payload
	if s.Flags&FIN != 0 && !c.finRcvd {
		c.finRcvd, c.finSeq = true, s.Seq.Add(len(s.Payload))
	}
	inOrder := true
	if seq.LT(c.rcvNxt) {
		d := c.rcvNxt.Diff(seq)
		if d >= len(data) {
			data = nil
		} else {
			data = data[d:]
		}
		seq = c.rcvNxt
	}
	if lim := c.rcvBuf.Free(); seq.Diff(c.rcvNxt)+len(data) > lim {
		over := seq.Diff(c.rcvNxt) + len(data) - lim
		data = data[:max(len(data)-over, 0)]
		c.stats.RcvBufFull++
	}
	hadHoles := len(c.ooo.runs) > 0
	if len(data) > 0 {
		if seq == c.rcvNxt {
			n := c.rcvBuf.Write(data)
			c.rcvNxt = c.rcvNxt.Add(n)
			c.stats.BytesIn += uint64(n)
			for {
				d := c.ooo.PopAt(c.rcvNxt)
				if d == nil {
					break
				}
				n := c.rcvBuf.Write(d)
				c.rcvNxt = c.rcvNxt.Add(n)
				c.stats.BytesIn += uint64(n)
			}
			signal(c.rdWake)
		} else {
			inOrder = false
			c.stats.OutOfOrder++
			if !c.ooo.Insert(seq, data) {
				c.stats.OutOfOrderDropped++
			}
		}
	} else if len(s.Payload) > 0 {
		inOrder = false // duplicate: ACK at once so the sender learns (RFC 5681 4.2)
	}
	if c.finRcvd && c.rcvNxt == c.finSeq {
		c.rcvNxt = c.rcvNxt.Add(1)
		c.eof = true
		c.finRcvd = false
		signal(c.rdWake)
		switch c.state {
		case Established:
			c.setState(CloseWait)
		case FinWait1:
			if c.finAcked() {
				c.enterTimeWait()
			} else {
				c.setState(Closing)
			}
		case FinWait2:
			c.enterTimeWait()
		}
		c.sendAck()
		return
	}
	c.unackedSegs++
	switch {
	case !inOrder || hadHoles || s.Flags&FIN != 0:
		c.stats.FullAcks++
		c.sendAck() // out of order or filling a hole: immediately (RFC 5681 4.2)
	case !c.cfg.DelayedAck || c.unackedSegs >= 2:
		c.stats.FullAcks++
		if b != nil {
			c.ackPending = true
			if !c.inBatch {
				c.inBatch = true
				b.conns = append(b.conns, c)
			}
		} else {
			c.sendAck()
		}
	default:
		c.ackPending = true
		if !c.delackTimer.active() {
			c.delackTimer.set(c.now() + c.cfg.AckDelay)
		}
	}
}

// flushAck sends an ACK deferred by a batch, unless one went out meanwhile.
func (c *Conn) flushAck() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inBatch = false
	if c.ackPending && c.state != Closed {
		c.sendAck()
	}
}
