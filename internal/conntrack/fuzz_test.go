package conntrack

import (
	"math/rand"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/flowplane/flowplane/internal/packet"
)

// seeds are valid frames of every kind the program parses; the fuzzer mutates them.
func seeds() [][]byte {
	quoted := packet.IP(inHost, outHost).UDP(5000, 53).IPBytes()
	return [][]byte{
		packet.IP(inHost, outHost).TCP(40000, 80, "S").Seq(1).MSS(1460).WScale(7).SACKPermitted().Bytes(),
		packet.IP(inHost, outHost).TCP(40000, 80, "PA").Seq(1).Ack(2).Payload([]byte("hello")).Bytes(),
		packet.IP(inHost, outHost).UDP(5000, 53).Payload([]byte("query")).Bytes(),
		packet.IP(inHost, outHost).Echo(1, 2, false).Bytes(),
		packet.IP(outHost, inHost).ICMPError(3, 3, quoted).Bytes(),
		packet.IP(inHost6, outHost6).TCP(40000, 80, "S").Seq(1).WScale(3).Bytes(),
		packet.IP(inHost6, outHost6).IPv6Ext(layers.IPProtocolIPv6HopByHop, []byte{1, 4, 0, 0, 0, 0}).UDP(1, 2).Bytes(),
		packet.IP(inHost6, outHost6).Echo(1, 2, false).Bytes(),
	}
}

func mutate(r *rand.Rand, b []byte) []byte {
	out := append([]byte(nil), b...)
	switch r.Intn(4) {
	case 0: // truncate
		out = out[:14+r.Intn(len(out)-13)]
	case 1: // flip bytes past the Ethernet header
		for i := 0; i < 1+r.Intn(4); i++ {
			out[14+r.Intn(len(out)-14)] = byte(r.Intn(256))
		}
	case 2: // both
		out[14+r.Intn(len(out)-14)] = byte(r.Intn(256))
		out = out[:14+r.Intn(len(out)-13)]
	default: // random tail
		for i := 14 + r.Intn(len(out)-14); i < len(out); i++ {
			out[i] = byte(r.Intn(256))
		}
	}
	return out
}

// tupleOf is gopacket's view of a frame: ok only for a well-formed, unfragmented IPv4/IPv6
// TCP, UDP or ICMP echo packet whose IP length fits the frame.
func tupleOf(frame []byte) (src, dst netip.Addr, sport, dport uint16, proto uint8, ok bool) {
	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.DecodeOptions{Lazy: false, NoCopy: true})
	// Decode errors above the transport layer (a payload that is not valid DNS) do not matter.
	if ip, isv4 := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); isv4 {
		if ip.Flags&layers.IPv4MoreFragments != 0 || ip.FragOffset != 0 || int(ip.Length) > len(frame)-14 {
			return
		}
		src, dst = netip.AddrFrom4([4]byte(ip.SrcIP.To4())), netip.AddrFrom4([4]byte(ip.DstIP.To4()))
	} else if ip6, isv6 := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6); isv6 {
		if p.Layer(layers.LayerTypeIPv6Fragment) != nil {
			return
		}
		src, dst = netip.AddrFrom16([16]byte(ip6.SrcIP)), netip.AddrFrom16([16]byte(ip6.DstIP))
	} else {
		return
	}
	switch l := p.TransportLayer().(type) {
	case *layers.TCP:
		return src, dst, uint16(l.SrcPort), uint16(l.DstPort), 6, true
	case *layers.UDP:
		return src, dst, uint16(l.SrcPort), uint16(l.DstPort), 17, true
	}
	if ic, isICMP := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); isICMP && ic.TypeCode.Type() == layers.ICMPv4TypeEchoRequest {
		return src, dst, ic.Id, ic.Id, 1, true
	}
	if ic, isICMP := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6); isICMP && ic.TypeCode.Type() == layers.ICMPv6TypeEchoRequest {
		if echo, isEcho := p.Layer(layers.LayerTypeICMPv6Echo).(*layers.ICMPv6Echo); isEcho {
			return src, dst, echo.Identifier, echo.Identifier, 58, true
		}
	}
	return
}

// TestFuzzParse sends mutated frames from the inside and checks that every connection the
// program creates has the tuple gopacket reads from the same frame, and that nothing is
// confirmed without a reply. From the outside nothing may be forwarded at all.
func TestFuzzParse(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	r := rand.New(rand.NewSource(1))
	ss := seeds()
	created := 0
	for i := 0; i < 3000; i++ {
		frame := mutate(r, ss[r.Intn(len(ss))])
		before := f.counters()["new"]
		ret, _ := f.run(frame, f.in.Index)
		if f.counters()["new"] == before {
			continue
		}
		created++
		es := f.entries()
		src, dst, sport, dport, proto, ok := tupleOf(frame)
		if !ok || len(es) != 1 {
			t.Fatalf("frame %d (verdict %d) created %d entries but gopacket does not parse it as a trackable packet:\n%x", i, ret, len(es), frame)
		}
		e := es[0]
		gotSport, gotDport := e.Orig.Sport, e.Orig.Dport
		if proto == 1 || proto == 58 {
			gotSport, gotDport = e.Orig.ID, e.Orig.ID
		}
		if uint8(protoNumber(e.Proto)) != proto || e.Orig.Src != src || e.Orig.Dst != dst || gotSport != sport || gotDport != dport {
			t.Fatalf("frame %d: entry %+v, gopacket %s %s:%d → %s:%d\n%x", i, e, layers.IPProtocol(proto), src, sport, dst, dport, frame)
		}
		if e.SeenReply || e.Confirmed {
			t.Fatalf("frame %d confirmed a connection: %+v", i, e)
		}
		if _, err := f.tables.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d of 3000 mutated frames opened connections, all matching gopacket", created)

	// From the outside, with no connection open, nothing may get through.
	for i := 0; i < 2000; i++ {
		frame := mutate(r, ss[r.Intn(len(ss))])
		// Make it come from the outside host towards the inside one.
		if ret, _ := f.run(swapHosts(frame), f.out.Index); ret == xdpRedirect {
			t.Fatalf("unsolicited frame %d forwarded:\n%x", i, frame)
		}
	}
	if c := f.counters(); c["established"] != 0 {
		t.Errorf("random frames confirmed %d connections", c["established"])
	}
}

// swapHosts swaps the inside and outside addresses in a frame built by seeds (IP header at
// offset 14); a mutated header may not survive it, which is fine.
func swapHosts(frame []byte) []byte {
	out := append([]byte(nil), frame...)
	if len(out) >= 14+20 && out[12] == 0x08 && out[13] == 0x00 {
		s, d := out[26:30], out[30:34]
		var tmp [4]byte
		copy(tmp[:], s)
		copy(s, d)
		copy(d, tmp[:])
	} else if len(out) >= 14+40 && out[12] == 0x86 && out[13] == 0xdd {
		var tmp [16]byte
		copy(tmp[:], out[22:38])
		copy(out[22:38], out[38:54])
		copy(out[38:54], tmp[:])
	}
	return out
}
