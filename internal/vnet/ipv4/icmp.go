package ipv4

import (
	"encoding/binary"
	"errors"
)

// ICMP types and codes vnet uses.
const (
	ICMPEchoReply      = 0
	ICMPUnreachable    = 3
	ICMPEcho           = 8
	ICMPTimeExceeded   = 11
	CodeNetUnreachable = 0
	CodeHostUnreach    = 1
	CodeProtoUnreach   = 2
	CodePortUnreach    = 3
	CodeFragNeeded     = 4
	CodeTTLExceeded    = 0
	CodeReassemblyTime = 1
)

// ICMP is a decoded ICMP message.
type ICMP struct {
	Type, Code uint8
	ID, Seq    uint16 // echo only
	Rest       uint32 // the 4 bytes after the checksum, raw
	Body       []byte // echo data, or the quoted packet of an error
}

var (
	ErrICMPShort    = errors.New("icmp: message shorter than 8 bytes")
	ErrICMPChecksum = errors.New("icmp: bad checksum")
)

// ParseICMP decodes and verifies an ICMP message.
func ParseICMP(b []byte) (ICMP, error) {
	var m ICMP
	if len(b) < 8 {
		return m, ErrICMPShort
	}
	if Checksum(b) != 0 {
		return m, ErrICMPChecksum
	}
	m.Type, m.Code = b[0], b[1]
	m.Rest = binary.BigEndian.Uint32(b[4:])
	m.ID, m.Seq = binary.BigEndian.Uint16(b[4:]), binary.BigEndian.Uint16(b[6:])
	m.Body = b[8:]
	return m, nil
}

// AppendICMP appends the encoded message to dst.
func AppendICMP(dst []byte, m *ICMP) []byte {
	start := len(dst)
	dst = append(dst, m.Type, m.Code, 0, 0, 0, 0, 0, 0)
	if m.Type == ICMPEcho || m.Type == ICMPEchoReply {
		binary.BigEndian.PutUint16(dst[start+4:], m.ID)
		binary.BigEndian.PutUint16(dst[start+6:], m.Seq)
	} else {
		binary.BigEndian.PutUint32(dst[start+4:], m.Rest)
	}
	dst = append(dst, m.Body...)
	binary.BigEndian.PutUint16(dst[start+2:], Checksum(dst[start:]))
	return dst
}

// Quote is what an ICMP error carries of the packet that caused it: its header and 8 bytes.
func Quote(pkt []byte) []byte {
	if len(pkt) < HeaderLen {
		return pkt
	}
	ihl := int(pkt[0]&0xf) * 4
	n := min(len(pkt), max(ihl, HeaderLen)+8)
	return pkt[:n]
}
