// Package packet builds Ethernet frames for tests with gopacket: valid checksums by default,
// every field settable, so a test table reads as the packets it sends.
//
//	frame := packet.IP("198.18.0.1", "198.18.0.2").TCP(1234, 80, "S").Seq(100).MSS(1460).Bytes()
package packet

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Default MACs of built frames; tests that care set their own with MAC.
var (
	SrcMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
	DstMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}
)

// Builder describes one frame. Methods return the builder for chaining; misuse panics, as it
// is a bug in the test.
type Builder struct {
	eth     layers.Ethernet
	ip4     *layers.IPv4
	ip6     *layers.IPv6
	l4      gopacket.SerializableLayer
	tcp     *layers.TCP
	extra   []*ipv6Ext // between IP and L4
	l4body  []byte     // ICMPv6 bytes after type/code/checksum
	payload []byte
	badSum  bool
}

// IP starts a frame from src to dst; the family follows the addresses.
func IP(src, dst string) *Builder {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	if s.Is4() != d.Is4() {
		panic(fmt.Sprintf("packet: %s and %s are of different families", src, dst))
	}
	b := &Builder{eth: layers.Ethernet{SrcMAC: SrcMAC, DstMAC: DstMAC}}
	if s.Is4() {
		b.eth.EthernetType = layers.EthernetTypeIPv4
		b.ip4 = &layers.IPv4{Version: 4, TTL: 64, SrcIP: s.AsSlice(), DstIP: d.AsSlice(), Flags: layers.IPv4DontFragment}
	} else {
		b.eth.EthernetType = layers.EthernetTypeIPv6
		b.ip6 = &layers.IPv6{Version: 6, HopLimit: 64, SrcIP: s.AsSlice(), DstIP: d.AsSlice()}
	}
	return b
}

// MAC sets the Ethernet addresses.
func (b *Builder) MAC(src, dst net.HardwareAddr) *Builder {
	b.eth.SrcMAC, b.eth.DstMAC = src, dst
	return b
}

// TTL sets the IPv4 TTL or IPv6 hop limit.
func (b *Builder) TTL(ttl uint8) *Builder {
	if b.ip4 != nil {
		b.ip4.TTL = ttl
	} else {
		b.ip6.HopLimit = ttl
	}
	return b
}

// Fragment marks an IPv4 packet as a fragment at offset (in 8-byte units) with more-fragments.
func (b *Builder) Fragment(offset uint16, more bool) *Builder {
	b.ip4.Flags = 0
	if more {
		b.ip4.Flags = layers.IPv4MoreFragments
	}
	b.ip4.FragOffset = offset
	return b
}

// TCP adds a TCP header; flags is a string of S, A, F, R, P, U, E, C (e.g. "SA", "FA").
func (b *Builder) TCP(sport, dport uint16, flags string) *Builder {
	t := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Window: 65535}
	for _, f := range strings.ToUpper(flags) {
		switch f {
		case 'S':
			t.SYN = true
		case 'A':
			t.ACK = true
		case 'F':
			t.FIN = true
		case 'R':
			t.RST = true
		case 'P':
			t.PSH = true
		case 'U':
			t.URG = true
		case 'E':
			t.ECE = true
		case 'C':
			t.CWR = true
		default:
			panic(fmt.Sprintf("packet: unknown TCP flag %q", f))
		}
	}
	b.tcp, b.l4 = t, t
	return b
}

// Seq, Ack and Window set TCP fields.
func (b *Builder) Seq(n uint32) *Builder    { b.tcp.Seq = n; return b }
func (b *Builder) Ack(n uint32) *Builder    { b.tcp.Ack = n; return b }
func (b *Builder) Window(n uint16) *Builder { b.tcp.Window = n; return b }

// MSS, WScale and SACKPermitted append TCP options.
func (b *Builder) MSS(mss uint16) *Builder {
	return b.option(layers.TCPOptionKindMSS, []byte{byte(mss >> 8), byte(mss)})
}
func (b *Builder) WScale(shift uint8) *Builder {
	return b.option(layers.TCPOptionKindWindowScale, []byte{shift})
}
func (b *Builder) SACKPermitted() *Builder { return b.option(layers.TCPOptionKindSACKPermitted, nil) }

// SACK appends a SACK option with the blocks given as left, right edge pairs.
func (b *Builder) SACK(edges ...uint32) *Builder {
	data := make([]byte, 0, 4*len(edges))
	for _, e := range edges {
		data = binary.BigEndian.AppendUint32(data, e)
	}
	return b.option(layers.TCPOptionKindSACK, data)
}

// Option appends a TCP option of any kind (data is what follows kind and length).
func (b *Builder) Option(kind uint8, data []byte) *Builder {
	return b.option(layers.TCPOptionKind(kind), data)
}

func (b *Builder) option(kind layers.TCPOptionKind, data []byte) *Builder {
	b.tcp.Options = append(b.tcp.Options, layers.TCPOption{OptionType: kind, OptionLength: uint8(2 + len(data)), OptionData: data})
	return b
}

// UDP adds a UDP header.
func (b *Builder) UDP(sport, dport uint16) *Builder {
	b.l4 = &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
	return b
}

