package tcp

import (
	crand "crypto/rand"
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowplane/flowplane/internal/vnet/ipv4"
)

// Mux is the TCP layer of one host: it owns the connection and listener tables and turns
// incoming segments into connection events.
type Mux struct {
	host Host
	cfg  Config

	mu        sync.RWMutex
	conns     map[Tuple]*Conn
	listeners map[listenKey]*Listener
	nextPort  uint16

	chMu     sync.Mutex
	chWindow time.Duration
	chCount  int

	// Counters, for the stats command; malformed segments are dropped and counted here.
	SegsIn, Malformed, BadChecksum, NoSocket, RSTsSent, ListenOverflow atomic.Uint64
}

type listenKey struct {
	addr netip.Addr // unspecified: all local addresses
	port uint16
}

// NewMux returns the TCP layer for host.
func NewMux(h Host, cfg Config) *Mux {
	if cfg.SendBuf <= 0 || cfg.RecvBuf <= 0 {
		d := DefaultConfig()
		cfg.SendBuf, cfg.RecvBuf = d.SendBuf, d.RecvBuf
	}
	return &Mux{host: h, cfg: cfg, conns: map[Tuple]*Conn{}, listeners: map[listenKey]*Listener{},
		nextPort: 49152 + uint16(randUint32()%16384)}
}

// Config is the configuration new connections get.
func (m *Mux) Config() Config { return m.cfg }

func randUint32() uint32 {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return binary.BigEndian.Uint32(b[:])
}

func (m *Mux) isn() uint32 {
	if m.cfg.ISN != nil {
		return m.cfg.ISN()
	}
	return randUint32()
}

func (m *Mux) output(pkt []byte) { m.host.Output(pkt) }

// allowChallenge rate-limits challenge ACKs host-wide (RFC 5961 7): at most 1000 per second.
func (m *Mux) allowChallenge(now time.Duration) bool {
	m.chMu.Lock()
	defer m.chMu.Unlock()
	if now-m.chWindow >= time.Second {
		m.chWindow, m.chCount = now, 0
	}
	m.chCount++
	return m.chCount <= 1000
}

// Batch collects connections whose ACK can wait until the end of a burst of received packets,
// so a batch of data segments costs one ACK (like GRO in Linux). Not safe for concurrent use:
// each receiving goroutine has its own.
type Batch struct{ conns []*Conn }

// Flush sends the deferred ACKs.
func (b *Batch) Flush() {
	for i, c := range b.conns {
		c.flushAck()
		b.conns[i] = nil
	}
	b.conns = b.conns[:0]
}

// Input handles one TCP segment from src to dst. b may be nil (ACK at once).
func (m *Mux) Input(src, dst netip.Addr, seg []byte, b *Batch) {
	m.SegsIn.Add(1)
	s, err := Parse(seg, src.As4(), dst.As4())
	if err != nil {
		if err == ErrChecksum {
			m.BadChecksum.Add(1)
		} else {
			m.Malformed.Add(1)
		}
		return
	}
	if s.SrcPort == 0 || s.DstPort == 0 {
		m.Malformed.Add(1)
		return
	}
	id := Tuple{dst, s.DstPort, src, s.SrcPort}
	m.mu.RLock()
	c := m.conns[id]
	m.mu.RUnlock()
	if c != nil {
		c.mu.Lock()
		reuse := c.reuseTimeWait(&s)
		if !reuse {
			c.input(&s, b)
		}
		c.mu.Unlock()
		if !reuse {
			return
		}
	}
	if s.Flags&(SYN|ACK|RST) == SYN {
		if l := m.listener(dst, s.DstPort); l != nil {
			l.syn(id, &s)
			return
		}
	}
	m.NoSocket.Add(1)
	m.reset(id, &s)
}

func (m *Mux) listener(addr netip.Addr, port uint16) *Listener {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if l := m.listeners[listenKey{addr, port}]; l != nil {
		return l
	}
	return m.listeners[listenKey{netip.IPv4Unspecified(), port}]
}

