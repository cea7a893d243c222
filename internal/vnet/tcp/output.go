package tcp

import (
	"github.com/flowplane/flowplane/internal/vnet/ipv4"
)

// unsent is the number of queued bytes not yet sent.
func (c *Conn) unsent() int {
	return c.sndBufSeq.Add(c.sndBuf.Len()).Diff(c.sndNxt)
}

// dataEnd is the sequence number just after the last queued byte (where FIN goes).
func (c *Conn) dataEnd() Seq { return c.sndBufSeq.Add(c.sndBuf.Len()) }

// output sends whatever the windows and Nagle allow. Called after writes, ACKs and timeouts.
func (c *Conn) output() {
	switch c.state {
	case Established, CloseWait, FinWait1, Closing, LastAck:
	default:
		return
	}
	if c.inRecovery && c.sackOK {
		c.outputSACKRecovery()
	} else {
		c.outputNormal()
	}
	if c.persisting() && !c.rtxTimer.active() {
		c.persistBackoff = 0
		c.rtxTimer.set(c.now() + c.rto)
	}
}

func (c *Conn) outputNormal() {
	end := c.dataEnd()
	for {
		// After a timeout we resend from SND.UNA; skip what the peer has SACKed.
		if c.sackOK && c.sndNxt.LT(c.sndMax) {
			if sacked, to := c.sb.Sacked(c.sndNxt); sacked {
				c.sndNxt = minSeq(to, c.sndMax)
				continue
			}
		}
		avail := end.Diff(c.sndNxt)
		if avail < 0 {
			avail = 0
		}
		seg := c.segSize()
		cwnd := c.ccs.Cwnd + c.inflate
		wnd := min(c.sndWnd, cwnd)
		room := c.sndUna.Add(wnd).Diff(c.sndNxt)
		n := min(avail, seg, max(room, 0))
		fin := c.finQueued && c.sndNxt.Add(n) == end && !c.finSentAt(end)
		if n == 0 && !fin {
			return
		}
		if n == 0 && fin && avail > 0 {
			return // window closed with data still to go before the FIN
		}
		if n < seg && n < avail {
			// Window-limited runt: sender-side SWS avoidance (RFC 9293 3.8.6.2.1).
			if n < c.maxSndWnd/2 || c.sndNxt != c.sndUna {
				return
			}
		}
		if n > 0 && n < seg && c.cfg.Nagle && c.sndNxt != c.sndUna && !fin && c.sndNxt.GEQ(c.sndMax) {
			return // Nagle: one runt in flight at a time
		}
		if c.sndNxt == c.sndMax && !c.rttTiming && n > 0 {
			c.rttTiming, c.rttSeq, c.rttStart = true, c.sndNxt.Add(n), c.now()
		}
		if c.sndNxt.LT(c.sndMax) {
			c.stats.Retransmits++
		}
		c.sndNxt = c.sndNxt.Add(c.sendData(c.sndNxt, n, fin))
		c.sndMax = maxSeq(c.sndMax, c.sndNxt)
		if !c.rtxTimer.active() {
			c.armRtx()
		}
	}
}

// segSize is the payload of a full-sized segment now: the MSS (timestamps already taken off)
// less the SACK option the segment will carry, since RFC 9293 3.7.1 has the sender reduce the
// data by the options' length.
func (c *Conn) segSize() int {
	if !c.sackOK || len(c.ooo.runs) == 0 {
		return c.mss
	}
	return c.mss - (4 + 8*min(len(c.ooo.runs), len(c.sackBuf)-1))
}

// finSentAt reports whether a FIN at end has already been sent (and not rewound by a timeout).
func (c *Conn) finSentAt(end Seq) bool { return c.sndNxt.GT(end) }

// lostBelow is the RFC 6675 IsLost boundary, raised by a tail loss probe's evidence.
func (c *Conn) lostBelow() Seq {
	lost := c.sb.lostBelow(c.sndUna, c.mss)
	if c.forcing {
		lost = maxSeq(lost, minSeq(c.forceLost, c.sndMax))
	}
	return lost
}

