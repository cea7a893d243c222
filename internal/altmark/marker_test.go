package altmark

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/progrun"
	"github.com/flowplane/flowplane/internal/stats"
	"github.com/flowplane/flowplane/internal/testenv"
)

// PROG_TEST_RUN tables for the marker. The program colors by TAI; a test knows the color a
// run gave when the run began and ended in the same period (it reads CLOCK_TAI around it), and
// retries otherwise. Nothing here asserts a timing.

const (
	eth   = 14
	src4  = "198.18.0.1"
	dst4  = "198.18.1.2"
	src6  = "fd00:0:0:1::1"
	dst6  = "fd00:0:0:2::2"
	testL = 20 * time.Millisecond
)

// loadMark loads the marker for a configuration file's text (nothing attached).
func loadMark(t testing.TB, src string) (*markerObjects, *MarkConfig) {
	t.Helper()
	testenv.Privileged(t)
	c, err := ParseMarkConfig("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := openMarker(c.Spec(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	return objs, c
}

func tai() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_TAI, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// markRun is one run whose period is known.
type markRun struct {
	out    []byte
	ret    uint32
	color  int
	period int64
	pos    int64 // ns into the period at the start of the run
}

// runKnown runs the program on in until one run begins and ends in the same period.
func runKnown(t *testing.T, prog *ebpf.Program, in []byte, c *MarkConfig) markRun {
	t.Helper()
	l := int64(c.Period)
	for range 100 {
		t0 := tai()
		r, err := progrun.Exec(prog, in, 0)
		t1 := tai()
		if err != nil {
			t.Fatal(err)
		}
		if t0/l == t1/l {
			return markRun{out: r.Out, ret: r.Ret, color: int((t0/l + int64(c.StartColor)) % 2), period: t0 / l, pos: t0 % l}
		}
	}
	t.Fatal("no run within one period in 100 tries")
	return markRun{}
}

// runOnce runs the program once on in (the color does not matter).
func runOnce(t *testing.T, prog *ebpf.Program, in []byte) markRun {
	t.Helper()
	r, err := progrun.Exec(prog, in, 0)
	if err != nil {
		t.Fatal(err)
	}
	return markRun{out: r.Out, ret: r.Ret}
}

// bothColors calls check on runs of in until it has seen both colors.
func bothColors(t *testing.T, prog *ebpf.Program, in []byte, c *MarkConfig, check func(t *testing.T, r markRun)) {
	t.Helper()
	seen := [2]bool{}
	for try := 0; try < 200 && !(seen[0] && seen[1]); try++ {
		r := runKnown(t, prog, in, c)
		if !seen[r.color] {
			seen[r.color] = true
			check(t, r)
		}
		time.Sleep(time.Duration(c.Period) / 3)
	}
	if !seen[0] || !seen[1] {
		t.Fatalf("colors seen %v", seen)
	}
}

func counter(t *testing.T, objs *markerObjects, r markerMarkReason) uint64 {
	t.Helper()
	n, err := stats.Sum(objs.MarkStats, uint32(r))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// wantCounters checks the named counters (others are not looked at).
func wantCounters(t *testing.T, objs *markerObjects, want map[markerMarkReason]uint64) {
	t.Helper()
	for r, n := range want {
		if got := counter(t, objs, r); got != n {
			t.Errorf("counter %s = %d, want %d", markCounterNames[r], got, n)
		}
	}
}

func ipv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		if i == 10 {
			continue
		}
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// withTOS is an IPv4 frame with its TOS byte set and the header checksum fixed.
func withTOS(frame []byte, tos byte) []byte {
	f := bytes.Clone(frame)
	f[eth+1] = tos
	ihl := int(f[eth]&0xf) * 4
	binary.BigEndian.PutUint16(f[eth+10:], ipv4Checksum(f[eth:eth+ihl]))
	return f
}

// withFragOff is an IPv4 frame with flags+fragment offset set and the checksum fixed.
func withFragOff(frame []byte, v uint16) []byte {
	f := bytes.Clone(frame)
	binary.BigEndian.PutUint16(f[eth+6:], v)
	ihl := int(f[eth]&0xf) * 4
	binary.BigEndian.PutUint16(f[eth+10:], ipv4Checksum(f[eth:eth+ihl]))
	return f
}

// withTC is an IPv6 frame with its traffic class set.
func withTC(frame []byte, tc byte) []byte {
	f := bytes.Clone(frame)
	w := binary.BigEndian.Uint16(f[eth:])
	binary.BigEndian.PutUint16(f[eth:], w&0xf00f|uint16(tc)<<4)
	return f
}

// altmarkOpt is the AltMark option: type, length, FlowMonID(20) L D reserved(10).
func altmarkOpt(id uint32, l, d bool) []byte {
	w := id << 12
	if l {
		w |= 1 << 11
	}
	if d {
		w |= 1 << 10
	}
	return binary.BigEndian.AppendUint32([]byte{0x12, 4}, w)
}

// checksumsValid decodes out with gopacket and checks every checksum it knows (IPv4 header,
// TCP, UDP, ICMP), and that the transport layer was found.
func checksumsValid(t *testing.T, out []byte, l4 gopacket.LayerType) gopacket.Packet {
	t.Helper()
	p := packet.Decode(out)
	if el := p.ErrorLayer(); el != nil {
		t.Fatalf("gopacket cannot decode the output: %v\n%s", el.Error(), hex.Dump(out))
	}
	if p.Layer(l4) == nil {
		t.Fatalf("no %v layer in the output:\n%s", l4, p)
	}
	// gopacket links the transport layer to its IP header only when nothing lies between
	// them; with extension headers the test links them.
	if nl := p.NetworkLayer(); nl != nil {
		for _, l := range p.Layers() {
			if c, ok := l.(interface {
				SetNetworkLayerForChecksum(gopacket.NetworkLayer) error
			}); ok {
				_ = c.SetNetworkLayerForChecksum(nl)
			}
		}
	}
	n := 0
	for _, l := range p.Layers() {
		if c, ok := l.(interface {
			VerifyChecksum() (error, gopacket.ChecksumVerificationResult)
		}); ok {
			n++
			if err, res := c.VerifyChecksum(); err != nil || !res.Valid {
				t.Fatalf("%v checksum: %v %+v\n%s", l.LayerType(), err, res, p)
			}
		}
	}
	if n == 0 {
		t.Fatalf("no checksum to verify in\n%s", p)
	}
	return p
}

func sameBytes(t *testing.T, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("output packet differs\ngot:\n%s\nwant:\n%s", hex.Dump(got), hex.Dump(want))
	}
}

func TestMarkDSCP(t *testing.T) {
	t.Parallel()
	// DSCP AF11 (0x0a) plus ECN CE (3): TOS 0x2b. Bits 0 and 1 of the DSCP are TOS 0x04, 0x08.
	for _, tc := range []struct {
		name, cfg   string
		color, dly  byte
		in          []byte
		v6          bool
		l4          gopacket.LayerType
		startColor1 bool
	}{
		{"ipv4 tcp bits 0,1", "carrier: dscp\nperiod: 20ms\n", 0x04, 0x08, packet.IP(src4, dst4).TCP(40000, 80, "A").Payload([]byte("data")).Bytes(), false, layers.LayerTypeTCP, false},
		{"ipv4 udp bits 3,5 start color 1", "carrier: dscp\nperiod: 20ms\ndscp_bits: [3, 5]\nstart_color: 1\n", 0x20, 0x80, packet.IP(src4, dst4).UDP(40000, 5000).Payload([]byte("q")).Bytes(), false, layers.LayerTypeUDP, true},
		{"ipv6 tcp bits 0,1", "carrier: dscp\nperiod: 20ms\n", 0x04, 0x08, packet.IP(src6, dst6).TCP(40000, 80, "A").Payload([]byte("data")).Bytes(), true, layers.LayerTypeTCP, false},
		{"ipv6 udp bits 2,4", "carrier: dscp\nperiod: 20ms\ndscp_bits: [2, 4]\n", 0x10, 0x40, packet.IP(src6, dst6).UDP(40000, 5000).Payload([]byte("q")).Bytes(), true, layers.LayerTypeUDP, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs, c := loadMark(t, tc.cfg)
			for _, tos := range []byte{0x2b, 0xff, 0x00} {
				in := withTOS
				if tc.v6 {
					in = withTC
				}
				frame := in(tc.in, tos)
				bothColors(t, objs.AltmarkMark, frame, c, func(t *testing.T, r markRun) {
					want := tos &^ (tc.color | tc.dly) // the delay bit is cleared: no double marking
					if r.color == 1 {
						want |= tc.color
					}
					sameBytes(t, r.out, in(tc.in, want))
					checksumsValid(t, r.out, tc.l4)
					if (want^tos)&3 != 0 {
						t.Fatalf("ECN bits changed: %#x → %#x", tos, want)
					}
				})
			}
			if counter(t, objs, markerMarkReasonMARK_COLOR0) == 0 || counter(t, objs, markerMarkReasonMARK_COLOR1) == 0 {
				t.Error("color counters did not both count")
			}
			if m, s := counter(t, objs, markerMarkReasonMARK_MARKED), counter(t, objs, markerMarkReasonMARK_SEEN); m != s {
				t.Errorf("marked %d of %d", m, s)
			}
		})
	}
}

