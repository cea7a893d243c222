package altmark

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// HashFields are the fields of a packet the probe's hash covers (bpf/altmark/hash.h): all of
// them stay the same from one measurement point to the next.
type HashFields struct {
	Src, Dst         netip.Addr // IPv4 is hashed as ::ffff:a.b.c.d
	Proto            uint8
	SrcPort, DstPort uint16 // 0 when the protocol has none (or a later fragment)
	Ident            uint32 // IPv4 identification, IPv6 flow label
	Seq, Ack         uint32 // TCP only
	Payload          []byte // the payload after the transport header; the first 8 bytes count
}

// hashK are the odd multipliers of the hash's words.
var hashK = [7]uint64{0x9e3779b97f4a7c15, 0xc2b2ae3d27d4eb4f, 0x165667b19e3779f9, 0x85ebca77c2b2ae63,
	0x27d4eb2f165667c5, 0xd6e8feb86659fd93, 0xa0761d6478bd642f}

// Hash is the probe's packet hash, exactly as bpf/altmark/hash.h computes it, so samples can be
// matched to packets outside the kernel (tests, analytics): seven 64-bit words of invariant
// fields, each multiplied by its odd constant, summed mod 2^64, then MurmurHash3's 64-bit
// finalizer; the low 32 bits.
func Hash(f HashFields) uint32 {
	s, d := f.Src.As16(), f.Dst.As16()
	var pl [8]byte
	n := copy(pl[:], f.Payload)
	w := [7]uint64{
		binary.LittleEndian.Uint64(s[:8]), binary.LittleEndian.Uint64(s[8:]),
		binary.LittleEndian.Uint64(d[:8]), binary.LittleEndian.Uint64(d[8:]),
		uint64(f.Proto) | uint64(f.SrcPort)<<8 | uint64(f.DstPort)<<24 | uint64(f.Ident&0xfffff)<<40 | uint64(n)<<60,
		uint64(f.Seq) | uint64(f.Ack)<<32,
		binary.LittleEndian.Uint64(pl[:]),
	}
	var h uint64
	for i, x := range w {
		h += x * hashK[i]
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return uint32(h)
}

// HashMatch is the number of low bits in which hash equals ref (32: all): a packet is sampled
// at a hash length of b bits when HashMatch(hash, ref) >= b.
func HashMatch(hash, ref uint32) int {
	return bits.TrailingZeros32(hash ^ ref)
}
