package packet

import (
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// verify decodes a frame with gopacket and fails on any decoding error.
func verify(t *testing.T, frame []byte) gopacket.Packet {
	t.Helper()
	p := Decode(frame)
	if el := p.ErrorLayer(); el != nil {
		t.Fatalf("decode: %v", el.Error())
	}
	return p
}

func TestTCPBuilder(t *testing.T) {
	t.Parallel()
	f := IP("198.18.0.1", "198.18.0.2").TCP(1234, 80, "SA").Seq(0xfffffff0).Ack(101).Window(512).MSS(1460).WScale(7).SACKPermitted().TTL(9).Bytes()
	p := verify(t, f)
	ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	tcp := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if ip.TTL != 9 || !tcp.SYN || !tcp.ACK || tcp.Seq != 0xfffffff0 || tcp.Ack != 101 || tcp.Window != 512 || len(tcp.Options) < 3 {
		t.Errorf("fields: ttl %d %+v", ip.TTL, tcp)
	}
	if !tcpChecksumOK(t, p) {
		t.Error("TCP checksum is wrong")
	}
	if tcpChecksumOK(t, Decode(IP("198.18.0.1", "198.18.0.2").TCP(1, 2, "S").BadChecksum().Bytes())) {
		t.Error("BadChecksum left the checksum valid")
	}
}

// tcpChecksumOK: gopacket's ComputeChecksum sums the segment including its checksum field, which
// folds to zero exactly when the field is right.
func tcpChecksumOK(t *testing.T, p gopacket.Packet) bool {
	tcp := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if err := tcp.SetNetworkLayerForChecksum(p.NetworkLayer()); err != nil {
		t.Fatal(err)
	}
	sum, err := tcp.ComputeChecksum()
	if err != nil {
		t.Fatal(err)
	}
	return sum == 0
}

func TestIPv6ExtensionAndICMPv6(t *testing.T) {
	t.Parallel()
	f := IP("fd00::1", "fd00::2").IPv6Ext(layers.IPProtocolIPv6HopByHop, nil).IPv6Ext(layers.IPProtocolIPv6Destination, make([]byte, 10)).Echo(7, 9, false).Bytes()
	p := verify(t, f)
	ip6 := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	if ip6.NextHeader != layers.IPProtocolIPv6HopByHop {
		t.Errorf("next header %v", ip6.NextHeader)
	}
	echo, ok := p.Layer(layers.LayerTypeICMPv6Echo).(*layers.ICMPv6Echo)
	if !ok || echo.Identifier != 7 || echo.SeqNumber != 9 {
		t.Fatalf("echo not decoded: %v", p)
	}
	if len(f) != 14+40+8+16+8 {
		t.Errorf("frame length %d", len(f))
	}
}

func TestICMPErrorQuotesInner(t *testing.T) {
	t.Parallel()
	inner := IP("198.18.0.2", "198.18.0.1").UDP(53, 4000).IPBytes()
	p := verify(t, IP("198.18.0.9", "198.18.0.2").ICMPError(3, 3, inner).Bytes())
	icmp := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
	if icmp.TypeCode.Type() != 3 || icmp.TypeCode.Code() != 3 {
		t.Errorf("type/code %v", icmp.TypeCode)
	}
	if got := len(icmp.Payload); got != len(inner) {
		t.Errorf("quoted %d bytes, want %d", got, len(inner))
	}
}
