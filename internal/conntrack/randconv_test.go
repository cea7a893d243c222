package conntrack

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/flowplane/flowplane/internal/packet"
)

// rpkt is one packet of a random conversation between h1 (inside) and h2 (outside), as plain
// data: a sequence prints as Go literals a table test can take over (rpkt.GoString).
type rpkt struct {
	from         string // "h1" or "h2"
	v6           bool
	proto        string // "tcp", "udp", "echo" (ICMP echo) or "icmperr" (an ICMP error)
	sport, dport uint16 // TCP and UDP ports; echo: sport is the identifier
	flags        string // TCP
	seq, ack     uint32 // TCP; echo: seq is the sequence number
	win          uint16 // TCP window (unscaled)
	wscale       int8   // TCP window scale option; -1: none
	sackOK       bool   // TCP SACK-permitted option
	sack         []uint32
	payload      int
	reply        bool          // echo reply
	typ, code    uint8         // ICMP error
	quote        *rpkt         // ICMP error: the packet it quotes
	gap          time.Duration // wait before sending
}

// builder builds p with d's addresses.
func (p *rpkt) builder(d *diffLab) *packet.Builder {
	src, dst := d.h1, d.h2
	if p.v6 {
		src, dst = d.h16, d.h26
	}
	if p.from == "h2" {
		src, dst = dst, src
	}
	b := packet.IP(src.String(), dst.String())
	switch p.proto {
	case "tcp":
		b = b.TCP(p.sport, p.dport, p.flags).Seq(p.seq).Ack(p.ack).Window(p.win)
		if p.wscale >= 0 {
			b = b.MSS(1460).WScale(uint8(p.wscale))
		}
		if p.sackOK {
			b = b.SACKPermitted()
		}
		if len(p.sack) > 0 {
			b = b.SACK(p.sack...)
		}
	case "udp":
		b = b.UDP(p.sport, p.dport)
	case "echo":
		b = b.Echo(p.sport, uint16(p.seq), p.reply)
	case "icmperr":
		return b.ICMPError(p.typ, p.code, p.quote.builder(d).IPBytes())
	}
	if p.payload > 0 {
		b = b.Payload(make([]byte, p.payload))
	}
	return b
}

func (p *rpkt) step() dstep {
	return dstep{name: p.String(), from: p.from, frame: p.builder}
}

func (p *rpkt) String() string {
	var b strings.Builder
	fam := "v4"
	if p.v6 {
		fam = "v6"
	}
	fmt.Fprintf(&b, "%s %s ", p.from, fam)
	switch p.proto {
	case "tcp":
		fmt.Fprintf(&b, "tcp %d>%d %s seq=%d ack=%d win=%d", p.sport, p.dport, p.flags, p.seq, p.ack, p.win)
		if p.wscale >= 0 {
			fmt.Fprintf(&b, " ws=%d", p.wscale)
		}
		if p.sackOK {
			b.WriteString(" sackok")
		}
		if len(p.sack) > 0 {
			fmt.Fprintf(&b, " sack=%v", p.sack)
		}
	case "udp":
		fmt.Fprintf(&b, "udp %d>%d", p.sport, p.dport)
	case "echo":
		fmt.Fprintf(&b, "echo id=%d seq=%d reply=%v", p.sport, p.seq, p.reply)
	case "icmperr":
		fmt.Fprintf(&b, "icmp error %d/%d quoting [%s]", p.typ, p.code, p.quote)
	}
	if p.payload > 0 {
		fmt.Fprintf(&b, " len=%d", p.payload)
	}
	if p.gap > 0 {
		fmt.Fprintf(&b, " after %v", p.gap)
	}
	return b.String()
}

