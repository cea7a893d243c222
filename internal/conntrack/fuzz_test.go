package conntrack

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/progrun"
)

// Coverage-guided fuzzing of the data path (go test -fuzz, make fuzz). An input is a
// conversation of two frames: one that arrives from the inside, then one from the outside. The
// table is emptied before each input, so the outside frame meets only what the inside frame
// opened. Invariants checked on every input:
//
//   - every packet is counted once: forwarded, passed or under one drop reason;
//   - invalid_malformed counts exactly the packets whose transport header is truncated or
//     inconsistent, by a reference reading of the bytes;
//   - a connection the inside frame opens has the tuple gopacket reads from it, unconfirmed;
//   - an outside frame is forwarded only if it belongs to that connection (its tuple, or an
//     ICMP error quoting it) or opens one the policy allows (tcp/22, udp/53).

// fuzzConfig allows new connections from outside to tcp/22 and udp/53 only.
func fuzzConfig(hook string) *Config {
	c := &Config{Hook: hook}
	c.Allow.Ports = []string{"tcp/22", "udp/53"}
	return c
}

// conversations are the seeds: the exchanges the program knows, well formed.
func conversations() [][2][]byte {
	quoted := packet.IP(inHost, outHost).UDP(5000, 53).IPBytes()
	quoted6 := packet.IP(inHost6, outHost6).UDP(5000, 53).IPBytes()
	hbh := []byte{1, 4, 0, 0, 0, 0}
	return [][2][]byte{
		{packet.IP(inHost, outHost).TCP(40000, 80, "S").Seq(1).MSS(1460).WScale(7).SACKPermitted().Bytes(),
			packet.IP(outHost, inHost).TCP(80, 40000, "SA").Seq(100).Ack(2).MSS(1460).WScale(7).Bytes()},
		{packet.IP(inHost, outHost).TCP(40000, 80, "PA").Seq(1).Ack(2).Payload([]byte("hello")).Bytes(),
			packet.IP(outHost, inHost).TCP(80, 40000, "A").Seq(2).Ack(6).Bytes()},
		{packet.IP(inHost, outHost).TCP(40000, 80, "S").Seq(1).Bytes(),
			packet.IP(outHost, inHost).TCP(40001, 80, "S").Seq(1).Bytes()},
		{packet.IP(inHost, outHost).UDP(5000, 53).Payload([]byte("query")).Bytes(),
			packet.IP(outHost, inHost).UDP(53, 5000).Payload([]byte("answer")).Bytes()},
		{packet.IP(inHost, outHost).Echo(1, 2, false).Bytes(), packet.IP(outHost, inHost).Echo(1, 2, true).Bytes()},
		{packet.IP(inHost, outHost).UDP(5000, 53).Bytes(), packet.IP(outHost, inHost).ICMPError(3, 3, quoted).Bytes()},
		{packet.IP(inHost6, outHost6).TCP(40000, 80, "S").Seq(1).WScale(3).Bytes(),
			packet.IP(outHost6, inHost6).TCP(80, 40000, "SA").Seq(9).Ack(2).Bytes()},
		{packet.IP(inHost6, outHost6).IPv6Ext(layers.IPProtocolIPv6HopByHop, hbh).UDP(5000, 53).Bytes(),
			packet.IP(outHost6, inHost6).UDP(53, 5000).Bytes()},
		{packet.IP(inHost6, outHost6).Echo(1, 2, false).Bytes(), packet.IP(outHost6, inHost6).Echo(1, 2, true).Bytes()},
		{packet.IP(inHost6, outHost6).UDP(5000, 53).Bytes(), packet.IP(outHost6, inHost6).ICMPError(1, 4, quoted6).Bytes()},
		{nil, packet.IP(outHost, inHost).TCP(40000, 22, "S").Seq(1).Bytes()},
		{nil, packet.IP(outHost6, inHost6).UDP(5000, 53).Bytes()},
		{nil, packet.IP(outHost, inHost).TCP(40000, 23, "A").Seq(1).Ack(1).Bytes()},
	}
}

func FuzzConntrackXDP(f *testing.F) { fuzzConntrack(f, HookXDP) }

func FuzzConntrackTC(f *testing.F) { fuzzConntrack(f, HookTC) }

func fuzzConntrack(f *testing.F, hook string) {
	fx := newFixture(f, fuzzConfig(hook)) // once per fuzzing process
	for _, c := range conversations() {
		f.Add(c[0], c[1])
	}
	dirty := true // the table may hold entries: empty it before the next input
	f.Fuzz(func(t *testing.T, inside, outside []byte) {
		fx.t = t
		if dirty {
			if _, err := fx.tables.Flush(); err != nil {
				t.Fatal(err)
			}
			dirty = false
		}
		c := fx.counters()
		var es []Entry // what the inside frame opened
		if progrun.Accepts(fx.d.Program(), inside) {
			before := c
			_, c = fx.check(inside, fx.in.Index, before)
			if c["new"] > before["new"] {
				dirty, es = true, fx.entries()
				opened(t, inside, es)
			}
		}
		if !progrun.Accepts(fx.d.Program(), outside) {
			return
		}
		ret, after := fx.check(outside, fx.out.Index, c)
		dirty = dirty || after["new"] > c["new"]
		if ret == xdpRedirect {
			if why := unsolicited(fx.addressed(outside, fx.out.Index), es); why != "" {
				t.Fatalf("outside frame forwarded: %s\ninside:  %x\noutside: %x\nentries: %+v", why, inside, outside, es)
			}
		}
	})
}