func TestMarkIPv4Flag(t *testing.T) {
	t.Parallel()
	objs, c := loadMark(t, "carrier: ipv4-flag\nperiod: 20ms\nbackbone: [198.18.255.0/24]\n")
	base := packet.IP(src4, dst4).UDP(40000, 5000).Payload([]byte("x")).Bytes() // DF set
	for _, fo := range []uint16{0x4000, 0x0000, 0x2001 /* MF, offset 1 */, 0xc000 /* reserved already set */} {
		frame := withFragOff(base, fo)
		bothColors(t, objs.AltmarkMark, frame, c, func(t *testing.T, r markRun) {
			want := fo &^ 0x8000
			if r.color == 1 {
				want |= 0x8000
			}
			sameBytes(t, r.out, withFragOff(base, want))
			ip := packet.Decode(r.out).Layer(layers.LayerTypeIPv4).(*layers.IPv4)
			if err, res := ip.VerifyChecksum(); err != nil || !res.Valid {
				t.Fatalf("IPv4 checksum: %v %+v", err, res)
			}
		})
	}
	// Backbone traffic either way and IPv6 are passed as they are.
	for _, in := range [][]byte{
		withFragOff(packet.IP("198.18.255.7", dst4).UDP(179, 179).Bytes(), 0x4000),
		withFragOff(packet.IP(src4, "198.18.255.1").TCP(40000, 179, "S").Bytes(), 0x4000),
		packet.IP(src6, dst6).UDP(1, 2).Bytes(),
	} {
		r := runOnce(t, objs.AltmarkMark, in)
		sameBytes(t, r.out, in)
	}
	wantCounters(t, objs, map[markerMarkReason]uint64{markerMarkReasonMARK_BACKBONE: 2, markerMarkReasonMARK_WRONG_FAMILY: 1})
}

