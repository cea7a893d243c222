package tcp

import (
	"encoding/binary"
	"testing"
	"time"
)

func FuzzParseSegment(f *testing.F) {
	s := Segment{SrcPort: 1, DstPort: 2, Seq: 3, Ack: 4, Flags: SYN | ACK, Window: 5,
		Opts: Options{HasMSS: true, MSS: 1460, HasWScale: true, WScale: 7, SACKPermitted: true, HasTS: true, TSVal: 9}}
	b := make([]byte, 60)
	hl := PutHeader(b, &s, 0, [4]byte{1}, [4]byte{2})
	f.Add(b[:hl])
	f.Add([]byte{0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0, 0, 0, 0, 0, 0, 0, 5, 10, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := parseNoChecksum(data)
		if err != nil {
			return
		}
		if s.Opts.NSACK > 4 || s.Opts.WScale > 14 || len(s.Payload) > len(data) {
			t.Fatalf("bad parse %+v", s)
		}
		// Re-encoding what we parsed must parse back to the same header fields.
		out := make([]byte, HeaderLen+OptionsLen(&s.Opts)+len(s.Payload))
		hl := HeaderLen + OptionsLen(&s.Opts)
		copy(out[hl:], s.Payload)
		PutHeader(out, &s, len(s.Payload), [4]byte{1}, [4]byte{2})
		r, err := Parse(out, [4]byte{1}, [4]byte{2})
		if err != nil || r.Seq != s.Seq || r.Ack != s.Ack || r.Flags != s.Flags || r.Opts.NSACK != s.Opts.NSACK {
			t.Fatalf("round trip: %v %+v vs %+v", err, r, s)
		}
	})
}

// FuzzConnInput throws arbitrary segments at an established connection: nothing may panic, and
// the connection's invariants must hold afterwards.
func FuzzConnInput(f *testing.F) {
	f.Add([]byte{0x10, 0, 0, 0, 10, 0, 0, 0, 0, 0, 5})
	f.Add([]byte{0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		n, a, b := newTestNet(t, testConfig())
		c, s := connect(t, n, a, b)
		_, _ = c.Write([]byte("some data in flight"))
		id := s.ID()
		// Each 11-byte record: flags, seq offset (4), ack offset (4), window (2).
		for len(data) >= 11 {
			seg := Segment{SrcPort: id.RemotePort, DstPort: id.LocalPort, Flags: data[0] & 0x3f,
				Seq:    s.rcvNxt.Add(int(int32(binary.BigEndian.Uint32(data[1:])) % 70000)),
				Ack:    s.sndUna.Add(int(int32(binary.BigEndian.Uint32(data[5:])) % 70000)),
				Window: binary.BigEndian.Uint16(data[9:])}
			if data[0]&0x40 != 0 {
				seg.Payload = make([]byte, int(data[9])*8)
			}
			data = data[11:]
			inject(b, a.addr, &seg)
			n.clk.Advance(time.Millisecond)
			s.mu.Lock()
			if s.sndUna.GT(s.sndNxt) || s.sndNxt.GT(s.sndMax) || s.rcvBuf.Len() > s.rcvBuf.Cap() {
				t.Fatalf("invariant broken: una %d nxt %d max %d", s.sndUna, s.sndNxt, s.sndMax)
			}
			s.mu.Unlock()
		}
		n.clk.Advance(time.Minute)
	})
}
