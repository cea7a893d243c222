package ipv4

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

func refChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func TestChecksumMatchesReference(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 200; n++ {
		b := make([]byte, r.IntN(3000))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if got, want := Checksum(b), refChecksum(b); got != want {
			t.Fatalf("len %d: got %#x want %#x", len(b), got, want)
		}
	}
	ones := bytes.Repeat([]byte{0xff}, 64)
	if got, want := Checksum(ones), refChecksum(ones); got != want {
		t.Fatalf("all ones: got %#x want %#x", got, want)
	}
}

func testHeader() Header {
	return Header{TotalLen: 40, ID: 7, TTL: 64, Proto: ProtoTCP,
		Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.1.2")}
}

func TestPutParseRoundTrip(t *testing.T) {
	t.Parallel()
	h := testHeader()
	h.DF = true
	b := make([]byte, 40)
	Put(b, &h)
	got, payload, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Src != h.Src || got.Dst != h.Dst || got.TTL != 64 || !got.DF || got.Proto != ProtoTCP || len(payload) != 20 {
		t.Fatalf("round trip: %+v", got)
	}
	b[3] ^= 1
	if _, _, err := Parse(b); err == nil {
		t.Fatal("corrupted header accepted")
	}
}

func TestDecTTLKeepsChecksumValid(t *testing.T) {
	t.Parallel()
	for ttl := 1; ttl < 256; ttl++ {
		h := testHeader()
		h.TTL = uint8(ttl)
		h.ID = uint16(ttl * 977)
		b := make([]byte, 40)
		Put(b, &h)
		DecTTL(b)
		if Checksum(b[:20]) != 0 || b[8] != uint8(ttl-1) {
			t.Fatalf("ttl %d: checksum invalid after decrement", ttl)
		}
	}
}

func TestFragmentReassembleAnyOrder(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 50; trial++ {
		n := 1 + r.IntN(9000)
		h := testHeader()
		h.TotalLen = HeaderLen + n
		h.ID = uint16(trial)
		pkt := make([]byte, h.TotalLen)
		for i := HeaderLen; i < len(pkt); i++ {
			pkt[i] = byte(r.Uint32())
		}
		Put(pkt, &h)
		var frags [][]byte
		mtu := 576 + r.IntN(1000)
		if err := Fragment(pkt, mtu, nil, func(f []byte) {
			if len(f) > mtu {
				t.Fatalf("fragment of %d bytes over mtu %d", len(f), mtu)
			}
			frags = append(frags, append([]byte(nil), f...))
		}); err != nil {
			t.Fatal(err)
		}
		r.Shuffle(len(frags), func(i, j int) { frags[i], frags[j] = frags[j], frags[i] })
		if r.IntN(2) == 0 { // a duplicate must not confuse reassembly
			frags = append([][]byte{frags[0]}, frags...)
		}
		ra := NewReassembler()
		var out []byte
		for _, f := range frags {
			fh, p, err := Parse(f)
			if err != nil {
				t.Fatal(err)
			}
			if !fh.MF && fh.FragOff == 0 {
				out = f
				continue
			}
			if got := ra.Add(fh, p, 0); got != nil {
				out = got
			}
		}
		if !bytes.Equal(out[HeaderLen:], pkt[HeaderLen:]) {
			t.Fatalf("trial %d: reassembled payload differs (len %d vs %d)", trial, len(out), len(pkt))
		}
		if ra.Used() != 0 {
			t.Fatalf("memory still charged: %d", ra.Used())
		}
	}
}

func TestReassemblyTimeoutAndLimit(t *testing.T) {
	t.Parallel()
	ra := NewReassembler()
	ra.MaxBytes = 2000
	h := testHeader()
	h.MF = true
	ra.Add(h, make([]byte, 1000), 0)
	if ra.Pending() != 1 {
		t.Fatal("fragment not held")
	}
	h.ID = 99
	ra.Add(h, make([]byte, 1600), time.Second) // over the memory limit: dropped
	if ra.Dropped != 1 || ra.Pending() != 1 {
		t.Fatalf("memory limit not enforced: dropped %d pending %d", ra.Dropped, ra.Pending())
	}
	exp := ra.Expire(31 * time.Second)
	if len(exp) != 1 || ra.Pending() != 0 || ra.Used() != 0 || ra.TimedOut != 1 {
		t.Fatalf("timeout: %d expired, %d pending, %d used", len(exp), ra.Pending(), ra.Used())
	}
}

// Scattered tiny fragments (each insert costs a pass over the pieces held) and a flood of
// datagrams are both bounded; the expiry scan is skipped until a deadline can have passed.
func TestReassemblyBoundsHolesAndDatagrams(t *testing.T) {
	t.Parallel()
	ra := NewReassembler()
	h := testHeader()
	h.MF = true
	for off := 0; off < 16*(maxHoles+1); off += 16 {
		h.FragOff = off
		ra.Add(h, make([]byte, 8), 0)
	}
	if ra.Pending() != 0 || ra.Dropped != 1 || ra.Used() != 0 {
		t.Fatalf("datagram with %d holes kept: pending %d, dropped %d", maxHoles+1, ra.Pending(), ra.Dropped)
	}
	h.FragOff = 0
	for id := 0; id < maxDatagrams+10; id++ {
		h.ID = uint16(id)
		ra.Add(h, make([]byte, 8), time.Duration(id))
	}
	if ra.Pending() != maxDatagrams || ra.Dropped != 11 {
		t.Fatalf("pending %d (limit %d), dropped %d", ra.Pending(), maxDatagrams, ra.Dropped)
	}
	if exp := ra.Expire(ra.Timeout - 1); len(exp) != 0 {
		t.Fatalf("%d expired early", len(exp))
	}
	if exp := ra.Expire(ra.Timeout + 5); len(exp) != 6 || ra.Pending() != maxDatagrams-6 {
		t.Fatalf("%d expired, %d pending; want the 6 oldest gone", len(exp), ra.Pending())
	}
}

func TestDFRefusesFragmentation(t *testing.T) {
	t.Parallel()
	h := testHeader()
	h.DF, h.TotalLen = true, 3000
	pkt := make([]byte, 3000)
	Put(pkt, &h)
	if err := Fragment(pkt, 1500, nil, func([]byte) {}); err != ErrFragDF {
		t.Fatalf("got %v, want ErrFragDF", err)
	}
}

func TestICMPRoundTrip(t *testing.T) {
	t.Parallel()
	b := AppendICMP(nil, &ICMP{Type: ICMPEcho, ID: 5, Seq: 9, Body: []byte("hello")})
	m, err := ParseICMP(b)
	if err != nil || m.Type != ICMPEcho || m.ID != 5 || m.Seq != 9 || string(m.Body) != "hello" {
		t.Fatalf("%+v %v", m, err)
	}
	b[9] ^= 0xff
	if _, err := ParseICMP(b); err != ErrICMPChecksum {
		t.Fatalf("corrupt icmp: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	h := testHeader()
	b := make([]byte, 40)
	Put(b, &h)
	f.Add(b)
	f.Add([]byte{0x45})
	f.Add([]byte{0x4f, 0, 0, 20, 0, 0, 0, 0, 64, 6, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, p, err := Parse(data)
		if err != nil {
			return
		}
		if h.IHL+len(p) != h.TotalLen || h.TotalLen > len(data) {
			t.Fatalf("inconsistent parse %+v payload %d", h, len(p))
		}
		ra := NewReassembler()
		ra.Add(h, p, 0)
		_, _ = ParseICMP(p)
	})
}

func FuzzReassemble(f *testing.F) {
	f.Add([]byte{0, 1, 0, 16, 1, 1, 0, 0, 2, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		ra := NewReassembler()
		ra.MaxBytes = 1 << 16
		// Each 5-byte record is one fragment: offset/8 (2 bytes), MF, length/8 (2 bytes).
		for len(data) >= 5 {
			h := testHeader()
			h.FragOff = (int(data[0])<<8 | int(data[1])) & 0x1fff * 8
			h.MF = data[2]&1 == 1
			n := (int(data[3])<<8 | int(data[4])) % 200 * 8
			data = data[5:]
			out := ra.Add(h, make([]byte, n), 0)
			if out != nil {
				if _, _, err := Parse(out); err != nil {
					t.Fatalf("reassembled packet invalid: %v", err)
				}
			}
			if ra.Used() < 0 || ra.Used() > ra.MaxBytes {
				t.Fatalf("memory accounting %d", ra.Used())
			}
		}
	})
}