func TestMarkAltMarkInsert(t *testing.T) {
	t.Parallel()
	payload := bytes.Repeat([]byte("altmark "), 20)
	tcp := func(b *packet.Builder) *packet.Builder { return b.TCP(40000, 80, "PA").Seq(1000).Ack(7) }
	udp := func(b *packet.Builder) *packet.Builder { return b.UDP(40000, 5201) }
	for _, tc := range []struct {
		name, cfg string
		ext       layers.IPProtocol
		build     func(*packet.Builder) *packet.Builder // what follows the inserted header
		l4        gopacket.LayerType
	}{
		{"tcp destination options", "", layers.IPProtocolIPv6Destination, tcp, layers.LayerTypeTCP},
		{"udp destination options", "", layers.IPProtocolIPv6Destination, udp, layers.LayerTypeUDP},
		{"tcp hop-by-hop", "header: hop-by-hop\n", layers.IPProtocolIPv6HopByHop, tcp, layers.LayerTypeTCP},
		{"udp hop-by-hop", "header: hop-by-hop\n", layers.IPProtocolIPv6HopByHop, udp, layers.LayerTypeUDP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs, c := loadMark(t, "carrier: ipv6-altmark\nperiod: 20ms\nflowmon_id: 0xabcde\n"+tc.cfg)
			in := tc.build(packet.IP(src6, dst6)).Payload(payload).Bytes()
			bothColors(t, objs.AltmarkMark, in, c, func(t *testing.T, r markRun) {
				// What a sender that wrote the header itself would send, transport checksum
				// included: the pseudo-header has the upper-layer length, not the IPv6 one.
				opt := altmarkOpt(0xabcde, r.color == 1, false)
				want := tc.build(packet.IP(src6, dst6).IPv6Ext(tc.ext, opt)).Payload(payload).Bytes()
				sameBytes(t, r.out, want)
				p := checksumsValid(t, r.out, tc.l4)
				ip6 := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
				if int(ip6.Length) != len(in)-eth-40+8 || ip6.NextHeader != tc.ext {
					t.Fatalf("IPv6 payload length %d (in %d), next header %v", ip6.Length, len(in)-eth-40, ip6.NextHeader)
				}
			})
			n := counter(t, objs, markerMarkReasonMARK_SEEN)
			wantCounters(t, objs, map[markerMarkReason]uint64{markerMarkReasonMARK_INSERTED: n, markerMarkReasonMARK_MARKED: n})
		})
	}
}