// pipe is RFC 6675 SetPipe: bytes believed in the network.
func (c *Conn) pipe() int {
	lost := c.lostBelow()
	p := c.sb.unsacked(maxSeq(c.sndUna, lost), c.sndMax)
	if c.highRxt.GT(c.sndUna) {
		p += c.sb.unsacked(c.sndUna, minSeq(c.highRxt, lost))
	}
	return p
}

// outputSACKRecovery is the RFC 6675 transmission loop (NextSeg rules 1 and 2).
func (c *Conn) outputSACKRecovery() {
	end := c.dataEnd()
	for c.ccs.Cwnd-c.pipe() >= c.mss {
		lost := c.lostBelow()
		s := maxSeq(c.highRxt, c.sndUna)
		sent := false
		for s.LT(lost) {
			sacked, to := c.sb.Sacked(s)
			if sacked {
				s = to
				continue
			}
			holeEnd := to
			if holeEnd == s || holeEnd.GT(c.sndMax) { // no SACK block above: hole runs to SND.MAX
				holeEnd = c.sndMax
			}
			n := c.retransmit(s, min(holeEnd.Diff(s), c.segSize(), lost.Diff(s)))
			c.highRxt = s.Add(n)
			c.noteRetransmit(s, s.Add(n))
			sent = true
			break
		}
		if sent {
			continue
		}
		// Rule 2: new data.
		c.sndNxt = c.sndMax
		avail := end.Diff(c.sndNxt)
		room := c.sndUna.Add(c.sndWnd).Diff(c.sndNxt)
		n := min(avail, c.segSize(), max(room, 0))
		fin := c.finQueued && c.sndNxt.Add(n) == end && !c.finSentAt(end)
		if n <= 0 && !fin {
			return
		}
		c.sndNxt = c.sndNxt.Add(c.sendData(c.sndNxt, n, fin))
		c.sndMax = c.sndNxt
		if !c.rtxTimer.active() {
			c.armRtx()
		}
	}
}

// retransmit resends up to n bytes at seq without moving SND.NXT; it returns the sequence space
// it resent.
func (c *Conn) retransmit(seq Seq, n int) int {
	end := c.dataEnd()
	if seq.GEQ(end) { // only the FIN is outstanding
		if c.finQueued {
			c.sendFlags(end, FIN|ACK)
			c.stats.Retransmits++
			return 1
		}
		return 0
	}
	n = min(n, end.Diff(seq))
	fin := c.finQueued && seq.Add(n) == end && c.sndMax.GT(end)
	c.stats.Retransmits++
	c.rttTiming = false
	return c.sendData(seq, n, fin)
}

// sendData sends n bytes of the send buffer starting at seq, plus FIN if asked. It returns the
// sequence space the segment took (FIN included), which is less than asked only if the options
// left no room for n bytes.
func (c *Conn) sendData(seq Seq, n int, fin bool) int {
	flags := uint8(ACK)
	if n > 0 && seq.Add(n) == c.dataEnd() {
		flags |= PSH
	}
	if fin {
		flags |= FIN
	}
	return c.send(seq, flags, n, false)
}

// sendAck sends a bare ACK now.
func (c *Conn) sendAck() { c.send(c.sndNxt, ACK, 0, false) }

// sendFlags sends a segment with no data.
func (c *Conn) sendFlags(seq Seq, flags uint8) { c.send(seq, flags, 0, false) }

// sendSyn sends SYN (active open) or SYN-ACK (passive open or simultaneous open).
func (c *Conn) sendSyn(withAck bool) {
	flags := uint8(SYN)
	if withAck {
		flags |= ACK
	}
	c.send(c.iss, flags, 0, true)
}