// GoString is p as a Go composite literal (zero fields left out, wscale always there).
func (p *rpkt) GoString() string {
	f := []string{fmt.Sprintf("from: %q", p.from)}
	add := func(cond bool, format string, v any) {
		if cond {
			f = append(f, fmt.Sprintf(format, v))
		}
	}
	add(p.v6, "v6: %v", p.v6)
	add(true, "proto: %q", p.proto)
	add(p.sport != 0, "sport: %d", p.sport)
	add(p.dport != 0, "dport: %d", p.dport)
	add(p.flags != "", "flags: %q", p.flags)
	add(p.seq != 0, "seq: %d", p.seq)
	add(p.ack != 0, "ack: %d", p.ack)
	add(p.win != 0, "win: %d", p.win)
	add(true, "wscale: %d", p.wscale)
	add(p.sackOK, "sackOK: %v", p.sackOK)
	add(len(p.sack) > 0, "sack: %#v", p.sack)
	add(p.payload != 0, "payload: %d", p.payload)
	add(p.reply, "reply: %v", p.reply)
	add(p.typ != 0, "typ: %d", p.typ)
	add(p.code != 0, "code: %d", p.code)
	if p.quote != nil {
		f = append(f, "quote: &rpkt"+p.quote.GoString())
	}
	add(p.gap != 0, "gap: %d", int64(p.gap))
	return "{" + strings.Join(f, ", ") + "}"
}

// convGen generates random but plausible conversations from a seed: TCP (handshakes,
// simultaneous open, pickup, data both ways, retransmissions, out-of-order segments, SACK,
// window scaling, sequence and ack numbers at and beyond the window edges, FIN and RST in every
// order, reopening and challenge ACKs), UDP, ICMP echo and ICMP errors quoting the flows; IPv4
// and IPv6; opened from inside or from outside.
type convGen struct {
	r    *rand.Rand
	used map[string]bool // tuples in use in this sequence
}

func newConvGen(seed uint64) *convGen {
	return &convGen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), used: map[string]bool{}}
}

// sequence is a few conversations interleaved, each keeping its own order.
func (g *convGen) sequence() []rpkt {
	n := 1 + g.r.IntN(4)
	var convs [][]rpkt
	for range n {
		if c := g.conversation(); len(c) > 0 {
			convs = append(convs, c)
		}
	}
	var out []rpkt
	for len(convs) > 0 {
		i := g.r.IntN(len(convs))
		p := convs[i][0]
		if g.r.IntN(10) == 0 {
			p.gap = time.Duration(1+g.r.IntN(30)) * time.Millisecond
		}
		out = append(out, p)
		if convs[i] = convs[i][1:]; len(convs[i]) == 0 {
			convs = append(convs[:i], convs[i+1:]...)
		}
	}
	return out
}

func (g *convGen) pick(weights ...int) int {
	sum := 0
	for _, w := range weights {
		sum += w
	}
	x := g.r.IntN(sum)
	for i, w := range weights {
		if x < w {
			return i
		}
		x -= w
	}
	return len(weights) - 1
}

// flow picks a fresh tuple: the initiator (h1 three times in four), family and ports.
func (g *convGen) flow(proto string) (from string, v6 bool, cport, sport uint16) {
	for {
		from, v6 = "h1", g.r.IntN(2) == 0
		if g.r.IntN(4) == 0 {
			from = "h2"
		}
		cport = uint16(1024 + g.r.IntN(64000))
		sport = []uint16{80, 443, 53, 8000, uint16(1 + g.r.IntN(65535))}[g.r.IntN(5)]
		key := fmt.Sprint(proto, v6, cport, sport)
		if !g.used[key] {
			g.used[key] = true
			return
		}
	}
}

func (g *convGen) conversation() []rpkt {
	switch g.pick(6, 2, 2) {
	case 0:
		return g.tcp()
	case 1:
		return g.udp()
	}
	return g.echo()
}

func other(h string) string {
	if h == "h1" {
		return "h2"
	}
	return "h1"
}

// icmpError is an error from the receiver of q quoting it (v4: unreachable, time exceeded,
// parameter problem, source quench; v6: unreachable, too big, time exceeded, parameter problem).
func (g *convGen) icmpError(q rpkt) rpkt {
	q.gap, q.payload = 0, min(q.payload, 8)
	if g.r.IntN(6) == 0 { // quoting a flow nobody has
		q.sport++
	}
	e := rpkt{from: other(q.from), v6: q.v6, proto: "icmperr", quote: &q, wscale: -1}
	if g.r.IntN(8) == 0 {
		e.from = q.from // an error quoting the sender's own packet
	}
	if q.v6 {
		e.typ = []uint8{1, 2, 3, 4}[g.r.IntN(4)]
		if e.typ == 1 {
			e.code = uint8(g.r.IntN(5))
		}
	} else {
		e.typ = []uint8{3, 3, 11, 12, 4}[g.r.IntN(5)]
		if e.typ == 3 {
			e.code = []uint8{1, 3, 4, 13}[g.r.IntN(4)]
		}
	}
	return e
}