// dropReasons are the counters of which a dropped packet increments exactly one.
var dropReasons = []string{"policy_drop", "table_full", "invalid_no_conn", "invalid_tcp_state", "invalid_window",
	"invalid_rst", "invalid_synack", "invalid_icmp", "invalid_malformed"}

// check runs frame as if it arrived on ifindex and checks that it was counted once, and
// malformed if and only if the reference reading says so. It returns the verdict (XDP's) and
// the counters after the run.
func (f *fixture) check(frame []byte, ifindex int, before Counters) (uint32, Counters) {
	t := f.t
	t.Helper()
	ret, _ := f.run(frame, ifindex)
	after := f.counters()
	delta := func(n string) uint64 { return after[n] - before[n] }
	var dropped uint64
	for _, n := range dropReasons {
		dropped += delta(n)
	}
	var want string
	switch ret {
	case xdpRedirect:
		want = "forwarded"
	case xdpPass:
		want = "passed"
	case xdpDrop:
		if dropped != 1 {
			t.Fatalf("dropped packet counted under %d drop reasons: %x", dropped, frame)
		}
	default:
		t.Fatalf("verdict %d: %x", ret, frame)
	}
	if want != "" && (delta(want) != 1 || dropped != 0) {
		t.Fatalf("verdict %d: %s +%d, drop reasons +%d: %x", ret, want, delta(want), dropped, frame)
	}
	if ret != xdpPass {
		if bad, known := malformed(frame); known && bad != (delta("invalid_malformed") == 1) {
			t.Fatalf("reference reading: malformed %v; program: verdict %d, invalid_malformed +%d\n%x", bad, ret, delta("invalid_malformed"), frame)
		}
	}
	return ret, after
}

// tcpValidFlags are the combinations of FIN, SYN, RST, ACK and URG Linux's tcp_valid_flags
// accepts (nf_conntrack_proto_tcp.c); the others are malformed.
var tcpValidFlags = map[byte]bool{0x02: true, 0x22: true, 0x12: true, 0x04: true, 0x14: true, 0x11: true, 0x31: true,
	0x10: true, 0x30: true}

// malformed is the reference reading of a frame the program tracked: whether its transport
// header (TCP, UDP, ICMP's first 8 bytes) is truncated or inconsistent with the IP length.
// known is false for frames it does not read (VLAN tags, fragments, ICMP errors, whose quoted
// packet the program reads further).
func malformed(frame []byte) (bad, known bool) {
	h := packet.ReadHeaders(frame)
	if h.Malformed != "" || h.Family == 0 || h.Fragment || h.L4 > h.End || h.End > len(frame) {
		return false, false // the program passes these
	}
	l4, iplen := frame[h.L4:], h.End-h.L4 // header bounds are checked against the frame
	switch h.Proto {
	case 6:
		if len(l4) < 20 {
			return true, true
		}
		doff := int(l4[12]>>4) * 4
		return doff < 20 || doff > len(l4) || doff > iplen || !tcpValidFlags[l4[13]&0x37], true
	case 17:
		if len(l4) < 8 {
			return true, true
		}
		ulen := int(binary.BigEndian.Uint16(l4[4:]))
		return ulen < 8 || ulen > iplen, true
	case 1, 58:
		if len(l4) < 8 {
			return true, true
		}
		if typ := l4[0]; h.Proto == 1 && typ != 0 && typ != 8 || h.Proto == 58 && typ != 128 && typ != 129 {
			return false, false // an error: the quoted packet is read on
		}
	}
	return false, true
}

// flow is gopacket's reading of a frame.
type flow struct {
	proto      uint8
	src, dst   netip.Addr
	sport      uint16 // the ICMP echo identifier for ICMP
	dport      uint16
	tcpFlags   uint8 // FIN SYN RST ACK
	echo       bool  // an ICMP echo request or reply
	icmpErr    bool  // an ICMP error, quoting qsrc → qdst
	qsrc, qdst netip.Addr
}