func TestMarkAltMarkInPlace(t *testing.T) {
	t.Parallel()
	objs, c := loadMark(t, "carrier: ipv6-altmark\nperiod: 20ms\nflowmon_id: 77\n")
	old := altmarkOpt(0xfffff, false, true) // someone else's ID and D flag: overwritten
	exp := []byte{0x1e, 2, 0xaa, 0xbb}      // RFC 4727 experimental option: skipped
	padN := []byte{1, 0}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, tc := range []struct {
		name  string
		build func(opt []byte) *packet.Builder
	}{
		{"destination options with padding and another option", func(opt []byte) *packet.Builder {
			return packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Destination, cat(exp, padN, opt)).TCP(40000, 80, "A")
		}},
		{"hop-by-hop", func(opt []byte) *packet.Builder {
			return packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6HopByHop, cat(padN, opt)).UDP(40000, 5000)
		}},
		{"destination options after hop-by-hop", func(opt []byte) *packet.Builder {
			return packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6HopByHop, []byte{1, 4, 0, 0, 0, 0}).
				IPv6Ext(layers.IPProtocolIPv6Destination, cat(opt, exp)).UDP(40000, 5000)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.build(old).Payload([]byte("payload")).Bytes()
			bothColors(t, objs.AltmarkMark, in, c, func(t *testing.T, r markRun) {
				sameBytes(t, r.out, tc.build(altmarkOpt(77, r.color == 1, false)).Payload([]byte("payload")).Bytes())
				checksumsValid(t, r.out, gopacket.LayerTypePayload)
			})
		})
	}
	if n := counter(t, objs, markerMarkReasonMARK_SEEN); counter(t, objs, markerMarkReasonMARK_UPDATED) != n || counter(t, objs, markerMarkReasonMARK_MARKED) != n {
		t.Errorf("updated %d, marked %d of %d", counter(t, objs, markerMarkReasonMARK_UPDATED), counter(t, objs, markerMarkReasonMARK_MARKED), n)
	}
}