func (g *convGen) udp() []rpkt {
	from, v6, cport, sport := g.flow("udp")
	var out []rpkt
	pkt := func(fromClient bool) rpkt {
		p := rpkt{from: from, v6: v6, proto: "udp", sport: cport, dport: sport, payload: 1 + g.r.IntN(200), wscale: -1}
		if !fromClient {
			p.from, p.sport, p.dport = other(from), sport, cport
		}
		return p
	}
	for range 1 + g.r.IntN(6) {
		switch g.pick(5, 4, 1, 1) {
		case 0:
			out = append(out, pkt(true))
		case 1:
			out = append(out, pkt(false))
		case 2:
			out = append(out, g.icmpError(pkt(true)))
		case 3:
			out = append(out, g.icmpError(pkt(false)))
		}
	}
	return out
}

func (g *convGen) echo() []rpkt {
	from, v6, id, _ := g.flow("echo")
	var out []rpkt
	for i := range 1 + g.r.IntN(5) {
		p := rpkt{from: from, v6: v6, proto: "echo", sport: id, seq: uint32(i), payload: 8 * g.r.IntN(8), wscale: -1}
		switch g.pick(5, 4, 1, 1) {
		case 1:
			p.from, p.reply = other(from), true
		case 2:
			p.from, p.reply, p.sport = other(from), true, id+1 // a reply with another identifier
		case 3:
			out = append(out, p)
			p = g.icmpError(p)
		}
		out = append(out, p)
	}
	return out
}

// tcpEnd is one endpoint of a generated TCP connection.
type tcpEnd struct {
	from   string
	port   uint16
	isn    uint32
	nxt    uint32 // next sequence number to send
	acked  uint32 // the highest this end has acknowledged of the peer
	win    uint16
	ws     int8 // the scale it announces; -1: none
	sackOK bool
	sent   []rpkt // segments sent, for retransmissions and ICMP errors
}

type tcpConv struct {
	g      *convGen
	v6     bool
	c, s   *tcpEnd
	out    []rpkt
	scaled bool // both announced a scale
}

func (g *convGen) isn() uint32 {
	switch g.r.IntN(4) {
	case 0:
		return uint32(0) - uint32(g.r.IntN(5000)) // about to wrap
	case 1:
		return uint32(g.r.IntN(1000))
	}
	return g.r.Uint32()
}

func (g *convGen) tcpEnd(from string, port uint16) *tcpEnd {
	e := &tcpEnd{from: from, port: port, isn: g.isn(), win: []uint16{65535, 64240, 29200, 1024, 502}[g.r.IntN(5)], ws: -1}
	e.nxt = e.isn
	if g.r.IntN(4) != 0 {
		e.ws = int8([]int{0, 2, 7, 14}[g.r.IntN(4)])
	}
	e.sackOK = g.r.IntN(2) == 0
	return e
}

// seg appends a segment from e to its peer.
func (c *tcpConv) seg(e *tcpEnd, flags string, seq, ack uint32, n int) *rpkt {
	peer := c.s
	if e == c.s {
		peer = c.c
	}
	p := rpkt{from: e.from, v6: c.v6, proto: "tcp", sport: e.port, dport: peer.port, flags: flags, seq: seq, ack: ack, win: e.win, wscale: -1, payload: n}
	if !strings.Contains(flags, "A") {
		p.ack = 0
	}
	if strings.Contains(flags, "S") {
		p.wscale, p.sackOK = e.ws, e.sackOK
	}
	c.out = append(c.out, p)
	e.sent = append(e.sent, p)
	return &c.out[len(c.out)-1]
}

func (c *tcpConv) peer(e *tcpEnd) *tcpEnd {
	if e == c.c {
		return c.s
	}
	return c.c
}

// send sends n bytes (and FIN if fin) of e's next data, acknowledging everything of the peer.
func (c *tcpConv) send(e *tcpEnd, n int, flags string) {
	p := c.peer(e)
	e.acked = p.nxt
	c.seg(e, flags, e.nxt, p.nxt, n)
	e.nxt += uint32(n)
	if strings.Contains(flags, "F") || strings.Contains(flags, "S") {
		e.nxt++
	}
}

