package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/flowplane/flowplane/internal/vnet/ipv4"
)

// Flags.
const (
	FIN = 1 << 0
	SYN = 1 << 1
	RST = 1 << 2
	PSH = 1 << 3
	ACK = 1 << 4
	URG = 1 << 5
)

// HeaderLen is the length of a header without options.
const HeaderLen = 20

// Block is a SACK block [Left, Right).
type Block struct{ Left, Right Seq }

// Options holds the options vnet understands; others are skipped.
type Options struct {
	MSS           uint16
	HasMSS        bool
	WScale        uint8
	HasWScale     bool
	SACKPermitted bool
	HasTS         bool
	TSVal, TSEcr  uint32
	SACK          [4]Block
	NSACK         int
}

// Segment is a decoded TCP segment. Payload aliases the packet.
type Segment struct {
	SrcPort, DstPort uint16
	Seq, Ack         Seq
	Flags            uint8
	Window           uint16
	Opts             Options
	Payload          []byte
}

// Len is the sequence space the segment occupies (SYN and FIN count one each).
func (s *Segment) Len() int {
	n := len(s.Payload)
	if s.Flags&SYN != 0 {
		n++
	}
	if s.Flags&FIN != 0 {
		n++
	}
	return n
}

var (
	ErrShort    = errors.New("tcp: segment shorter than its header")
	ErrChecksum = errors.New("tcp: bad checksum")
	ErrOffset   = errors.New("tcp: bad data offset")
	ErrOption   = errors.New("tcp: malformed option")
)

// Parse decodes a segment carried from src to dst, verifying the checksum.
func Parse(b []byte, src, dst [4]byte) (Segment, error) {
	var s Segment
	if len(b) < HeaderLen {
		return s, ErrShort
	}
	if len(b) > 0xffff {
		return s, ErrShort
	}
	if ipv4.Fold(ipv4.Sum(b, ipv4.PseudoSum(src, dst, ipv4.ProtoTCP, len(b)))) != 0 {
		return s, ErrChecksum
	}
	return parseNoChecksum(b)
}

func parseNoChecksum(b []byte) (Segment, error) {
	var s Segment
	if len(b) < HeaderLen {
		return s, ErrShort
	}
	off := int(b[12]>>4) * 4
	if off < HeaderLen || off > len(b) {
		return s, ErrOffset
	}
	s.SrcPort = binary.BigEndian.Uint16(b[0:])
	s.DstPort = binary.BigEndian.Uint16(b[2:])
	s.Seq = Seq(binary.BigEndian.Uint32(b[4:]))
	s.Ack = Seq(binary.BigEndian.Uint32(b[8:]))
	s.Flags = b[13] & 0x3f
	s.Window = binary.BigEndian.Uint16(b[14:])
	if err := parseOptions(b[HeaderLen:off], &s.Opts); err != nil {
		return s, err
	}
	s.Payload = b[off:]
	return s, nil
}

func parseOptions(b []byte, o *Options) error {
	for len(b) > 0 {
		kind := b[0]
		if kind == 0 { // end of list
			return nil
		}
		if kind == 1 { // no-op
			b = b[1:]
			continue
		}
		if len(b) < 2 {
			return ErrOption
		}
		n := int(b[1])
		if n < 2 || n > len(b) {
			return ErrOption
		}
		v := b[2:n]
		switch kind {
		case 2:
			if n != 4 {
				return ErrOption
			}
			o.MSS, o.HasMSS = binary.BigEndian.Uint16(v), true
		case 3:
			if n != 3 {
				return ErrOption
			}
			o.WScale, o.HasWScale = min(v[0], 14), true // RFC 7323 2.3: clamp to 14
		case 4:
			if n != 2 {
				return ErrOption
			}
			o.SACKPermitted = true
		case 5:
			if (n-2)%8 != 0 {
				return ErrOption
			}
			o.NSACK = 0
			for i := 0; i+8 <= len(v) && o.NSACK < len(o.SACK); i += 8 {
				o.SACK[o.NSACK] = Block{Seq(binary.BigEndian.Uint32(v[i:])), Seq(binary.BigEndian.Uint32(v[i+4:]))}
				o.NSACK++
			}
		case 8:
			if n != 10 {
				return ErrOption
			}
			o.HasTS, o.TSVal, o.TSEcr = true, binary.BigEndian.Uint32(v), binary.BigEndian.Uint32(v[4:])
		}
		b = b[n:]
	}
	return nil
}

