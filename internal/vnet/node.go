package vnet

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowplane/flowplane/internal/vnet/clock"
	"github.com/flowplane/flowplane/internal/vnet/ipv4"
	"github.com/flowplane/flowplane/internal/vnet/rip"
	"github.com/flowplane/flowplane/internal/vnet/tcp"
)

// Link is what an interface sends through: a UDP link, a TAP device, or a test double.
type Link interface {
	Send(pkt []byte) // copies pkt; never blocks
	MTU() int
	Close() error
}

// Iface is a virtual interface.
type Iface struct {
	Index   int
	Name    string
	Addr    netip.Prefix // address and prefix length
	Peer    netip.Addr   // the neighbour's address on the link
	node    *Node
	link    Link
	up      atomic.Bool
	batch   tcp.Batch // used only by the goroutine reading this interface
	capture atomic.Pointer[Capture]
	Stats   IfaceStats
}

// IfaceStats counts an interface's traffic at the IP layer.
type IfaceStats struct {
	In, Out, DownDrops atomic.Uint64
}

// Up reports whether the interface is up.
func (i *Iface) Up() bool { return i.up.Load() }

// MTU is the link MTU.
func (i *Iface) MTU() int { return i.link.MTU() }

// Link is the link the interface sends through.
func (i *Iface) Link() Link { return i.link }

// NodeStats counts IP-layer events; malformed packets are counted here and dropped.
type NodeStats struct {
	Received, Delivered, Forwarded, Sent              atomic.Uint64
	BadHeader, BadChecksum, BadLength, BadVersion     atomic.Uint64
	TTLExceeded, NoRoute, NotForUs, FragNeeded        atomic.Uint64
	Fragmented, Reassembled, ReasmDropped, ReasmTimed atomic.Uint64
	ICMPIn, ICMPOut, ICMPMalformed, ProtoUnreachable  atomic.Uint64
	TestMessages, Loopback                            atomic.Uint64
}

// Node is one host or router: interfaces, a forwarding table kept by RIP, and a TCP layer.
type Node struct {
	Name   string
	Router bool
	clk    clock.Clock
	log    *slog.Logger
	ifaces []*Iface
	table  atomic.Pointer[table]
	tcp    *tcp.Mux
	rip    *rip.Router
	ipID   atomic.Uint32

	mu       sync.Mutex // guards the fields below
	reasm    *ipv4.Reassembler
	pings    map[uint16]chan pingEvent
	nextPing uint16
	texts    []TextMessage
	icmpTok  float64
	icmpLast time.Duration

	loop   chan []byte
	done   chan struct{}
	closed atomic.Bool
	Stats  NodeStats
}

// TextMessage is a protocol-0 test message received by a node.
type TextMessage struct {
	From netip.Addr
	Text string
}

// NodeConfig configures a node.
type NodeConfig struct {
	Name   string
	Router bool
	Clock  clock.Clock
	Logger *slog.Logger
	TCP    tcp.Config
	RIP    rip.Config
}

// IfaceConfig describes one interface of a new node.
type IfaceConfig struct {
	Name    string
	Addr    netip.Prefix
	Peer    netip.Addr
	Link    Link
	Passive bool // the neighbour does not speak RIP (a TAP link to Linux)
}

