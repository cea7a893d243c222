package vnet

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/vnet/clock"
	"github.com/flowplane/flowplane/internal/vnet/ipv4"
)

// memLink is a link whose packets are delivered on a virtual clock, 1 ms later, and recorded,
// so IP-layer behaviour can be tested deterministically.
type memLink struct {
	clk  *clock.Virtual
	mtu  int
	to   func([]byte)
	mu   sync.Mutex
	seen [][]byte // packets sent on this link
}

func (l *memLink) Send(pkt []byte) {
	p := append([]byte(nil), pkt...)
	l.mu.Lock()
	l.seen = append(l.seen, p)
	l.mu.Unlock()
	l.clk.AfterFunc(time.Millisecond, func() { l.to(p) })
}
func (l *memLink) MTU() int     { return l.mtu }
func (l *memLink) Close() error { return nil }

// detNet is h1 - r1 - h2 on a virtual clock; the r1-h2 link has MTU 1280.
type detNet struct {
	clk        *clock.Virtual
	h1, r1, h2 *Node
	links      []*memLink // h1->r1, r1->h1, r1->h2, h2->r1
}

func newDetNet(t *testing.T) *detNet {
	d := &detNet{clk: clock.NewVirtual()}
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	mk := func(mtu int) *memLink { l := &memLink{clk: d.clk, mtu: mtu}; d.links = append(d.links, l); return l }
	h1r1, r1h1, r1h2, h2r1 := mk(1500), mk(1500), mk(1280), mk(1280)
	d.h1 = NewNode(NodeConfig{Name: "h1", Clock: d.clk}, []IfaceConfig{{Name: "eth0", Addr: p("198.18.0.1/24"), Peer: p("198.18.0.2/24").Addr(), Link: h1r1}})
	d.r1 = NewNode(NodeConfig{Name: "r1", Router: true, Clock: d.clk}, []IfaceConfig{
		{Name: "eth0", Addr: p("198.18.0.2/24"), Peer: p("198.18.0.1/24").Addr(), Link: r1h1},
		{Name: "eth1", Addr: p("198.18.1.1/24"), Peer: p("198.18.1.2/24").Addr(), Link: r1h2}})
	d.h2 = NewNode(NodeConfig{Name: "h2", Clock: d.clk}, []IfaceConfig{{Name: "eth0", Addr: p("198.18.1.2/24"), Peer: p("198.18.1.1/24").Addr(), Link: h2r1}})
	h1r1.to = func(b []byte) { d.r1.Input(d.r1.ifaces[0], b) }
	r1h1.to = func(b []byte) { d.h1.Input(d.h1.ifaces[0], b) }
	r1h2.to = func(b []byte) { d.h2.Input(d.h2.ifaces[0], b) }
	h2r1.to = func(b []byte) { d.r1.Input(d.r1.ifaces[1], b) }
	for _, n := range []*Node{d.h1, d.r1, d.h2} {
		n.Start()
		t.Cleanup(n.Close)
	}
	d.clk.Advance(time.Second) // RIP start-up
	return d
}

// icmpTo lists the ICMP messages delivered to h1.
func (d *detNet) icmpToH1() []ipv4.ICMP {
	var out []ipv4.ICMP
	d.links[1].mu.Lock()
	defer d.links[1].mu.Unlock()
	for _, p := range d.links[1].seen {
		h, payload, err := ipv4.Parse(p)
		if err != nil || h.Proto != ipv4.ProtoICMP {
			continue
		}
		m, err := ipv4.ParseICMP(payload)
		if err == nil {
			out = append(out, m)
		}
	}
	return out
}

func TestDetRIPBuildsTables(t *testing.T) {
	t.Parallel()
	d := newDetNet(t)
	if r, ok := d.h1.table.Load().lookup(netip.MustParseAddr("198.18.1.2")); !ok || r.NextHop != netip.MustParseAddr("198.18.0.2") || r.Metric != 1 {
		t.Fatalf("h1 route to h2's subnet: %+v %v", r, ok)
	}
}