// OptionsLen is the encoded length of o, padded to 4 bytes.
func OptionsLen(o *Options) int {
	n := 0
	if o.HasMSS {
		n += 4
	}
	if o.HasWScale {
		n += 4 // NOP + 3
	}
	if o.SACKPermitted {
		n += 4 // NOP NOP + 2 (or folded with TS)
	}
	if o.HasTS {
		n += 12 // NOP NOP + 10
	}
	if o.NSACK > 0 {
		n += 4 + 8*o.NSACK // NOP NOP + 2 + blocks
	}
	return n
}

func putOptions(b []byte, o *Options) int {
	i := 0
	if o.HasMSS {
		b[0], b[1] = 2, 4
		binary.BigEndian.PutUint16(b[2:], o.MSS)
		i = 4
	}
	if o.HasWScale {
		b[i], b[i+1], b[i+2], b[i+3] = 1, 3, 3, o.WScale
		i += 4
	}
	if o.SACKPermitted {
		b[i], b[i+1], b[i+2], b[i+3] = 1, 1, 4, 2
		i += 4
	}
	if o.HasTS {
		b[i], b[i+1], b[i+2], b[i+3] = 1, 1, 8, 10
		binary.BigEndian.PutUint32(b[i+4:], o.TSVal)
		binary.BigEndian.PutUint32(b[i+8:], o.TSEcr)
		i += 12
	}
	if o.NSACK > 0 {
		b[i], b[i+1], b[i+2], b[i+3] = 1, 1, 5, byte(2+8*o.NSACK)
		i += 4
		for k := 0; k < o.NSACK; k++ {
			binary.BigEndian.PutUint32(b[i:], uint32(o.SACK[k].Left))
			binary.BigEndian.PutUint32(b[i+4:], uint32(o.SACK[k].Right))
			i += 8
		}
	}
	return i
}

// PutHeader writes the header of s (options included) at b[0:] and the checksum over the header
// and the payloadLen bytes already placed after it. It returns the header length.
func PutHeader(b []byte, s *Segment, payloadLen int, src, dst [4]byte) int {
	hl := HeaderLen + OptionsLen(&s.Opts)
	binary.BigEndian.PutUint16(b[0:], s.SrcPort)
	binary.BigEndian.PutUint16(b[2:], s.DstPort)
	binary.BigEndian.PutUint32(b[4:], uint32(s.Seq))
	binary.BigEndian.PutUint32(b[8:], uint32(s.Ack))
	b[12] = byte(hl/4) << 4
	b[13] = s.Flags
	binary.BigEndian.PutUint16(b[14:], s.Window)
	b[16], b[17], b[18], b[19] = 0, 0, 0, 0
	putOptions(b[HeaderLen:hl], &s.Opts)
	sum := ipv4.Sum(b[:hl+payloadLen], ipv4.PseudoSum(src, dst, ipv4.ProtoTCP, hl+payloadLen))
	binary.BigEndian.PutUint16(b[16:], ipv4.Fold(sum))
	return hl
}

func (s *Segment) String() string {
	f := ""
	for i, c := range "FSRPAU" {
		if s.Flags&(1<<i) != 0 {
			f += string(c)
		}
	}
	return fmt.Sprintf("%d>%d [%s] seq=%d ack=%d win=%d len=%d", s.SrcPort, s.DstPort, f, s.Seq, s.Ack, s.Window, len(s.Payload))
}
