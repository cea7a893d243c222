package prio

import (
	"encoding/binary"
	"net/netip"
)

// Frames built byte by byte, so a test can say exactly what is malformed (gopacket would fix
// lengths on the way out). Checksums are left zero: the classifier reads none.

func ipFrame(src, dst string, proto uint8, l4 []byte) []byte {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	eth := make([]byte, 14)
	copy(eth[0:6], []byte{2, 0, 0, 0, 0, 2})
	copy(eth[6:12], []byte{2, 0, 0, 0, 0, 1})
	if s.Is4() {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		ip[8], ip[9] = 64, proto
		copy(ip[12:16], s.AsSlice())
		copy(ip[16:20], d.AsSlice())
		return append(append(eth, ip...), l4...)
	}
	binary.BigEndian.PutUint16(eth[12:], 0x86dd)
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
	ip[6], ip[7] = proto, 64
	copy(ip[8:24], s.AsSlice())
	copy(ip[24:40], d.AsSlice())
	return append(append(eth, ip...), l4...)
}

// tcpSeg is a TCP segment with the given option bytes (padded with NOPs to a word) and
// payload length; doff 0 means "as long as the options".
func tcpSeg(sport, dport uint16, opts []byte, payload int, doff int) []byte {
	for len(opts)%4 != 0 {
		opts = append(opts, 1)
	}
	h := make([]byte, 20, 20+len(opts)+payload)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	if doff == 0 {
		doff = (20 + len(opts)) / 4
	}
	h[12] = byte(doff << 4)
	h[13] = 0x18 // PSH ACK
	binary.BigEndian.PutUint16(h[14:], 65535)
	h = append(h, opts...)
	return append(h, make([]byte, payload)...)
}

func tcpFrame(src, dst string, sport, dport uint16, opts []byte) []byte {
	return ipFrame(src, dst, 6, tcpSeg(sport, dport, opts, 100, 0))
}

// Common options, as Linux sends them.
var (
	optNOP   = []byte{1}
	optMSS   = []byte{2, 4, 0x05, 0xb4}
	optSACKP = []byte{4, 2}
	optTS    = []byte{8, 10, 0, 0, 0, 1, 0, 0, 0, 2}
	optWS    = []byte{3, 3, 7}
	optSACK  = []byte{5, 10, 0, 0, 0, 1, 0, 0, 0, 2}
)

func opts(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func ours(occ uint8, backlog uint32) []byte { return Option{Occupancy: occ, Backlog: backlog}.Encode() }

func udpFrame(src, dst string, sport, dport uint16) []byte {
	u := make([]byte, 8+32)
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	return ipFrame(src, dst, 17, u)
}

// sctpFrame is an SCTP packet whose first chunk has the given type, flags and length field
// (the original scheme's chunk: type 150, flags = occupancy, length 4), then a DATA chunk.
func sctpFrame(src, dst string, sport, dport uint16, typ, flags uint8, length uint16) []byte {
	s := make([]byte, 12+4+16)
	binary.BigEndian.PutUint16(s[0:], sport)
	binary.BigEndian.PutUint16(s[2:], dport)
	s[12], s[13] = typ, flags
	binary.BigEndian.PutUint16(s[14:], length)
	s[16] = 0 // DATA
	binary.BigEndian.PutUint16(s[18:], 16)
	return ipFrame(src, dst, 132, s)
}

func icmpFrame(src, dst string) []byte { return ipFrame(src, dst, 1, make([]byte, 16)) }