// send builds and emits one segment; n bytes come from the send buffer at seq. It returns the
// sequence space sent: n, or fewer if the options left no room (then FIN stays for a later
// segment, since it must follow the last byte).
func (c *Conn) send(seq Seq, flags uint8, n int, syn bool) int {
	seg := Segment{SrcPort: c.id.LocalPort, DstPort: c.id.RemotePort, Seq: seq, Flags: flags}
	if flags&ACK != 0 {
		seg.Ack = c.rcvNxt
	}
	now := c.now()
	if syn {
		seg.Opts.HasMSS = true
		seg.Opts.MSS = uint16(min(c.advMSS, 0xffff))
		if c.cfg.WindowScale && (!c.passive || c.wsOK) {
			seg.Opts.HasWScale, seg.Opts.WScale = true, c.rcvShift
		}
		if c.cfg.SACK && (!c.passive || c.sackOK) {
			seg.Opts.SACKPermitted = true
		}
		if c.cfg.Timestamps && (!c.passive || c.tsOK) {
			seg.Opts.HasTS = true
		}
	} else if c.tsOK {
		seg.Opts.HasTS = true
	}
	if seg.Opts.HasTS {
		seg.Opts.TSVal = uint32(now.Milliseconds()) + c.tsOffset
		seg.Opts.TSEcr = c.tsRecent
	}
	if c.sackOK && flags&ACK != 0 && len(c.ooo.runs) > 0 && flags&RST == 0 {
		seg.Opts.NSACK = c.ooo.Blocks(c.sackBuf[:3])
		copy(seg.Opts.SACK[:], c.sackBuf[:seg.Opts.NSACK])
	}
	// Window: never shrink the right edge already advertised (RFC 9293 3.8.6.2.2).
	wnd := c.rcvWindow()
	if syn {
		wnd = min(wnd, 0xffff) // the SYN's window is never scaled
		seg.Window = uint16(wnd)
	} else {
		seg.Window = uint16(min(wnd>>c.rcvShift, 0xffff))
		wnd = int(seg.Window) << c.rcvShift
	}
	if edge := c.rcvNxt.Add(wnd); edge.GT(c.rcvAdv) || flags&SYN != 0 {
		c.rcvAdv = edge
	}
	hl := HeaderLen + OptionsLen(&seg.Opts)
	// Keep the packet within the MTU the buffer was sized for, whatever the options cost.
	if limit := len(c.scratch) - 64 - ipv4.HeaderLen - hl; n > limit {
		n = max(limit, 0)
		flags &^= FIN | PSH
		seg.Flags = flags
	}
	pkt := c.scratch[:ipv4.HeaderLen+hl+n]
	if n > 0 {
		c.sndBuf.ReadAt(pkt[ipv4.HeaderLen+hl:], seq.Diff(c.sndBufSeq))
	}
	PutHeader(pkt[ipv4.HeaderLen:], &seg, n, c.src, c.dst)
	c.ipID++
	ih := ipv4.Header{TotalLen: len(pkt), ID: c.ipID, TTL: 64, Proto: ipv4.ProtoTCP,
		Src: c.id.LocalAddr, Dst: c.id.RemoteAddr}
	ipv4.Put(pkt, &ih)
	c.stats.SegsOut++
	c.stats.BytesOut += uint64(n)
	if flags&ACK != 0 {
		c.lastAckSent = c.rcvNxt
		c.ackPending = false
		c.unackedSegs = 0
		c.delackTimer.stop()
	}
	c.mux.output(pkt)
	if flags&FIN != 0 {
		return n + 1
	}
	return n
}

// rcvWindow is the window to advertise, with receiver-side SWS avoidance: a window that opens by
// less than min(buffer/2, MSS) is not advertised.
func (c *Conn) rcvWindow() int {
	free := c.rcvBuf.Free()
	adv := c.rcvAdv.Diff(c.rcvNxt)
	if adv < 0 {
		adv = 0
	}
	if free-adv < min(c.rcvBuf.Cap()/2, c.mss) {
		return adv
	}
	return free
}

// maybeWindowUpdate sends an ACK after the application read enough to open the window.
func (c *Conn) maybeWindowUpdate() {
	switch c.state {
	case Established, FinWait1, FinWait2:
	default:
		return
	}
	adv := c.rcvAdv.Diff(c.rcvNxt)
	if c.rcvBuf.Free()-adv >= min(c.rcvBuf.Cap()/2, 2*c.mss) || (adv < c.mss && c.rcvBuf.Free() >= c.mss) {
		c.sendAck()
	}
}