// NewNode builds a node over the given interfaces; Start begins routing.
func NewNode(cfg NodeConfig, ifcs []IfaceConfig) *Node {
	if cfg.Clock == nil {
		cfg.Clock = clock.NewReal()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TCP.SendBuf == 0 {
		cfg.TCP = tcp.DefaultConfig()
	}
	if cfg.RIP.Period <= 0 {
		cfg.RIP = rip.DefaultConfig()
	}
	n := &Node{Name: cfg.Name, Router: cfg.Router, clk: cfg.Clock, log: cfg.Logger.With("node", cfg.Name),
		reasm: ipv4.NewReassembler(), pings: map[uint16]chan pingEvent{}, loop: make(chan []byte, 1024),
		done: make(chan struct{}), icmpTok: icmpBurst}
	var ripIfs []rip.Iface
	for i, c := range ifcs {
		ifc := &Iface{Index: i, Name: c.Name, Addr: c.Addr, Peer: c.Peer, node: n, link: c.Link}
		ifc.up.Store(true)
		n.ifaces = append(n.ifaces, ifc)
		ripIfs = append(ripIfs, rip.Iface{Prefix: c.Addr, Peer: c.Peer, Up: true, Passive: c.Passive})
	}
	n.tcp = tcp.NewMux(n, cfg.TCP)
	rc := cfg.RIP
	rc.Advertise = cfg.Router
	n.rip = rip.New(n.clk, rc, ripIfs, n.sendRIP, n.install)
	go n.loopback()
	return n
}

// Start begins RIP (a request on every interface, then periodic updates) and the reassembly
// timeout sweep.
func (n *Node) Start() {
	n.rip.Start()
	n.clk.AfterFunc(time.Second, n.reasmSweep)
}

// reasmSweep gives up on datagrams whose fragments stopped coming, once a second.
func (n *Node) reasmSweep() {
	if n.closed.Load() {
		return
	}
	n.mu.Lock()
	expired := n.reasm.Expire(n.clk.Now())
	n.mu.Unlock()
	for _, e := range expired {
		n.Stats.ReasmTimed.Add(1)
		if e.GotFirst {
			q := n.build(e.First.Src, e.First.Dst, e.First.Proto, e.First.TTL, e.Data[:min(8, len(e.Data))])
			n.icmpError(q, ipv4.ICMPTimeExceeded, ipv4.CodeReassemblyTime, 0)
		}
	}
	n.clk.AfterFunc(time.Second, n.reasmSweep)
}

// Close stops the node and its links.
func (n *Node) Close() {
	if n.closed.Swap(true) {
		return
	}
	n.rip.Stop()
	for _, c := range n.tcp.Conns() {
		c.Abort()
	}
	close(n.done)
	for _, i := range n.ifaces {
		_ = i.link.Close()
	}
}

// Ifaces lists the interfaces.
func (n *Node) Ifaces() []*Iface { return n.ifaces }

// Iface finds an interface by name (eth0) or index.
func (n *Node) Iface(name string) *Iface {
	for _, i := range n.ifaces {
		if i.Name == name || fmt.Sprint(i.Index) == name {
			return i
		}
	}
	return nil
}

// TCP is the node's TCP layer.
func (n *Node) TCP() *tcp.Mux { return n.tcp }

// RIP is the node's routing protocol instance.
func (n *Node) RIP() *rip.Router { return n.rip }

// Routes is the current forwarding table.
func (n *Node) Routes() []Route {
	t := n.table.Load()
	if t == nil {
		return nil
	}
	return append([]Route(nil), (*t)...)
}

// Texts returns and clears received test messages.
func (n *Node) Texts() []TextMessage {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.texts
	n.texts = nil
	return t
}

// SetUp brings an interface up or down; RIP poisons routes through a downed interface at once.
func (n *Node) SetUp(ifc *Iface, up bool) {
	ifc.up.Store(up)
	n.rip.SetIfaceUp(ifc.Index, up)
}

// install is RIP's callback with the new table.
func (n *Node) install(rs []rip.Route) {
	routes := make([]Route, 0, len(rs))
	for _, r := range rs {
		if r.Iface < 0 || r.Iface >= len(n.ifaces) {
			continue
		}
		routes = append(routes, Route{Prefix: r.Prefix, NextHop: r.NextHop, Iface: n.ifaces[r.Iface], Metric: r.Metric, Connected: r.Connected})
	}
	n.table.Store(newTable(routes))
}

func (n *Node) sendRIP(i int, dst netip.Addr, msg []byte) {
	ifc := n.ifaces[i]
	n.sendVia(ifc, ifc.Addr.Addr(), dst, ipv4.ProtoRIP, 1, msg)
}

// Clock implements tcp.Host.
func (n *Node) Clock() clock.Clock { return n.clk }

// MTU implements tcp.Host: the MTU of the route to dst.
func (n *Node) MTU(dst netip.Addr) int {
	if n.isLocal(dst) {
		return 65535
	}
	r, ok := n.table.Load().lookup(dst)
	if !ok {
		return 0
	}
	return r.Iface.MTU()
}

// SourceFor picks the source address for packets to dst: the outgoing interface's address.
func (n *Node) SourceFor(dst netip.Addr) (netip.Addr, bool) {
	if n.isLocal(dst) {
		return dst, true
	}
	r, ok := n.table.Load().lookup(dst)
	if !ok {
		return netip.Addr{}, false
	}
	return r.Iface.Addr.Addr(), true
}

func (n *Node) isLocal(a netip.Addr) bool {
	for _, i := range n.ifaces {
		if i.Addr.Addr() == a {
			return true
		}
	}
	return false
}

// Output implements tcp.Host: route and send a complete IPv4 packet built by this node.
func (n *Node) Output(pkt []byte) {
	if len(pkt) < ipv4.HeaderLen {
		return
	}
	dst := netip.AddrFrom4([4]byte(pkt[16:20]))
	n.Stats.Sent.Add(1)
	if n.isLocal(dst) {
		n.Stats.Loopback.Add(1)
		select {
		case n.loop <- append([]byte(nil), pkt...):
		default: // loopback queue full: dropped like any congested queue
		}
		return
	}
	r, ok := n.table.Load().lookup(dst)
	if !ok {
		n.Stats.NoRoute.Add(1)
		return
	}
	n.transmit(r.Iface, pkt, nil)
}

// sendVia builds a packet and sends it out of ifc, bypassing the table (RIP and ICMP replies
// on the arrival link).
func (n *Node) sendVia(ifc *Iface, src, dst netip.Addr, proto uint8, ttl uint8, payload []byte) {
	pkt := n.build(src, dst, proto, ttl, payload)
	n.Stats.Sent.Add(1)
	n.transmit(ifc, pkt, nil)
}

func (n *Node) build(src, dst netip.Addr, proto, ttl uint8, payload []byte) []byte {
	pkt := make([]byte, ipv4.HeaderLen+len(payload))
	h := ipv4.Header{TotalLen: len(pkt), ID: uint16(n.ipID.Add(1)), TTL: ttl, Proto: proto, Src: src, Dst: dst}
	ipv4.Put(pkt, &h)
	copy(pkt[ipv4.HeaderLen:], payload)
	return pkt
}

// SendIP sends payload to dst with the given protocol, routed by the table.
func (n *Node) SendIP(dst netip.Addr, proto uint8, ttl uint8, payload []byte) error {
	if len(payload) > 65535-ipv4.HeaderLen {
		return fmt.Errorf("payload of %d bytes is larger than an IPv4 packet can carry", len(payload))
	}
	src, ok := n.SourceFor(dst)
	if !ok {
		return fmt.Errorf("%w: %v", ErrNoRoute, dst)
	}
	n.Output(n.build(src, dst, proto, ttl, payload))
	return nil
}

// transmit sends a packet out of ifc, fragmenting to the MTU. in is the interface it arrived on
// when forwarding (for ICMP errors), nil for local traffic.
func (n *Node) transmit(ifc *Iface, pkt []byte, in *Iface) {
	if !ifc.Up() {
		ifc.Stats.DownDrops.Add(1)
		return
	}
	if len(pkt) <= ifc.MTU() {
		ifc.Stats.Out.Add(1)
		if c := ifc.capture.Load(); c != nil {
			c.Packet(pkt)
		}
		ifc.link.Send(pkt)
		return
	}
	n.Stats.Fragmented.Add(1)
	err := ipv4.Fragment(pkt, ifc.MTU(), nil, func(f []byte) {
		ifc.Stats.Out.Add(1)
		if c := ifc.capture.Load(); c != nil {
			c.Packet(f)
		}
		ifc.link.Send(f)
	})
	if err == ipv4.ErrFragDF {
		n.Stats.FragNeeded.Add(1)
		var rest [4]byte
		rest[2], rest[3] = byte(ifc.MTU()>>8), byte(ifc.MTU())
		n.icmpError(pkt, ipv4.ICMPUnreachable, ipv4.CodeFragNeeded, uint32(rest[2])<<8|uint32(rest[3]))
	}
}

// Input handles a packet received on ifc; the buffer is only valid during the call.
func (n *Node) Input(ifc *Iface, pkt []byte) {
	if !ifc.Up() {
		ifc.Stats.DownDrops.Add(1)
		return
	}
	ifc.Stats.In.Add(1)
	n.Stats.Received.Add(1)
	if c := ifc.capture.Load(); c != nil {
		c.Packet(pkt)
	}
	h, payload, err := ipv4.Parse(pkt)
	if err != nil {
		n.countBad(err)
		return
	}
	if n.isLocal(h.Dst) || h.Dst == broadcast {
		n.deliver(ifc, h, pkt[:h.TotalLen], payload)
		return
	}
	if !n.Router {
		n.Stats.NotForUs.Add(1)
		return
	}
	n.forward(ifc, h, pkt[:h.TotalLen])
}

func (n *Node) countBad(err error) {
	switch err {
	case ipv4.ErrChecksum:
		n.Stats.BadChecksum.Add(1)
	case ipv4.ErrVersion:
		n.Stats.BadVersion.Add(1)
	case ipv4.ErrShort, ipv4.ErrHdrLen:
		n.Stats.BadHeader.Add(1)
	default:
		n.Stats.BadLength.Add(1)
	}
}

func (n *Node) forward(in *Iface, h ipv4.Header, pkt []byte) {
	if h.TTL <= 1 {
		n.Stats.TTLExceeded.Add(1)
		n.icmpError(pkt, ipv4.ICMPTimeExceeded, ipv4.CodeTTLExceeded, 0)
		return
	}
	r, ok := n.table.Load().lookup(h.Dst)
	if !ok {
		n.Stats.NoRoute.Add(1)
		n.icmpError(pkt, ipv4.ICMPUnreachable, ipv4.CodeNetUnreachable, 0)
		return
	}
	ipv4.DecTTL(pkt)
	n.Stats.Forwarded.Add(1)
	n.transmit(r.Iface, pkt, in)
}

// deliver hands a packet addressed to this node to its protocol.
func (n *Node) deliver(ifc *Iface, h ipv4.Header, pkt, payload []byte) {
	if h.MF || h.FragOff > 0 {
		n.mu.Lock()
		now := n.clk.Now()
		expired := n.reasm.Expire(now)
		dropped := n.reasm.Dropped
		whole := n.reasm.Add(h, payload, now)
		if n.reasm.Dropped != dropped {
			n.Stats.ReasmDropped.Add(1)
		}
		n.mu.Unlock()
		for _, e := range expired {
			n.Stats.ReasmTimed.Add(1)
			if e.GotFirst { // RFC 792: time exceeded in reassembly, quoting the first fragment
				q := n.build(e.First.Src, e.First.Dst, e.First.Proto, e.First.TTL, e.Data[:min(8, len(e.Data))])
				n.icmpError(q, ipv4.ICMPTimeExceeded, ipv4.CodeReassemblyTime, 0)
			}
		}
		if whole == nil {
			return
		}
		n.Stats.Reassembled.Add(1)
		var err error
		pkt = whole
		h, payload, err = ipv4.Parse(whole)
		if err != nil {
			n.countBad(err)
			return
		}
	}
	n.Stats.Delivered.Add(1)
	switch h.Proto {
	case ipv4.ProtoTCP:
		var b *tcp.Batch
		if ifc != nil {
			b = &ifc.batch
		}
		n.tcp.Input(h.Src, h.Dst, payload, b)
	case ipv4.ProtoICMP:
		n.icmpInput(ifc, h, payload)
	case ipv4.ProtoRIP:
		if ifc != nil {
			n.rip.Input(ifc.Index, h.Src, payload)
		}
	case ipv4.ProtoTest:
		n.Stats.TestMessages.Add(1)
		n.mu.Lock()
		if len(n.texts) < 1000 {
			n.texts = append(n.texts, TextMessage{From: h.Src, Text: string(payload)})
		}
		n.mu.Unlock()
		n.log.Debug("test message", "from", h.Src, "text", string(payload[:min(len(payload), 80)]))
	default:
		n.Stats.ProtoUnreachable.Add(1)
		n.icmpError(pkt, ipv4.ICMPUnreachable, ipv4.CodeProtoUnreach, 0)
	}
}

// flush sends ACKs deferred while a batch of packets from ifc was processed.
func (n *Node) flush(ifc *Iface) { ifc.batch.Flush() }

func (n *Node) loopback() {
	for {
		select {
		case pkt := <-n.loop:
			h, payload, err := ipv4.Parse(pkt)
			if err != nil {
				n.countBad(err)
				continue
			}
			n.deliver(nil, h, pkt, payload)
		case <-n.done:
			return
		}
	}
}

// selfStarting is a link that needs no peer address to start, like a TAP device.
type selfStarting interface {
	Start(handle func([]byte), flush func())
}

// StartLinks starts the node's self-starting links (TAP devices); UDP links are started by
// Network and StartNode, which know the peers' ports.
func (n *Node) StartLinks() {
	for _, i := range n.ifaces {
		if s, ok := i.link.(selfStarting); ok {
			ifc := i
			s.Start(func(p []byte) { n.Input(ifc, p) }, func() { n.flush(ifc) })
		}
	}
}