// reset answers a segment that matches no connection (RFC 9293 3.10.7.1).
func (m *Mux) reset(id Tuple, s *Segment) {
	if s.Flags&RST != 0 {
		return
	}
	r := Segment{SrcPort: id.LocalPort, DstPort: id.RemotePort}
	if s.Flags&ACK != 0 {
		r.Seq, r.Flags = s.Ack, RST
	} else {
		r.Ack, r.Flags = s.Seq.Add(s.Len()), RST|ACK
	}
	m.RSTsSent.Add(1)
	m.sendBare(id, &r)
}

func (m *Mux) sendBare(id Tuple, r *Segment) {
	pkt := make([]byte, ipv4.HeaderLen+HeaderLen)
	PutHeader(pkt[ipv4.HeaderLen:], r, 0, id.LocalAddr.As4(), id.RemoteAddr.As4())
	ih := ipv4.Header{TotalLen: len(pkt), TTL: 64, Proto: ipv4.ProtoTCP, Src: id.LocalAddr, Dst: id.RemoteAddr}
	ipv4.Put(pkt, &ih)
	m.host.Output(pkt)
}

func (m *Mux) remove(c *Conn) {
	m.mu.Lock()
	if m.conns[c.id] == c {
		delete(m.conns, c.id)
	}
	m.mu.Unlock()
}

// Listen opens a listener on addr:port; an unspecified addr listens on every local address.
func (m *Mux) Listen(addr netip.Addr, port uint16) (*Listener, error) {
	if !addr.IsValid() {
		addr = netip.IPv4Unspecified()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if port == 0 {
		port = m.ephemeralLocked(Tuple{LocalAddr: addr})
		if port == 0 {
			return nil, ErrPortInUse
		}
	}
	k := listenKey{addr, port}
	if m.listeners[k] != nil || m.listeners[listenKey{netip.IPv4Unspecified(), port}] != nil {
		return nil, ErrPortInUse
	}
	if addr.IsUnspecified() {
		for lk := range m.listeners {
			if lk.port == port {
				return nil, ErrPortInUse
			}
		}
	}
	l := &Listener{m: m, key: k, wake: make(chan struct{}, 1), backlog: max(m.cfg.Backlog, 1)}
	m.listeners[k] = l
	return l, nil
}

// ephemeralLocked finds a free local port for a connection to id's remote end.
func (m *Mux) ephemeralLocked(id Tuple) uint16 {
	for range 16384 {
		p := m.nextPort
		m.nextPort++
		if m.nextPort < 49152 {
			m.nextPort = 49152
		}
		id.LocalPort = p
		if _, used := m.conns[id]; used {
			continue
		}
		if m.listeners[listenKey{id.LocalAddr, p}] != nil || m.listeners[listenKey{netip.IPv4Unspecified(), p}] != nil {
			continue
		}
		return p
	}
	return 0
}

// Dial starts an active open from laddr (port 0: ephemeral) to raddr:rport. It returns at once
// with the connection in SYN-SENT; wait on StateWake and check Established.
func (m *Mux) Dial(laddr netip.Addr, lport uint16, raddr netip.Addr, rport uint16) (*Conn, error) {
	if m.host.MTU(raddr) <= 0 {
		return nil, ErrNoRoute
	}
	id := Tuple{LocalAddr: laddr, LocalPort: lport, RemoteAddr: raddr, RemotePort: rport}
	m.mu.Lock()
	if lport == 0 {
		if id.LocalPort = m.ephemeralLocked(id); id.LocalPort == 0 {
			m.mu.Unlock()
			return nil, ErrPortInUse
		}
	} else if m.conns[id] != nil {
		m.mu.Unlock()
		return nil, ErrPortInUse
	}
	c := newConn(m, id)
	m.conns[id] = c
	m.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ccs.MSS = c.mss
	c.cc.Init(&c.ccs)
	c.setState(SynSent)
	c.rttStart = c.now()
	c.sendSyn(false)
	c.sndNxt, c.sndMax = c.iss.Add(1), c.iss.Add(1)
	c.armRtx()
	return c, nil
}

// Conns lists live connections.
func (m *Mux) Conns() []*Conn {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]*Conn, 0, len(m.conns))
	for _, c := range m.conns {
		out = append(out, c)
	}
	return out
}

// Listeners lists open listeners.
func (m *Mux) Listeners() []*Listener {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]*Listener, 0, len(m.listeners))
	for _, l := range m.listeners {
		out = append(out, l)
	}
	return out
}
