// Package ipv4 parses and builds IPv4 and ICMP packets and reassembles fragments. Every parser
// treats its input as hostile: lengths are checked before use and errors say what was wrong.
package ipv4

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Protocol numbers carried by vnet.
const (
	ProtoTest = 0
	ProtoICMP = 1
	ProtoTCP  = 6
	ProtoUDP  = 17
	ProtoRIP  = 200
)

// HeaderLen is the length of a header without options; vnet never sends options.
const HeaderLen = 20

// Flag bits in the fragment field.
const (
	flagDF     = 0x4000
	flagMF     = 0x2000
	offsetMask = 0x1fff
)

// Header is a decoded IPv4 header.
type Header struct {
	TOS      uint8
	TotalLen int
	ID       uint16
	DF, MF   bool
	FragOff  int // in bytes
	TTL      uint8
	Proto    uint8
	Checksum uint16
	Src, Dst netip.Addr
	IHL      int // header length in bytes, options included
}

// Parse errors; callers count them by kind.
var (
	ErrShort    = errors.New("ipv4: packet shorter than its header")
	ErrVersion  = errors.New("ipv4: not version 4")
	ErrHdrLen   = errors.New("ipv4: bad header length")
	ErrTotalLen = errors.New("ipv4: total length disagrees with packet size")
	ErrChecksum = errors.New("ipv4: bad header checksum")
)

// Parse decodes the header of pkt and checks its checksum. It returns the payload, trimmed to the
// header's total length (link padding dropped).
func Parse(pkt []byte) (Header, []byte, error) {
	var h Header
	if len(pkt) < HeaderLen {
		return h, nil, ErrShort
	}
	if pkt[0]>>4 != 4 {
		return h, nil, ErrVersion
	}
	h.IHL = int(pkt[0]&0xf) * 4
	if h.IHL < HeaderLen || h.IHL > len(pkt) {
		return h, nil, ErrHdrLen
	}
	h.TotalLen = int(binary.BigEndian.Uint16(pkt[2:]))
	if h.TotalLen < h.IHL || h.TotalLen > len(pkt) {
		return h, nil, fmt.Errorf("%w: header says %d, got %d", ErrTotalLen, h.TotalLen, len(pkt))
	}
	if Checksum(pkt[:h.IHL]) != 0 {
		return h, nil, ErrChecksum
	}
	h.TOS = pkt[1]
	h.ID = binary.BigEndian.Uint16(pkt[4:])
	frag := binary.BigEndian.Uint16(pkt[6:])
	h.DF, h.MF = frag&flagDF != 0, frag&flagMF != 0
	h.FragOff = int(frag&offsetMask) * 8
	h.TTL, h.Proto = pkt[8], pkt[9]
	h.Checksum = binary.BigEndian.Uint16(pkt[10:])
	h.Src = netip.AddrFrom4([4]byte(pkt[12:16]))
	h.Dst = netip.AddrFrom4([4]byte(pkt[16:20]))
	return h, pkt[h.IHL:h.TotalLen], nil
}

// Put writes a 20-byte header for h into b[:20] with its checksum; h.TotalLen must be set.
func Put(b []byte, h *Header) {
	_ = b[HeaderLen-1]
	b[0] = 0x45
	b[1] = h.TOS
	binary.BigEndian.PutUint16(b[2:], uint16(h.TotalLen))
	binary.BigEndian.PutUint16(b[4:], h.ID)
	frag := uint16(h.FragOff/8) & offsetMask
	if h.DF {
		frag |= flagDF
	}
	if h.MF {
		frag |= flagMF
	}
	binary.BigEndian.PutUint16(b[6:], frag)
	b[8], b[9] = h.TTL, h.Proto
	b[10], b[11] = 0, 0
	s, d := h.Src.As4(), h.Dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:], Checksum(b[:HeaderLen]))
}

// DecTTL decrements the TTL of a valid packet in place, updating the checksum incrementally
// (RFC 1624) so forwarding does not re-sum the header.
func DecTTL(pkt []byte) {
	pkt[8]--
	// The TTL is the high byte of the 16-bit word at offset 8: the word went down by 0x100.
	// HC' = ~(~HC + ~m + m') and ~m + m' = ~0x0100 for a pure decrement of the high byte.
	sum := uint32(^binary.BigEndian.Uint16(pkt[10:])) + uint32(^uint16(0x0100))
	sum = (sum & 0xffff) + (sum >> 16)
	sum = (sum & 0xffff) + (sum >> 16)
	binary.BigEndian.PutUint16(pkt[10:], ^uint16(sum))
}

func (h Header) String() string {
	return fmt.Sprintf("%v > %v proto %d len %d ttl %d id %d off %d mf %v", h.Src, h.Dst, h.Proto, h.TotalLen, h.TTL, h.ID, h.FragOff, h.MF)
}