// TestMarkPassedUnchanged: what the marker cannot or must not mark leaves as it came, counted
// by reason.
func TestMarkPassedUnchanged(t *testing.T) {
	t.Parallel()
	udp6 := func() *packet.Builder { return packet.IP(src6, dst6).UDP(40000, 5000) }
	patch := func(f []byte, off int, b ...byte) []byte { f = bytes.Clone(f); copy(f[off:], b); return f }
	arp := append(append([]byte{}, packet.DstMAC...), packet.SrcMAC...)
	arp = append(arp, 0x08, 0x06)
	arp = append(arp, make([]byte, 28)...)
	big := func(n int) []byte { return udp6().Payload(make([]byte, n)).Bytes() }
	v4 := packet.IP(src4, dst4).UDP(40000, 5000).Payload([]byte("x")).Bytes()
	v6 := udp6().Payload([]byte("abcdefgh")).Bytes()
	for _, tc := range []struct {
		name, cfg string
		in        []byte
		why       markerMarkReason
	}{
		{"not ip", "carrier: dscp", arp, markerMarkReasonMARK_NOT_IP},
		{"ipv4 options beyond the frame", "carrier: dscp", patch(v4, eth, 0x4f), markerMarkReasonMARK_MALFORMED},
		{"ipv4 ihl 4", "carrier: dscp", patch(v4, eth, 0x44), markerMarkReasonMARK_MALFORMED},
		{"ipv4 total length beyond the frame", "carrier: dscp", patch(v4, eth+2, 0x05, 0xdc), markerMarkReasonMARK_MALFORMED},
		{"ipv6 payload length beyond the frame", "carrier: ipv6-altmark", patch(v6, eth+4, 0x01, 0x00), markerMarkReasonMARK_MALFORMED},
		{"ipv6 header of version 5", "carrier: ipv6-altmark", patch(v6, eth, 0x50), markerMarkReasonMARK_MALFORMED},
		{"ipv6 jumbogram", "carrier: dscp", patch(v6, eth+4, 0, 0), markerMarkReasonMARK_MALFORMED},
		{"udp header truncated", "carrier: ipv6-altmark", patch(v6[:eth+40+4], eth+4, 0, 4), markerMarkReasonMARK_MALFORMED},
		{"altmark option of length 2", "carrier: ipv6-altmark",
			packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Destination, []byte{0x12, 2, 0, 0}).UDP(1, 2).Bytes(), markerMarkReasonMARK_MALFORMED},
		{"option after altmark overruns its header", "carrier: ipv6-altmark",
			packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Destination, append(altmarkOpt(5, true, false), 0x1e, 9)).UDP(1, 2).Bytes(), markerMarkReasonMARK_MALFORMED},
		{"option overruns its header", "carrier: ipv6-altmark",
			packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Destination, []byte{0x1e, 9, 0, 0}).UDP(1, 2).Bytes(), markerMarkReasonMARK_MALFORMED},
		{"extension header beyond the payload", "carrier: ipv6-altmark",
			patch(packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Destination, []byte{1, 4, 0, 0, 0, 0}).UDP(1, 2).Bytes(), eth+41, 3), markerMarkReasonMARK_MALFORMED},
		{"routing header, no altmark", "carrier: ipv6-altmark",
			packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Routing, []byte{4, 0, 0, 0, 0, 0}).UDP(1, 2).Bytes(), markerMarkReasonMARK_NO_POSITION},
		{"hop-by-hop without altmark", "carrier: ipv6-altmark\nheader: hop-by-hop",
			packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6HopByHop, []byte{1, 4, 0, 0, 0, 0}).UDP(1, 2).Bytes(), markerMarkReasonMARK_NO_POSITION},
		{"fragment", "carrier: ipv6-altmark",
			packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Fragment, []byte{0, 1, 0, 0, 0, 1}).UDP(1, 2).Bytes(), markerMarkReasonMARK_NO_POSITION},
		{"altmark after a routing header", "carrier: ipv6-altmark",
			packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Routing, []byte{4, 0, 0, 0, 0, 0}).
				IPv6Ext(layers.IPProtocolIPv6Destination, altmarkOpt(5, true, false)).UDP(1, 2).Bytes(), markerMarkReasonMARK_NO_POSITION},
		{"ipv4 under ipv6-altmark", "carrier: ipv6-altmark", v4, markerMarkReasonMARK_WRONG_FAMILY},
		{"ipv6 under ipv4-flag", "carrier: ipv4-flag", v6, markerMarkReasonMARK_WRONG_FAMILY},
		// L3 length 1276 + 8 > 1280.
		{"altmark beyond the mtu", "carrier: ipv6-altmark\nmtu: 1280", big(1276 - 48), markerMarkReasonMARK_TOO_BIG},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs, _ := loadMark(t, tc.cfg+"\nperiod: 20ms\n")
			r := runOnce(t, objs.AltmarkMark, tc.in)
			if int32(r.ret) != -1 { // TCX_NEXT: never a drop
				t.Errorf("verdict %d, want TCX_NEXT", int32(r.ret))
			}
			sameBytes(t, r.out, tc.in)
			wantCounters(t, objs, map[markerMarkReason]uint64{tc.why: 1, markerMarkReasonMARK_SEEN: 1, markerMarkReasonMARK_MARKED: 0})
		})
	}
	// Exactly at the MTU: inserted.
	objs, _ := loadMark(t, "carrier: ipv6-altmark\nmtu: 1280\nperiod: 20ms\n")
	r := runOnce(t, objs.AltmarkMark, big(1272-48))
	if len(r.out) != len(big(1272-48))+8 {
		t.Errorf("a packet of 1272 bytes under MTU 1280: %d bytes out", len(r.out)-eth)
	}
	wantCounters(t, objs, map[markerMarkReason]uint64{markerMarkReasonMARK_INSERTED: 1, markerMarkReasonMARK_TOO_BIG: 0})
}

