package vnet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/vnet/ipv4"
)

var broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// ICMP errors are rate-limited per node (token bucket) as RFC 1812 4.3.2.8 asks.
const (
	icmpRate  = 1000.0 // per second
	icmpBurst = 100.0
)

type pingEvent struct {
	from netip.Addr
	typ  uint8
	code uint8
	seq  uint16
	ttl  uint8
	at   time.Duration
}

func (n *Node) icmpAllowed() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.clk.Now()
	n.icmpTok = min(icmpBurst, n.icmpTok+(now-n.icmpLast).Seconds()*icmpRate)
	n.icmpLast = now
	if n.icmpTok < 1 {
		return false
	}
	n.icmpTok--
	return true
}

// icmpError sends an ICMP error about pkt back to its source (RFC 792, RFC 1812 4.3.2.7: never
// about an ICMP error, a non-first fragment or a broadcast).
func (n *Node) icmpError(pkt []byte, typ, code uint8, rest uint32) {
	h, payload, err := ipv4.Parse(pkt)
	if err != nil || h.FragOff > 0 || h.Dst == broadcast || !h.Src.IsValid() || h.Src.IsUnspecified() {
		return
	}
	if h.Proto == ipv4.ProtoICMP && len(payload) > 0 && payload[0] != ipv4.ICMPEcho && payload[0] != ipv4.ICMPEchoReply {
		return
	}
	if !n.icmpAllowed() {
		return
	}
	src, ok := n.SourceFor(h.Src)
	if !ok {
		return
	}
	msg := ipv4.AppendICMP(nil, &ipv4.ICMP{Type: typ, Code: code, Rest: rest, Body: ipv4.Quote(pkt)})
	n.Stats.ICMPOut.Add(1)
	n.Output(n.build(src, h.Src, ipv4.ProtoICMP, 64, msg))
}

func (n *Node) icmpInput(ifc *Iface, h ipv4.Header, payload []byte) {
	n.Stats.ICMPIn.Add(1)
	m, err := ipv4.ParseICMP(payload)
	if err != nil {
		n.Stats.ICMPMalformed.Add(1)
		return
	}
	switch m.Type {
	case ipv4.ICMPEcho:
		if h.Dst == broadcast {
			return
		}
		reply := ipv4.AppendICMP(nil, &ipv4.ICMP{Type: ipv4.ICMPEchoReply, ID: m.ID, Seq: m.Seq, Body: m.Body})
		n.Stats.ICMPOut.Add(1)
		n.Output(n.build(h.Dst, h.Src, ipv4.ProtoICMP, 64, reply))
	case ipv4.ICMPEchoReply:
		n.notifyPing(m.ID, pingEvent{from: h.Src, typ: m.Type, seq: m.Seq, ttl: h.TTL, at: n.clk.Now()})
	case ipv4.ICMPTimeExceeded, ipv4.ICMPUnreachable:
		// The quoted packet tells which of our echoes this answers.
		qh, qp, err := parseQuote(m.Body)
		if err != nil || qh.Proto != ipv4.ProtoICMP || len(qp) < 8 || qp[0] != ipv4.ICMPEcho {
			return
		}
		id, seq := uint16(qp[4])<<8|uint16(qp[5]), uint16(qp[6])<<8|uint16(qp[7])
		n.notifyPing(id, pingEvent{from: h.Src, typ: m.Type, code: m.Code, seq: seq, ttl: h.TTL, at: n.clk.Now()})
	}
}

// parseQuote reads the header and first bytes of a quoted packet, which is truncated, so its
// total length field cannot be checked against the bytes present.
func parseQuote(b []byte) (ipv4.Header, []byte, error) {
	if len(b) < ipv4.HeaderLen || b[0]>>4 != 4 {
		return ipv4.Header{}, nil, errors.New("short quote")
	}
	ihl := int(b[0]&0xf) * 4
	if ihl < ipv4.HeaderLen || ihl > len(b) {
		return ipv4.Header{}, nil, errors.New("bad quote header")
	}
	return ipv4.Header{Proto: b[9], Src: netip.AddrFrom4([4]byte(b[12:16])), Dst: netip.AddrFrom4([4]byte(b[16:20]))}, b[ihl:], nil
}

