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

// Hash is the probe's packet hash: MurmurHash3's 32-bit mixing (seed 0) over 16 big-endian
// words, exactly as bpf/altmark/hash.h computes it, so samples can be matched to packets
// outside the kernel (tests, analytics).
func Hash(f HashFields) uint32 {
	var w [16]uint32
	s, d := f.Src.As16(), f.Dst.As16()
	for i := range 4 {
		w[i] = binary.BigEndian.Uint32(s[4*i:])
		w[4+i] = binary.BigEndian.Uint32(d[4*i:])
	}
	var pl [8]byte
	n := copy(pl[:], f.Payload)
	w[8] = uint32(f.Proto)
	w[9] = uint32(f.SrcPort)<<16 | uint32(f.DstPort)
	w[10] = f.Ident
	w[11], w[12] = f.Seq, f.Ack
	w[13] = binary.BigEndian.Uint32(pl[:4])
	w[14] = binary.BigEndian.Uint32(pl[4:])
	w[15] = uint32(n)
	var h uint32
	for _, k := range w {
		k *= 0xcc9e2d51
		k = bits.RotateLeft32(k, 15)
		k *= 0x1b873593
		h ^= k
		h = bits.RotateLeft32(h, 13)
		h = h*5 + 0xe6546b64
	}
	h ^= uint32(len(w) * 4)
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// HashMatch is the number of low bits in which hash equals ref (32: all): a packet is sampled
// at a hash length of b bits when HashMatch(hash, ref) >= b.
func HashMatch(hash, ref uint32) int {
	return bits.TrailingZeros32(hash ^ ref)
}