func TestMarkSelection(t *testing.T) {
	t.Parallel()
	objs, _ := loadMark(t, `carrier: dscp
period: 20ms
select:
  dst: [198.18.1.0/24, "fd00:0:0:2::/64"]
  protocols: [udp, sctp]
  dst_port: 5000-5010
`)
	for _, tc := range []struct {
		name string
		in   []byte
		want bool
	}{
		{"ipv4 udp in", packet.IP(src4, dst4).UDP(1, 5000).Bytes(), true},
		{"ipv6 udp in", packet.IP(src6, dst6).UDP(1, 5010).Bytes(), true},
		{"other destination", packet.IP(src4, "198.18.2.1").UDP(1, 5000).Bytes(), false},
		{"other ipv6 destination", packet.IP(src6, "fd00:0:0:3::1").UDP(1, 5000).Bytes(), false},
		{"tcp", packet.IP(src4, dst4).TCP(1, 5000, "S").Bytes(), false},
		{"port out of range", packet.IP(src6, dst6).UDP(1, 5011).Bytes(), false},
		{"icmp has no port", packet.IP(src4, dst4).Echo(1, 1, false).Bytes(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := counter(t, objs, markerMarkReasonMARK_MARKED)
			runOnce(t, objs.AltmarkMark, tc.in)
			if got := counter(t, objs, markerMarkReasonMARK_MARKED) > before; got != tc.want {
				t.Errorf("marked %v, want %v", got, tc.want)
			}
		})
	}
	wantCounters(t, objs, map[markerMarkReason]uint64{markerMarkReasonMARK_NOT_SELECTED: 5})

	// A port range that includes 0 still wants a protocol with ports.
	objs, _ = loadMark(t, "carrier: dscp\nperiod: 20ms\nselect: {src_port: 0-100}\n")
	runOnce(t, objs.AltmarkMark, packet.IP(src4, dst4).Echo(1, 1, false).Bytes())
	runOnce(t, objs.AltmarkMark, packet.IP(src4, dst4).UDP(100, 9).Bytes())
	wantCounters(t, objs, map[markerMarkReason]uint64{markerMarkReasonMARK_NOT_SELECTED: 1, markerMarkReasonMARK_MARKED: 1})
}

// flowmonOf is the FlowMonID of the AltMark option the marker inserted into a plain packet.
func flowmonOf(t *testing.T, out []byte) (id uint32, l, d bool) {
	t.Helper()
	if len(out) < eth+48 || out[eth+40+2] != 0x12 || out[eth+40+3] != 4 {
		t.Fatalf("no AltMark option after the IPv6 header:\n%s", hex.Dump(out))
	}
	w := binary.BigEndian.Uint32(out[eth+44:])
	return w >> 12, w&(1<<11) != 0, w&(1<<10) != 0
}