// Echo adds an ICMP or ICMPv6 echo request (or reply).
func (b *Builder) Echo(id, seq uint16, reply bool) *Builder {
	if b.ip4 != nil {
		typ := uint8(layers.ICMPv4TypeEchoRequest)
		if reply {
			typ = layers.ICMPv4TypeEchoReply
		}
		b.l4 = &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, 0), Id: id, Seq: seq}
		return b
	}
	typ := uint8(layers.ICMPv6TypeEchoRequest)
	if reply {
		typ = layers.ICMPv6TypeEchoReply
	}
	b.l4 = &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, 0)}
	b.l4body = []byte{byte(id >> 8), byte(id), byte(seq >> 8), byte(seq)}
	return b
}

// ICMPError adds an ICMP(v6) error of type/code quoting inner, an IP packet (see IPBytes).
func (b *Builder) ICMPError(typ, code uint8, inner []byte) *Builder {
	if b.ip4 != nil {
		b.l4 = &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, code)}
		b.payload = inner
		return b
	}
	b.l4 = &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, code)}
	b.l4body = make([]byte, 4) // unused / MTU / pointer word
	b.payload = inner
	return b
}

// IPv6Ext inserts an IPv6 extension header of the given type (hop-by-hop 0, routing 43,
// fragment 44, destination options 60) whose bytes after next-header and length are body,
// zero-padded to a multiple of 8 bytes in all.
func (b *Builder) IPv6Ext(typ layers.IPProtocol, body []byte) *Builder {
	b.extra = append(b.extra, &ipv6Ext{typ: typ, body: body})
	return b
}

// Payload sets the application bytes.
func (b *Builder) Payload(p []byte) *Builder { b.payload = p; return b }

// BadChecksum corrupts the transport checksum after serializing.
func (b *Builder) BadChecksum() *Builder { b.badSum = true; return b }

// Bytes serializes the whole frame.
func (b *Builder) Bytes() []byte {
	return b.serialize(true)
}

// IPBytes serializes from the IP header on (for quoting inside ICMP errors).
func (b *Builder) IPBytes() []byte {
	return b.serialize(false)
}

func (b *Builder) serialize(withEth bool) []byte {
	var ls []gopacket.SerializableLayer
	if withEth {
		ls = append(ls, &b.eth)
	}
	if b.ip4 != nil {
		b.ip4.Protocol = protocolOf(b.l4)
		ls = append(ls, b.ip4)
	} else {
		// Chain the next-header fields: IPv6 → extensions in order → transport.
		next := protocolOf(b.l4)
		for i := len(b.extra) - 1; i >= 0; i-- {
			b.extra[i].next = next
			next = b.extra[i].typ
		}
		b.ip6.NextHeader = next
		ls = append(ls, b.ip6)
		for _, e := range b.extra {
			ls = append(ls, e)
		}
	}
	if n, ok := b.l4.(interface {
		SetNetworkLayerForChecksum(gopacket.NetworkLayer) error
	}); ok {
		if b.ip4 != nil {
			_ = n.SetNetworkLayerForChecksum(b.ip4)
		} else {
			_ = n.SetNetworkLayerForChecksum(b.ip6)
		}
	}
	if b.l4 != nil {
		ls = append(ls, b.l4)
	}
	ls = append(ls, gopacket.Payload(append(append([]byte(nil), b.l4body...), b.payload...)))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		panic(fmt.Sprintf("packet: serialize: %v", err))
	}
	out := buf.Bytes()
	if b.badSum {
		// Count from the front: short frames carry Ethernet padding at the end.
		off := 20
		if withEth {
			off += 14
		}
		if b.ip6 != nil {
			off = off - 20 + 40
			for _, e := range b.extra {
				off += (2 + len(e.body) + 7) &^ 7
			}
		}
		out[off+l4ChecksumOffset(b.l4)] ^= 0xff
	}
	return out
}

func l4ChecksumOffset(l gopacket.SerializableLayer) int {
	switch l.(type) {
	case *layers.TCP:
		return 16
	case *layers.UDP:
		return 6
	default:
		return 2
	}
}

func protocolOf(l gopacket.SerializableLayer) layers.IPProtocol {
	switch l.(type) {
	case *layers.TCP:
		return layers.IPProtocolTCP
	case *layers.UDP:
		return layers.IPProtocolUDP
	case *layers.ICMPv4:
		return layers.IPProtocolICMPv4
	case *layers.ICMPv6:
		return layers.IPProtocolICMPv6
	}
	return layers.IPProtocolNoNextHeader
}

// Decode parses a frame with gopacket, the reference decoder tests compare against.
func Decode(frame []byte) gopacket.Packet {
	return gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
}

// ipv6Ext is a generic IPv6 extension header (gopacket has no serializer for most of them).
type ipv6Ext struct {
	typ, next layers.IPProtocol
	body      []byte
}

func (e *ipv6Ext) LayerType() gopacket.LayerType { return gopacket.LayerTypePayload }

func (e *ipv6Ext) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	n := (2 + len(e.body) + 7) &^ 7
	buf, err := b.PrependBytes(n)
	if err != nil {
		return err
	}
	clear(buf)
	buf[0], buf[1] = byte(e.next), byte(n/8-1)
	copy(buf[2:], e.body)
	return nil
}
