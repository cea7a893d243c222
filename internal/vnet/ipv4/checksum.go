package ipv4

import "encoding/binary"

// Sum adds b to a running ones'-complement sum (not yet folded). It reads 8 bytes at a time
// because the checksum is on the hot path of every packet.
func Sum(b []byte, initial uint64) uint64 {
	s := initial
	for len(b) >= 32 {
		s = add64(s, binary.BigEndian.Uint64(b[0:]))
		s = add64(s, binary.BigEndian.Uint64(b[8:]))
		s = add64(s, binary.BigEndian.Uint64(b[16:]))
		s = add64(s, binary.BigEndian.Uint64(b[24:]))
		b = b[32:]
	}
	for len(b) >= 8 {
		s = add64(s, binary.BigEndian.Uint64(b))
		b = b[8:]
	}
	if len(b) >= 4 {
		s = add64(s, uint64(binary.BigEndian.Uint32(b)))
		b = b[4:]
	}
	if len(b) >= 2 {
		s = add64(s, uint64(binary.BigEndian.Uint16(b)))
		b = b[2:]
	}
	if len(b) == 1 {
		s = add64(s, uint64(b[0])<<8)
	}
	return s
}

func add64(a, b uint64) uint64 {
	s := a + b
	if s < a {
		s++ // end-around carry
	}
	return s
}

// Fold reduces a running sum to 16 bits and complements it: the value to put in a header.
func Fold(s uint64) uint16 {
	s = (s >> 32) + (s & 0xffffffff)
	s = (s >> 32) + (s & 0xffffffff)
	s = (s >> 16) + (s & 0xffff)
	s = (s >> 16) + (s & 0xffff)
	s = (s >> 16) + (s & 0xffff)
	return ^uint16(s)
}

// Checksum is the Internet checksum of b.
func Checksum(b []byte) uint16 { return Fold(Sum(b, 0)) }

// PseudoSum is the running sum of the TCP/UDP pseudo-header.
func PseudoSum(src, dst [4]byte, proto uint8, length int) uint64 {
	s := uint64(binary.BigEndian.Uint32(src[:])) + uint64(binary.BigEndian.Uint32(dst[:]))
	return s + uint64(proto) + uint64(length)
}