func TestMarkFlowMonIDPerFlow(t *testing.T) {
	t.Parallel()
	objs, c := loadMark(t, "carrier: ipv6-altmark\nperiod: 20ms\nflowmon_id: per-flow\nflowmon_range: 100-102\n")
	flow := func(sport uint16) []byte { return packet.IP(src6, dst6).UDP(sport, 5000).Bytes() }
	ids := map[uint32]uint16{}
	for sport := uint16(1); sport <= 3; sport++ {
		id, _, _ := flowmonOf(t, runKnown(t, objs.AltmarkMark, flow(sport), c).out)
		if id < 100 || id > 102 {
			t.Errorf("flow %d: FlowMonID %d outside 100-102", sport, id)
		}
		if o, dup := ids[id]; dup {
			t.Errorf("flows %d and %d share FlowMonID %d", o, sport, id)
		}
		ids[id] = sport
	}
	for id, sport := range ids { // a flow keeps its ID
		if again, _, _ := flowmonOf(t, runKnown(t, objs.AltmarkMark, flow(sport), c).out); again != id {
			t.Errorf("flow %d: FlowMonID %d, then %d", sport, id, again)
		}
	}
	// A TCP flow with the same ports is another flow; the fourth flow of a 3-ID range reuses
	// the first ID (documented: IDs are unique among flowmon_range's size consecutive flows).
	id, _, _ := flowmonOf(t, runKnown(t, objs.AltmarkMark, packet.IP(src6, dst6).TCP(1, 5000, "S").Bytes(), c).out)
	if id != 100 {
		t.Errorf("the fourth flow got %d, want 100 (wrapped)", id)
	}
}

// TestMarkDouble: the first N packets of each flow in the central half of a period carry the
// delay mark, later ones and those near the color change do not.
func TestMarkDouble(t *testing.T) {
	t.Parallel()
	const period = 200 * time.Millisecond
	for _, tc := range []struct {
		name, cfg string
		in        func(sport uint16) []byte
		delayed   func(t *testing.T, out []byte) bool
	}{
		{"ipv6-altmark D flag", "carrier: ipv6-altmark\nflowmon_id: 9\n", func(sport uint16) []byte { return packet.IP(src6, dst6).UDP(sport, 5000).Bytes() },
			func(t *testing.T, out []byte) bool { _, _, d := flowmonOf(t, out); return d }},
		{"dscp delay bit", "carrier: dscp\ndscp_bits: [0, 1]\n", func(sport uint16) []byte { return packet.IP(src4, dst4).UDP(sport, 5000).Bytes() },
			func(t *testing.T, out []byte) bool {
				checksumsValid(t, out, layers.LayerTypeUDP)
				return out[eth+1]&0x08 != 0
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs, c := loadMark(t, tc.cfg+"period: 200ms\ndouble: {packets: 2}\n")
			l := int64(period)
			for attempt := 0; ; attempt++ {
				if attempt == 20 {
					t.Fatal("no sequence within the central half of one period in 20 tries")
				}
				// Wait for the central half of a period, then send 3 packets of flow 1 and 2
				// of flow 2; one period and central half for all, or try again.
				for p := tai() % l; p < l/4+l/20 || p > l/2; p = tai() % l {
					time.Sleep(time.Duration(min(l/20, (l/4+l/20-p+l)%l+1)))
				}
				var runs []markRun
				for _, sport := range []uint16{1, 1, 1, 2, 2} {
					runs = append(runs, runKnown(t, objs.AltmarkMark, tc.in(sport), c))
				}
				ok := true
				for _, r := range runs {
					ok = ok && r.period == runs[0].period && r.pos >= l/4 && r.pos < l-l/4
				}
				if !ok {
					continue
				}
				var got []bool
				for _, r := range runs {
					got = append(got, tc.delayed(t, r.out))
				}
				if want := []bool{true, true, false, true, true}; !slices.Equal(got, want) {
					t.Fatalf("delay marks %v, want %v", got, want)
				}
				break
			}
			// Near the color change (first quarter of a period): no delay mark.
			for p := tai() % l; p > l/8; p = tai() % l {
				time.Sleep(time.Duration(min(l/20, l-p+1)))
			}
			r := runKnown(t, objs.AltmarkMark, tc.in(3), c)
			if r.pos < l/4 && tc.delayed(t, r.out) {
				t.Error("a packet in the first quarter of the period has the delay mark")
			}
		})
	}
}
