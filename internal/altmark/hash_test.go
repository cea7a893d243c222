package altmark

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// TestHashSpreadsLowBits: the sampling uses the hash's low bits, so packets that differ a little
// (the next IPv4 ID, port, TCP sequence number, address, payload byte) must spread evenly over
// them, and distinct packets must collide in 32 bits no more than chance does.
func TestHashSpreadsLowBits(t *testing.T) {
	t.Parallel()
	a4, b4 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.1.2")
	a6 := netip.MustParseAddr("fd00::1")
	const n = 1 << 16
	series := map[string]func(i int) HashFields{
		"IPv4 ID": func(i int) HashFields {
			return HashFields{Src: a4, Dst: b4, Proto: 17, SrcPort: 5000, DstPort: 6000, Ident: uint32(i)}
		},
		"source port": func(i int) HashFields {
			return HashFields{Src: a4, Dst: b4, Proto: 6, SrcPort: uint16(i), DstPort: 443}
		},
		"TCP sequence by 1448": func(i int) HashFields {
			return HashFields{Src: a4, Dst: b4, Proto: 6, SrcPort: 40000, DstPort: 80, Seq: uint32(i) * 1448, Ack: 1}
		},
		"IPv6 source address": func(i int) HashFields {
			s := a6.As16()
			binary.BigEndian.PutUint16(s[14:], uint16(i))
			return HashFields{Src: netip.AddrFrom16(s), Dst: a6, Proto: 58}
		},
		"payload counter": func(i int) HashFields {
			var pl [8]byte
			binary.BigEndian.PutUint32(pl[4:], uint32(i))
			return HashFields{Src: a4, Dst: b4, Proto: 17, SrcPort: 1, DstPort: 2, Payload: pl[:]}
		},
	}
	for name, fields := range series {
		var buckets [256]int
		seen := map[uint32]bool{}
		collisions := 0
		for i := range n {
			h := Hash(fields(i))
			buckets[h&0xff]++
			if seen[h] {
				collisions++
			}
			seen[h] = true
		}
		// chi-square over 255 degrees of freedom: mean 255, sd ~22.6; 400 is ~6 sd
		var chi2 float64
		for _, c := range buckets {
			d := float64(c) - n/256
			chi2 += d * d / (n / 256)
		}
		if chi2 > 400 {
			t.Errorf("%s: low 8 bits uneven, chi-square %.0f over 255 degrees of freedom", name, chi2)
		}
		// 2^16 values in 2^32: 0.5 collisions expected
		if collisions > 6 {
			t.Errorf("%s: %d collisions in 32 bits among %d packets", name, collisions, n)
		}
	}
}