func (n *Node) notifyPing(id uint16, ev pingEvent) {
	n.mu.Lock()
	ch := n.pings[id]
	n.mu.Unlock()
	if ch != nil {
		select {
		case ch <- ev:
		default:
		}
	}
}

// PingResult is the answer to one echo request.
type PingResult struct {
	From     netip.Addr
	RTT      time.Duration
	TTL      uint8
	Reply    bool   // echo reply; otherwise an ICMP error (see Type, Code)
	Type     uint8  // ICMP type of the answer
	Code     uint8  // ICMP code of the answer
	Describe string // for humans: "reply", "time exceeded", "net unreachable"...
}

// Ping sends one echo request with the given TTL and payload size and waits for the answer.
func (n *Node) Ping(ctx context.Context, dst netip.Addr, seq uint16, size int, ttl uint8) (PingResult, error) {
	if size < 0 || size > 65507 {
		return PingResult{}, cli.Usagef("ping size %d out of range 0..65507", size)
	}
	ch := make(chan pingEvent, 4)
	n.mu.Lock()
	n.nextPing++
	id := n.nextPing
	n.pings[id] = ch
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.pings, id)
		n.mu.Unlock()
	}()
	body := make([]byte, size)
	for i := range body {
		body[i] = byte(i)
	}
	msg := ipv4.AppendICMP(nil, &ipv4.ICMP{Type: ipv4.ICMPEcho, ID: id, Seq: seq, Body: body})
	start := n.clk.Now()
	if err := n.SendIP(dst, ipv4.ProtoICMP, ttl, msg); err != nil {
		return PingResult{}, err
	}
	for {
		select {
		case ev := <-ch:
			if ev.seq != seq {
				continue
			}
			r := PingResult{From: ev.from, RTT: ev.at - start, TTL: ev.ttl, Reply: ev.typ == ipv4.ICMPEchoReply, Type: ev.typ, Code: ev.code}
			r.Describe = describeICMP(ev.typ, ev.code)
			return r, nil
		case <-ctx.Done():
			return PingResult{}, fmt.Errorf("ping %v: %w", dst, ctx.Err())
		}
	}
}

func describeICMP(typ, code uint8) string {
	switch typ {
	case ipv4.ICMPEchoReply:
		return "reply"
	case ipv4.ICMPTimeExceeded:
		if code == ipv4.CodeReassemblyTime {
			return "fragment reassembly time exceeded"
		}
		return "time exceeded"
	case ipv4.ICMPUnreachable:
		switch code {
		case ipv4.CodeNetUnreachable:
			return "net unreachable"
		case ipv4.CodeHostUnreach:
			return "host unreachable"
		case ipv4.CodeProtoUnreach:
			return "protocol unreachable"
		case ipv4.CodePortUnreach:
			return "port unreachable"
		case ipv4.CodeFragNeeded:
			return "fragmentation needed"
		}
	}
	return fmt.Sprintf("icmp type %d code %d", typ, code)
}

// Hop is one line of a traceroute.
type Hop struct {
	TTL  int
	From netip.Addr // invalid when nothing answered
	RTT  time.Duration
}

// Traceroute probes dst with rising TTLs until it answers or maxHops is reached.
func (n *Node) Traceroute(ctx context.Context, dst netip.Addr, maxHops int, perHop time.Duration) ([]Hop, error) {
	var hops []Hop
	for ttl := 1; ttl <= maxHops; ttl++ {
		pctx, cancel := context.WithTimeout(ctx, perHop)
		r, err := n.Ping(pctx, dst, uint16(ttl), 32, uint8(ttl))
		cancel()
		if ctx.Err() != nil {
			return hops, ctx.Err()
		}
		if err != nil {
			var ue *cli.UsageError
			if errors.As(err, &ue) || errors.Is(err, ErrNoRoute) {
				return hops, err
			}
			hops = append(hops, Hop{TTL: ttl})
			continue
		}
		hops = append(hops, Hop{TTL: ttl, From: r.From, RTT: r.RTT})
		if r.Reply || r.Type == ipv4.ICMPUnreachable {
			return hops, nil
		}
	}
	return hops, nil
}