func TestDetDontFragmentGetsFragNeeded(t *testing.T) {
	t.Parallel()
	d := newDetNet(t)
	h := ipv4.Header{TotalLen: 1400, ID: 9, DF: true, TTL: 64, Proto: ipv4.ProtoTest,
		Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.1.2")}
	pkt := make([]byte, 1400)
	ipv4.Put(pkt, &h)
	d.h1.Output(pkt)
	d.clk.Advance(10 * time.Millisecond)
	ms := d.icmpToH1()
	if len(ms) != 1 || ms[0].Type != ipv4.ICMPUnreachable || ms[0].Code != ipv4.CodeFragNeeded || ms[0].Rest&0xffff != 1280 {
		t.Fatalf("want fragmentation needed with MTU 1280, got %+v", ms)
	}
	if d.r1.Stats.FragNeeded.Load() != 1 {
		t.Fatal("not counted")
	}
}

func TestDetFragmentsReassembledAndTimeout(t *testing.T) {
	t.Parallel()
	d := newDetNet(t)
	if err := d.h1.SendIP(netip.MustParseAddr("198.18.1.2"), ipv4.ProtoTest, 64, make([]byte, 3000)); err != nil {
		t.Fatal(err)
	}
	d.clk.Advance(10 * time.Millisecond)
	if got := d.h2.Texts(); len(got) != 1 || len(got[0].Text) != 3000 || d.r1.Stats.Fragmented.Load() == 0 {
		t.Fatalf("fragmented datagram: %d messages, fragmented %d", len(got), d.r1.Stats.Fragmented.Load())
	}
	// A first fragment whose rest never comes: time exceeded (reassembly) after 30 s.
	h := ipv4.Header{TotalLen: 20 + 64, ID: 77, MF: true, TTL: 64, Proto: ipv4.ProtoTest,
		Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.1.2")}
	pkt := make([]byte, h.TotalLen)
	ipv4.Put(pkt, &h)
	d.h1.Output(pkt)
	d.clk.Advance(32 * time.Second)
	found := false
	for _, m := range d.icmpToH1() {
		if m.Type == ipv4.ICMPTimeExceeded && m.Code == ipv4.CodeReassemblyTime {
			found = true
		}
	}
	if !found || d.h2.Stats.ReasmTimed.Load() != 1 {
		t.Fatalf("no reassembly time exceeded (timed out %d)", d.h2.Stats.ReasmTimed.Load())
	}
}

func TestDetTTLAndUnreachable(t *testing.T) {
	t.Parallel()
	d := newDetNet(t)
	_ = d.h1.SendIP(netip.MustParseAddr("198.18.1.2"), ipv4.ProtoTest, 1, []byte("dies at r1"))
	d.clk.Advance(10 * time.Millisecond)
	d.r1.SetUp(d.r1.ifaces[1], false) // h2's subnet becomes unreachable
	_ = d.h1.SendIP(netip.MustParseAddr("198.18.1.2"), ipv4.ProtoTest, 64, []byte("no route"))
	d.clk.Advance(10 * time.Millisecond)
	var types []uint8
	for _, m := range d.icmpToH1() {
		types = append(types, m.Type)
	}
	if len(types) != 2 || types[0] != ipv4.ICMPTimeExceeded || types[1] != ipv4.ICMPUnreachable {
		t.Fatalf("ICMP to h1: %v", types)
	}
	// RIP told h1 too: its route is gone within a second.
	d.clk.Advance(time.Second)
	if _, ok := d.h1.table.Load().lookup(netip.MustParseAddr("198.18.1.2")); ok {
		t.Fatal("h1 still routes to a subnet behind a downed interface")
	}
	// Unknown protocol at a host: protocol unreachable.
	d.r1.SetUp(d.r1.ifaces[1], true)
	d.clk.Advance(time.Second)
	_ = d.h1.SendIP(netip.MustParseAddr("198.18.1.2"), 99, 64, []byte("?"))
	d.clk.Advance(10 * time.Millisecond)
	ms := d.icmpToH1()
	if last := ms[len(ms)-1]; last.Type != ipv4.ICMPUnreachable || last.Code != ipv4.CodeProtoUnreach {
		t.Fatalf("unknown protocol: %+v", last)
	}
}