// side is one end at random.
func (c *tcpConv) side() *tcpEnd {
	if c.g.r.IntN(2) == 0 {
		return c.c
	}
	return c.s
}

// window is the peer's window as e may fill it, in bytes.
func (c *tcpConv) window(e *tcpEnd) uint32 {
	p := c.peer(e)
	w := uint32(p.win)
	if c.scaled && p.ws > 0 {
		w <<= uint32(p.ws)
	}
	return w
}

func (g *convGen) tcp() []rpkt {
	from, v6, cport, sport := g.flow("tcp")
	c := &tcpConv{g: g, v6: v6, c: g.tcpEnd(from, cport), s: g.tcpEnd(other(from), sport)}
	c.open()
	for range g.r.IntN(12) {
		c.body()
	}
	c.close()
	if g.r.IntN(4) == 0 {
		c.reopen()
	}
	return c.out
}

// open is a handshake, or its variants.
func (c *tcpConv) open() {
	g, cl, sv := c.g, c.c, c.s
	c.scaled = cl.ws >= 0 && sv.ws >= 0
	switch g.pick(10, 2, 2, 1, 1, 1) {
	case 0: // three-way handshake, with a retransmitted SYN or SYN-ACK now and then
		c.send(cl, 0, "S")
		if g.r.IntN(6) == 0 {
			c.seg(cl, "S", cl.isn, 0, 0)
		}
		c.send(sv, 0, "SA")
		if g.r.IntN(6) == 0 {
			c.seg(sv, "SA", sv.isn, cl.nxt, 0)
		}
		c.send(cl, 0, "A")
	case 1: // simultaneous open
		c.send(cl, 0, "S")
		c.send(sv, 0, "S")
		c.seg(cl, "SA", cl.isn, sv.nxt, 0)
		c.seg(sv, "SA", sv.isn, cl.nxt, 0)
		c.send(cl, 0, "A")
	case 2: // mid-stream pickup: no handshake seen
		c.scaled = false
		cl.nxt, sv.nxt = g.r.Uint32(), g.r.Uint32()
		cl.ws, sv.ws = -1, -1
	case 3: // refused: RST-ACK to the SYN
		c.send(cl, 0, "S")
		c.seg(sv, "RA", 0, cl.nxt, 0)
	case 4: // a SYN-ACK acknowledging something else, then the right one
		c.send(cl, 0, "S")
		c.seg(sv, "SA", sv.isn, cl.nxt+uint32(g.r.IntN(3))-1+uint32(g.r.IntN(2))*1000, 0)
		c.send(sv, 0, "SA")
		c.send(cl, 0, "A")
	case 5: // no answer: SYNs only
		for range 1 + g.r.IntN(3) {
			c.seg(cl, "S", cl.isn, 0, 0)
		}
		cl.nxt++
	}
}

// body is one step of data, acknowledgements and odd segments.
func (c *tcpConv) body() {
	g := c.g
	e := c.side()
	p := c.peer(e)
	n := []int{1, 100, 536, 1200}[g.r.IntN(4)] // within the links' MTU with any header
	switch g.pick(8, 4, 2, 2, 2, 2, 1, 1, 1) {
	case 0: // data
		c.send(e, n, "PA")
	case 1: // a pure ACK
		c.send(e, 0, "A")
	case 2: // a retransmission
		if len(e.sent) > 0 {
			q := e.sent[g.r.IntN(len(e.sent))]
			q.gap = 0
			c.out = append(c.out, q)
		}
	case 3: // out of order: the later segment first, the peer SACKs it, then the hole
		seq := e.nxt
		c.seg(e, "PA", seq+uint32(n), p.nxt, n)
		if p.sackOK && e.sackOK && g.r.IntN(2) == 0 {
			c.seg(p, "A", p.nxt, seq, 0).sack = []uint32{seq + uint32(n), seq + uint32(2*n)}
		}
		c.seg(e, "PA", seq, p.nxt, n)
		e.nxt += uint32(2 * n)
	case 4: // at and beyond the window's upper edge
		w := c.window(e)
		d := []uint32{0, 1, uint32(n), w / 2, 1 << 20, 1 << 30}[g.r.IntN(6)]
		c.seg(e, "PA", p.acked+w-uint32(n)+d, p.nxt, n)
	case 5: // acknowledgement numbers around what the peer sent
		d := []int64{-1, 1, 1000, 1 << 20, -(1 << 20), 1 << 31}[g.r.IntN(6)]
		c.seg(e, "A", e.nxt, uint32(int64(p.nxt)+d), 0)
	case 6: // SACK blocks, inside or beyond what was sent
		if e.sackOK && p.sackOK {
			l := p.nxt - uint32(g.r.IntN(2000))
			c.seg(e, "A", e.nxt, p.nxt-uint32(g.r.IntN(2000)), 0).sack = []uint32{l, l + uint32(g.r.IntN(1<<16))}
		} else {
			c.send(e, 0, "A")
		}
	case 7: // a window update
		e.win = []uint16{0, 1, 512, 65535}[g.r.IntN(4)]
		c.send(e, 0, "A")
	case 8: // odd flags
		c.seg(e, []string{"", "SF", "SR", "FPU", "F", "SA", "S", "PAU", "FA", "RA"}[g.r.IntN(10)], e.nxt, p.nxt, g.r.IntN(2)*n)
	}
}