// flowOf reads a frame: the addresses from the IP header, the transport header with gopacket,
// found as parse.h finds it (packet.ReadHeaders: extension headers skipped by their length; their
// options are not read, where Linux's forwarding path drops a packet whose Hop-by-Hop options do
// not parse). ok for an unfragmented IPv4/IPv6 TCP, UDP or ICMP packet whose IP length
// fits the frame.
func flowOf(frame []byte) (fl flow, ok bool) {
	h := packet.ReadHeaders(frame)
	if h.Malformed != "" || h.Family == 0 || h.Fragment || h.L4 > h.End || h.End > len(frame) {
		return fl, false
	}
	ip := frame[h.L3:]
	if h.Family == 4 {
		fl.src, fl.dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	} else {
		fl.src, fl.dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	}
	l4 := map[uint8]gopacket.LayerType{6: layers.LayerTypeTCP, 17: layers.LayerTypeUDP, 1: layers.LayerTypeICMPv4,
		58: layers.LayerTypeICMPv6}[h.Proto]
	if l4 == 0 || h.Proto == 1 && h.Family != 4 || h.Proto == 58 && h.Family != 6 {
		return fl, false
	}
	p := gopacket.NewPacket(frame[h.L4:h.End], l4, gopacket.DecodeOptions{NoCopy: true})
	switch l := p.TransportLayer().(type) {
	case *layers.TCP:
		fl.proto, fl.sport, fl.dport = 6, uint16(l.SrcPort), uint16(l.DstPort)
		for i, on := range []bool{l.FIN, l.SYN, l.RST, false, l.ACK} {
			if on {
				fl.tcpFlags |= 1 << i
			}
		}
		return fl, true
	case *layers.UDP:
		fl.proto, fl.sport, fl.dport = 17, uint16(l.SrcPort), uint16(l.DstPort)
		return fl, true
	}
	var quoted []byte
	if ic, isICMP := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); isICMP {
		fl.proto = 1
		switch ic.TypeCode.Type() {
		case layers.ICMPv4TypeEchoRequest, layers.ICMPv4TypeEchoReply:
			fl.echo, fl.sport, fl.dport = true, ic.Id, ic.Id
			return fl, true
		}
		quoted = ic.Payload
	} else if ic, isICMP := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6); isICMP {
		fl.proto = 58
		switch ic.TypeCode.Type() {
		case layers.ICMPv6TypeEchoRequest, layers.ICMPv6TypeEchoReply:
			if len(ic.Payload) < 4 {
				return fl, false
			}
			id := binary.BigEndian.Uint16(ic.Payload)
			fl.echo, fl.sport, fl.dport = true, id, id
			return fl, true
		}
		if len(ic.Payload) >= 4 {
			quoted = ic.Payload[4:] // after the unused / MTU / pointer word
		}
	} else {
		return fl, false
	}
	switch {
	case len(quoted) >= 20 && quoted[0]>>4 == 4:
		fl.qsrc, fl.qdst = netip.AddrFrom4([4]byte(quoted[12:16])), netip.AddrFrom4([4]byte(quoted[16:20]))
	case len(quoted) >= 40 && quoted[0]>>4 == 6:
		fl.qsrc, fl.qdst = netip.AddrFrom16([16]byte(quoted[8:24])), netip.AddrFrom16([16]byte(quoted[24:40]))
	default:
		return fl, false
	}
	fl.icmpErr = true
	return fl, true
}

// opened checks the connection an inside frame opened against gopacket's reading of it.
func opened(t *testing.T, frame []byte, es []Entry) {
	t.Helper()
	fl, ok := flowOf(frame)
	if !ok || len(es) != 1 || fl.icmpErr || (fl.proto == 1 || fl.proto == 58) && !fl.echo {
		t.Fatalf("frame opened %d connections but gopacket does not read it as a trackable packet:\n%x", len(es), frame)
	}
	e := es[0]
	sport, dport := e.Orig.Sport, e.Orig.Dport
	if fl.echo {
		sport, dport = e.Orig.ID, e.Orig.ID
	}
	if protoNumber(e.Proto) != fl.proto || e.Orig.Src != fl.src || e.Orig.Dst != fl.dst || sport != fl.sport || dport != fl.dport {
		t.Fatalf("entry %+v, gopacket %+v\n%x", e, fl, frame)
	}
	if e.SeenReply || e.Confirmed {
		t.Fatalf("one packet confirmed a connection: %+v\n%x", e, frame)
	}
}

// unsolicited says why an outside frame must not have been forwarded given the connections
// es open before it, or "" if it may have been.
func unsolicited(frame []byte, es []Entry) string {
	fl, ok := flowOf(frame)
	if !ok {
		return "gopacket does not read it as a trackable packet"
	}
	for _, e := range es {
		if protoNumber(e.Proto) != fl.proto && !fl.icmpErr {
			continue
		}
		for _, tu := range []Tuple{e.Orig, e.Reply} {
			switch {
			case fl.icmpErr:
				if tu.Src == fl.qsrc && tu.Dst == fl.qdst || tu.Src == fl.qdst && tu.Dst == fl.qsrc {
					return ""
				}
			case fl.echo:
				if tu.Src == fl.src && tu.Dst == fl.dst && tu.ID == fl.sport {
					return ""
				}
			default:
				if tu.Src == fl.src && tu.Dst == fl.dst && tu.Sport == fl.sport && tu.Dport == fl.dport {
					return ""
				}
			}
		}
	}
	// The policy: tcp/22 (a SYN, or an ACK as tcp_loose picks up), udp/53.
	switch {
	case fl.proto == 6 && fl.dport == 22 && (fl.tcpFlags == 0x02 || fl.tcpFlags == 0x10):
		return ""
	case fl.proto == 17 && fl.dport == 53:
		return ""
	}
	return "it matches no open connection and the policy does not allow it"
}