// close ends the connection: FINs in any order, RSTs exact or not, or nothing.
func (c *tcpConv) close() {
	g := c.g
	e := c.side()
	p := c.peer(e)
	switch g.pick(4, 2, 2, 3, 2, 1, 2) {
	case 0: // orderly, from either side
		c.send(e, 0, "FA")
		c.send(p, 0, "A")
		c.send(p, 0, "FA")
		c.send(e, 0, "A")
	case 1: // simultaneous close
		c.send(e, 0, "FA")
		c.seg(p, "FA", p.nxt, e.nxt-1, 0)
		p.nxt++
		c.send(e, 0, "A")
		c.send(p, 0, "A")
	case 2: // half close, the other side keeps sending
		c.send(e, 0, "FA")
		c.send(p, 100, "PA")
		c.send(e, 0, "A")
		c.send(p, 0, "FA")
		if g.r.IntN(2) == 0 {
			c.send(e, 0, "A")
		}
	case 3: // a RST: exact, inexact in the window, or out of it; with or without ACK
		flags := []string{"R", "RA"}[g.r.IntN(2)]
		d := []uint32{0, 0, 1, 100, 1 << 24, ^uint32(0)}[g.r.IntN(6)]
		c.seg(e, flags, e.nxt+d, p.nxt, 0)
		if g.r.IntN(3) == 0 { // answered by the other side's RST too
			c.seg(p, "R", p.nxt, 0, 0)
		}
	case 4: // FIN, then a RST
		c.send(e, 0, "FA")
		c.seg([]*tcpEnd{e, p}[g.r.IntN(2)], "R", []uint32{e.nxt, p.nxt}[g.r.IntN(2)], 0, 0)
	case 5: // FIN without ACK (invalid flags), then the proper one
		c.seg(e, "F", e.nxt, 0, 0)
		c.send(e, 0, "FA")
	case 6: // left open
	}
	// Late packets: a retransmission or an ICMP error quoting one of the segments.
	for range g.r.IntN(3) {
		x := c.side()
		if len(x.sent) == 0 {
			continue
		}
		q := x.sent[g.r.IntN(len(x.sent))]
		if g.r.IntN(2) == 0 {
			q.gap = 0
			c.out = append(c.out, q)
		} else {
			c.out = append(c.out, g.icmpError(q))
		}
	}
}

// reopen reuses the tuple: a new SYN (lower or higher ISN), answered by a SYN-ACK or, by an
// endpoint still holding the old connection, a challenge ACK the client resets.
func (c *tcpConv) reopen() {
	g, cl, sv := c.g, c.c, c.s
	oldC, oldS := cl.nxt, sv.nxt
	cl.isn = g.isn()
	cl.nxt = cl.isn
	c.send(cl, 0, "S")
	if g.r.IntN(2) == 0 {
		c.seg(sv, "A", oldS, oldC, 0) // challenge ACK
		c.seg(cl, "R", oldC, 0, 0)
		c.seg(cl, "S", cl.isn, 0, 0)
	}
	sv.isn = g.isn()
	sv.nxt = sv.isn
	c.send(sv, 0, "SA")
	c.send(cl, 0, "A")
	if g.r.IntN(2) == 0 {
		c.send(cl, 100, "PA")
	}
}
