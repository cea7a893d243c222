package altmark

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/progrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// The probe program on crafted packets (BPF_PROG_TEST_RUN): the packets come from the loopback
// device (ifindex 1), so the test probes watch lo in and out.

const tcxNext = 0xffffffff // TCX_NEXT (-1)

func testSpec() ProbeSpec {
	return ProbeSpec{Points: []Point{{"lo", "in"}, {"lo", "out"}}, PeriodNs: int64(1e9), Carrier: carrierDSCP,
		DSCPBits: [2]uint8{0, 1}, HashBits: 8, NMax: 1000}
}

func loadTestProbe(t testing.TB, s ProbeSpec, sampling bool) *Probe {
	t.Helper()
	testenv.Privileged(t)
	p, err := LoadProbe(s, sampling)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// send runs the probe's program of direction dir on frame: it must pass it unchanged.
func send(t *testing.T, p *Probe, dir string, frame []byte) {
	t.Helper()
	in, out := p.Programs()
	prog := in
	if dir == "out" {
		prog = out
	}
	r, err := progrun.Exec(prog, frame, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ret != tcxNext {
		t.Fatalf("verdict %d, want TCX_NEXT", int32(r.Ret))
	}
	if !bytes.Equal(r.Out, frame) {
		t.Fatalf("the probe changed the packet")
	}
}

func taiNow(t *testing.T) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_TAI, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano()
}

// Frame edits after building (the builder has no field for these).

func isV4(f []byte) bool { return binary.BigEndian.Uint16(f[12:]) == 0x0800 }

func fixIPv4Sum(f []byte) {
	h := f[14 : 14+int(f[14]&0xf)*4]
	h[10], h[11] = 0, 0
	var s uint32
	for i := 0; i < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	binary.BigEndian.PutUint16(h[10:], ^uint16(s))
}

func setTOS(f []byte, tos uint8) []byte {
	f = slices.Clone(f)
	if isV4(f) {
		f[15] = tos
		fixIPv4Sum(f)
	} else {
		f[14] = f[14]&0xf0 | tos>>4
		f[15] = f[15]&0x0f | tos<<4
	}
	return f
}

func setTTL(f []byte, ttl uint8) []byte {
	f = slices.Clone(f)
	if isV4(f) {
		f[22] = ttl
		fixIPv4Sum(f)
	} else {
		f[21] = ttl
	}
	return f
}

func setIPv4ID(f []byte, id uint16) []byte {
	f = slices.Clone(f)
	binary.BigEndian.PutUint16(f[18:], id)
	fixIPv4Sum(f)
	return f
}

func setReserved(f []byte) []byte {
	f = slices.Clone(f)
	f[20] |= 0x80
	fixIPv4Sum(f)
	return f
}

func setFlowLabel(f []byte, fl uint32) []byte {
	f = slices.Clone(f)
	w := binary.BigEndian.Uint32(f[14:])
	binary.BigEndian.PutUint32(f[14:], w&^0xfffff|fl&0xfffff)
	return f
}

// amOpt is the AltMark option: type 0x12, length 4, FlowMonID | L | D | reserved.
func amOpt(flowmon uint32, l, d bool) []byte {
	w := flowmon << 12
	if l {
		w |= 1 << 11
	}
	if d {
		w |= 1 << 10
	}
	return binary.BigEndian.AppendUint32([]byte{0x12, 4}, w)
}

func l3len(f []byte) int64 {
	if isV4(f) {
		return int64(binary.BigEndian.Uint16(f[16:]))
	}
	return 40 + int64(binary.BigEndian.Uint16(f[18:]))
}

// row is the counter row of a point (and FlowMonID) in cs.
func row(t *testing.T, cs []Counter, dir string, flowmon int64) Counter {
	t.Helper()
	for _, c := range cs {
		if c.Ifname == "lo" && c.Direction == dir && c.FlowMonID == flowmon {
			return c
		}
	}
	t.Fatalf("no counter row for lo %s flowmon %d in %+v", dir, flowmon, cs)
	return Counter{}
}

func udp4() *packet.Builder { return packet.IP("198.18.0.1", "198.18.1.2").UDP(5000, 6000) }
func udp6() *packet.Builder { return packet.IP("fd00::1", "fd00:1::2").UDP(5000, 6000) }

// TestProbeCountsPerColor: every carrier's color read from packets of both colors, counted per
// color, read with sums over CPUs, and zeroed by the read.
func TestProbeCountsPerColor(t *testing.T) {
	pl := []byte("0123456789abcdef")
	v6am := func(hdrs ...[2]any) []byte {
		b := udp6().Payload(pl)
		for _, h := range hdrs {
			b = b.IPv6Ext(h[0].(layers.IPProtocol), h[1].([]byte))
		}
		return b.Bytes()
	}
	hbh, doh := layers.IPProtocolIPv6HopByHop, layers.IPProtocolIPv6Destination
	cases := []struct {
		name           string
		mod            func(*ProbeSpec)
		color0, color1 []byte
		flowmon        int64
	}{
		{"dscp bits 0,1 IPv4", nil,
			setTOS(udp4().Payload(pl).Bytes(), 2<<2|3), // delay bit and ECN set: still color 0
			setTOS(udp4().Payload(pl).Bytes(), 1<<2), -1},
		{"dscp bits 3,5 IPv4", func(s *ProbeSpec) { s.DSCPBits = [2]uint8{3, 5} },
			setTOS(udp4().Payload(pl).Bytes(), 0x37<<2&^(8<<2)), // every other DSCP bit set
			setTOS(udp4().Payload(pl).Bytes(), 8<<2), -1},
		{"dscp IPv6", nil,
			setTOS(udp6().Payload(pl).Bytes(), 3),
			setTOS(udp6().Payload(pl).Bytes(), 1<<2|2<<2), -1},
		{"ipv4-flag", func(s *ProbeSpec) { s.Carrier = carrierIPv4Flag },
			udp4().Payload(pl).Bytes(),
			setReserved(udp4().Payload(pl).Bytes()), -1},
		{"ipv6-altmark DOH", func(s *ProbeSpec) { s.Carrier = carrierIPv6AltMrk },
			v6am([2]any{doh, amOpt(0x12345, false, true)}),
			v6am([2]any{doh, amOpt(0x12345, true, false)}), 0x12345},
		{"ipv6-altmark HBH", func(s *ProbeSpec) { s.Carrier = carrierIPv6AltMrk },
			v6am([2]any{hbh, amOpt(7, false, false)}),
			v6am([2]any{hbh, amOpt(7, true, true)}), 7},
		{"ipv6-altmark DOH after HBH, Pad1 and PadN before", func(s *ProbeSpec) { s.Carrier = carrierIPv6AltMrk },
			v6am([2]any{hbh, []byte{1, 4, 0, 0, 0, 0}}, [2]any{doh, append([]byte{0, 1, 1, 0}, amOpt(0xfffff, false, false)...)}),
			v6am([2]any{hbh, []byte{1, 4, 0, 0, 0, 0}}, [2]any{doh, append([]byte{0, 1, 1, 0}, amOpt(0xfffff, true, false)...)}), 0xfffff},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := testSpec()
			if c.mod != nil {
				c.mod(&s)
			}
			p := loadTestProbe(t, s, true)
			before := taiNow(t)
			for range 3 {
				send(t, p, "in", c.color0)
			}
			for range 5 {
				send(t, p, "in", c.color1)
			}
			send(t, p, "out", c.color1)
			after := taiNow(t)
			for n, want := range map[int64][2]int64{0: {3, 0}, 1: {5, 1}} {
				cs, _, err := p.Read(n)
				if err != nil {
					t.Fatal(err)
				}
				frame := c.color0
				if n == 1 {
					frame = c.color1
				}
				in := row(t, cs, "in", c.flowmon)
				if in.Packets != want[0] || in.Bytes != want[0]*l3len(frame) {
					t.Errorf("color %d in: %d packets %d bytes, want %d and %d", n, in.Packets, in.Bytes, want[0], want[0]*l3len(frame))
				}
				if in.FirstTAINs < before || in.LastTAINs > after || in.MeanTAINs < in.FirstTAINs || in.MeanTAINs > in.LastTAINs {
					t.Errorf("color %d times first %d last %d mean %d outside [%d, %d]", n, in.FirstTAINs, in.LastTAINs, in.MeanTAINs, before, after)
				}
				if want[1] > 0 {
					if out := row(t, cs, "out", c.flowmon); out.Packets != want[1] {
						t.Errorf("color %d out: %d packets, want %d", n, out.Packets, want[1])
					}
				}
				// The read zeroed the color.
				cs, _, err = p.Read(n + 2)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range cs {
					if r.Packets != 0 {
						t.Errorf("after the read of color %d: %+v", n, r)
					}
				}
			}
			st, err := p.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if st["seen"] != 9 || st["counted"] != 9 {
				t.Errorf("stats %v: want 9 seen and counted", st)
			}
		})
	}
}

// TestProbeHashInvariant: copies of a packet as different hops see it (TTL / hop limit, DSCP,
// ECN, the IPv4 checksum, the AltMark flags changed) hash the same, the same as Hash in Go;
// a different IPv4 ID, flow label or payload hashes differently.
func TestProbeHashInvariant(t *testing.T) {
	pl := []byte("payload-prefix-and-more")
	v4 := setIPv4ID(udp4().Payload(pl).Bytes(), 0x1234)
	tcp4 := setIPv4ID(packet.IP("198.18.0.1", "198.18.1.2").TCP(40000, 80, "PA").Seq(1000).Ack(2000).Payload(pl).Bytes(), 7)
	v6 := func(l, d bool) []byte {
		return setFlowLabel(udp6().Payload(pl).IPv6Ext(layers.IPProtocolIPv6Destination, amOpt(42, l, d)).Bytes(), 0xabcde)
	}
	icmp := packet.IP("198.18.0.1", "198.18.1.2").Echo(9, 1, false).Payload([]byte("ping-ts-")).Bytes()
	// A payload shorter than 8 bytes: at the frame's end (read with bpf_skb_load_bytes) and
	// followed by Ethernet padding of any content (read in place and masked).
	short := setIPv4ID(udp4().Payload([]byte("ab")).Bytes(), 5)
	pad := func(f []byte, b byte) []byte { return append(slices.Clone(f), bytes.Repeat([]byte{b}, 20)...) }
	a4, b4 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.1.2")
	a6, b6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00:1::2")
	cases := []struct {
		name    string
		carrier string
		copies  [][]byte
		other   []byte
		fields  HashFields
	}{
		{"IPv4 UDP", carrierDSCP, [][]byte{v4, setTTL(v4, 3), setTOS(setTTL(v4, 9), 16<<2|3)}, setIPv4ID(v4, 0x1235),
			HashFields{Src: a4, Dst: b4, Proto: 17, SrcPort: 5000, DstPort: 6000, Ident: 0x1234, Payload: pl}},
		{"IPv4 TCP", carrierDSCP, [][]byte{tcp4, setTTL(setTOS(tcp4, 4<<2), 1)},
			packet.IP("198.18.0.1", "198.18.1.2").TCP(40000, 80, "PA").Seq(1001).Ack(2000).Payload(pl).Bytes(),
			HashFields{Src: a4, Dst: b4, Proto: 6, SrcPort: 40000, DstPort: 80, Ident: 7, Seq: 1000, Ack: 2000, Payload: pl}},
		{"IPv4 ICMP", carrierDSCP, [][]byte{icmp, setTTL(icmp, 2)},
			packet.IP("198.18.0.1", "198.18.1.2").Echo(9, 1, false).Payload([]byte("ping-ts+")).Bytes(),
			HashFields{Src: a4, Dst: b4, Proto: 1, Payload: []byte("ping-ts-")}},
		{"IPv4 UDP payload of 2 bytes, padded or not", carrierDSCP, [][]byte{short, pad(short, 0), pad(setTTL(short, 4), 0xff)},
			pad(setIPv4ID(udp4().Payload([]byte("ac")).Bytes(), 5), 0xff),
			HashFields{Src: a4, Dst: b4, Proto: 17, SrcPort: 5000, DstPort: 6000, Ident: 5, Payload: []byte("ab")}},
		{"IPv6 AltMark", carrierIPv6AltMrk, [][]byte{v6(false, false), setTTL(v6(false, true), 1), setTOS(v6(false, true), 0xff)},
			setFlowLabel(v6(false, false), 0xabcdf),
			HashFields{Src: a6, Dst: b6, Proto: 17, SrcPort: 5000, DstPort: 6000, Ident: 0xabcde, Payload: pl}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := testSpec()
			s.Carrier, s.HashBits = c.carrier, 0 // sample every packet
			p := loadTestProbe(t, s, true)
			for _, f := range append(slices.Clone(c.copies), c.other) {
				send(t, p, "in", f)
			}
			_, ss, err := p.Read(0)
			if err != nil {
				t.Fatal(err)
			}
			if len(ss) != len(c.copies)+1 {
				t.Fatalf("%d samples, want %d", len(ss), len(c.copies)+1)
			}
			want := Hash(c.fields)
			for i, smp := range ss[:len(c.copies)] {
				if uint32(smp.Hash) != want {
					t.Errorf("copy %d: hash %#x, Go's %#x", i, smp.Hash, want)
				}
				if smp.SrcAddr != c.fields.Src.String() || smp.DstAddr != c.fields.Dst.String() || smp.Proto != int32(c.fields.Proto) ||
					smp.SrcPort != int32(c.fields.SrcPort) || smp.DstPort != int32(c.fields.DstPort) || int64(smp.Length) != l3len(c.copies[0]) {
					t.Errorf("copy %d: sample %+v", i, smp)
				}
			}
			if uint32(ss[len(c.copies)].Hash) == want {
				t.Errorf("a packet with another invariant field hashes the same: %#x", want)
			}
		})
	}
}

// TestProbeMalformed: truncated and inconsistent headers are counted per reason and per point,
// passed unchanged, and never counted in a color. (The kernel's test run refuses frames shorter
// than an Ethernet header or cut inside the IPv4/IPv6 fixed header, EINVAL, so those cuts are
// tested as lengths that promise more than the frame holds.)
func TestProbeMalformed(t *testing.T) {
	v4 := udp4().Payload([]byte("12345678")).Bytes()
	v6 := udp6().Payload([]byte("12345678")).Bytes()
	tcp := packet.IP("198.18.0.1", "198.18.1.2").TCP(1, 2, "A").Bytes()
	withDOH := func(body []byte) []byte {
		return udp6().Payload([]byte("12345678")).IPv6Ext(layers.IPProtocolIPv6Destination, body).Bytes()
	}
	edit := func(f []byte, fn func([]byte)) []byte {
		f = slices.Clone(f)
		fn(f)
		return f
	}
	cases := []struct {
		name   string
		frame  []byte
		reason string
	}{
		{"VLAN tag truncated", edit(v4[:16], func(f []byte) { f[12], f[13] = 0x81, 0x00 }), "mal_l2"},
		{"IPv4 ihl 4", edit(v4, func(f []byte) { f[14] = 0x44 }), "mal_ipv4"},
		{"IPv4 ihl past the end", edit(v4[:14+24], func(f []byte) { f[14] = 0x4f }), "mal_ipv4"},
		{"IPv4 total length past the end", edit(v4, func(f []byte) { binary.BigEndian.PutUint16(f[16:], 1500) }), "mal_ipv4"},
		{"IPv4 total length below the header", edit(v4, func(f []byte) { binary.BigEndian.PutUint16(f[16:], 12) }), "mal_ipv4"},
		{"IPv4 version 5", edit(v4, func(f []byte) { f[14] = 0x55 }), "mal_ipv4"},
		{"UDP header truncated", edit(v4[:14+20+4], func(f []byte) { binary.BigEndian.PutUint16(f[16:], 24) }), "mal_l4"},
		{"TCP data offset 3", edit(tcp, func(f []byte) { f[14+20+12] = 3 << 4 }), "mal_l4"},
		{"TCP header past the total length", edit(tcp, func(f []byte) { binary.BigEndian.PutUint16(f[16:], 30) }), "mal_l4"},
		{"IPv6 payload length past the end", edit(v6, func(f []byte) { binary.BigEndian.PutUint16(f[18:], 900) }), "mal_ipv6"},
		{"IPv6 jumbogram (payload length 0)", edit(v6, func(f []byte) { binary.BigEndian.PutUint16(f[18:], 0) }), "mal_ipv6"},
		{"IPv6 extension header past the payload", edit(withDOH(amOpt(1, true, false)), func(f []byte) { f[14+40+1] = 200 }), "mal_ext"},
		{"IPv6 seven extension headers", func() []byte {
			b := udp6()
			for range 7 {
				b = b.IPv6Ext(layers.IPProtocolIPv6Routing, []byte{0, 0, 0, 0, 0, 0})
			}
			return b.Bytes()
		}(), "mal_ext"},
		{"PadN past its header", withDOH([]byte{1, 9, 0, 0, 0, 0}), "mal_opt"},
		{"AltMark of length 3", withDOH([]byte{0x12, 3, 0, 0, 0, 1}), "mal_opt"},
		{"AltMark past its header", withDOH([]byte{1, 0, 1, 0, 0x12, 4}), "mal_opt"},
		{"nine options before AltMark", withDOH(append([]byte{1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0}, amOpt(1, true, false)...)), "mal_opt"},
	}
	s := testSpec()
	s.Carrier = carrierIPv6AltMrk
	p := loadTestProbe(t, s, true)
	want := map[string]uint64{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			send(t, p, "in", c.frame)
			want[c.reason]++
			st, err := p.Stats()
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range StatNames {
				if st[r] != want[r] && r != "seen" {
					t.Errorf("%s = %d, want %d", r, st[r], want[r])
					want[r] = st[r]
				}
			}
		})
	}
	var malformed int64
	for n := range int64(2) {
		cs, _, err := p.Read(n)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if c.Packets != 0 {
				t.Errorf("counted: %+v", c)
			}
			malformed += c.Malformed
		}
	}
	if malformed != int64(len(cases)) {
		t.Errorf("malformed in the counters %d, want %d", malformed, len(cases))
	}
	// A well-formed packet without the option still passes, uncounted: unmarked.
	send(t, p, "in", v6)
	if st, _ := p.Stats(); st["unmarked"] != 1 {
		t.Errorf("unmarked = %d, want 1", st["unmarked"])
	}
}

// TestProbeHashLengthGrows: with NMAX = 8 and 0 starting bits, each eighth sample adds a bit; the
// kernel's final length and the samples kept are those of the same algorithm run in Go on the
// packets' Go hashes.
func TestProbeHashLengthGrows(t *testing.T) {
	const nmax, packets = 8, 300
	s := testSpec()
	s.HashBits, s.NMax, s.HashRef = 0, nmax, 0x5a5a5a5a
	p := loadTestProbe(t, s, true)
	bits, taken, hist := 0, 0, [33]int{}
	var hashes []uint32
	for i := range packets {
		pl := []byte(fmt.Sprintf("pkt%05d", i))
		send(t, p, "in", udp4().Payload(pl).Bytes())
		h := Hash(HashFields{Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.1.2"), Proto: 17,
			SrcPort: 5000, DstPort: 6000, Payload: pl})
		hashes = append(hashes, h)
		if m := HashMatch(h, s.HashRef); m >= bits {
			hist[m]++
			taken++
			if taken >= nmax && bits < 32 {
				taken -= hist[bits]
				bits++
			}
		}
	}
	var want []int64
	for _, h := range hashes {
		if HashMatch(h, s.HashRef) >= bits {
			want = append(want, int64(h))
		}
	}
	cs, ss, err := p.Read(0)
	if err != nil {
		t.Fatal(err)
	}
	if c := row(t, cs, "in", -1); c.HashBits != int32(bits) || c.Packets != packets {
		t.Errorf("final hash length %d over %d packets, want %d over %d", c.HashBits, c.Packets, bits, packets)
	}
	var got []int64
	for _, smp := range ss {
		got = append(got, smp.Hash)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("samples kept %x, want %x", got, want)
	}
	if len(got) < nmax/2-1 || len(got) >= nmax {
		t.Errorf("%d samples kept: want NMAX/2 to NMAX", len(got))
	}
	st, _ := p.Stats()
	if st["hash_grown"] != uint64(bits) {
		t.Errorf("hash_grown %d, want %d", st["hash_grown"], bits)
	}
	// The read put the length back to the start.
	send(t, p, "in", udp4().Payload([]byte("again")).Bytes())
	if cs, _, _ := p.Read(2); row(t, cs, "in", -1).HashBits != 0 {
		t.Errorf("hash length after the read: %d, want 0", row(t, cs, "in", -1).HashBits)
	}
}

// TestProbeProtocolFilter: only the configured protocols are counted.
func TestProbeProtocolFilter(t *testing.T) {
	s := testSpec()
	s.Protocols = []uint8{17, 58}
	p := loadTestProbe(t, s, true)
	send(t, p, "in", udp4().Bytes())
	send(t, p, "in", packet.IP("198.18.0.1", "198.18.1.2").TCP(1, 2, "S").Bytes())
	send(t, p, "in", packet.IP("198.18.0.1", "198.18.1.2").Echo(1, 1, false).Bytes())
	send(t, p, "in", udp6().Bytes())
	cs, _, err := p.Read(0)
	if err != nil {
		t.Fatal(err)
	}
	if c := row(t, cs, "in", -1); c.Packets != 2 {
		t.Errorf("%d packets counted, want 2 (the UDP ones)", c.Packets)
	}
	if st, _ := p.Stats(); st["filtered"] != 2 {
		t.Errorf("filtered %d, want 2", st["filtered"])
	}
}

// TestProbeBackbone: with ipv4-flag, traffic from or to a backbone prefix is not counted.
func TestProbeBackbone(t *testing.T) {
	s := testSpec()
	s.Carrier = carrierIPv4Flag
	s.Backbone = []netip.Prefix{netip.MustParsePrefix("198.18.9.0/24"), netip.MustParsePrefix("198.19.0.1/32")}
	p := loadTestProbe(t, s, true)
	for _, f := range [][]byte{
		packet.IP("198.18.9.5", "198.18.1.2").UDP(179, 179).Bytes(),
		packet.IP("198.18.0.1", "198.18.9.200").UDP(1, 2).Bytes(),
		packet.IP("198.19.0.1", "198.18.1.2").UDP(1, 2).Bytes(),
		packet.IP("198.18.0.1", "198.18.1.2").UDP(1, 2).Bytes(), // counted
		packet.IP("198.19.0.2", "198.18.1.2").UDP(1, 2).Bytes(), // counted
	} {
		send(t, p, "in", f)
	}
	cs, _, err := p.Read(0)
	if err != nil {
		t.Fatal(err)
	}
	if c := row(t, cs, "in", -1); c.Packets != 2 {
		t.Errorf("%d packets counted, want 2", c.Packets)
	}
	if st, _ := p.Stats(); st["backbone"] != 3 {
		t.Errorf("backbone %d, want 3", st["backbone"])
	}
}

// TestProbeCountsAboveTheSlotTable: a point whose ifindex is above AM_IFINDEX_MAX is counted in
// the hash map by (ifindex, direction) instead of the points' array, beside a point counted in
// the array, and Read gives each its own row.
func TestProbeCountsAboveTheSlotTable(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	ns := testenv.Netns(t)
	high := int(probeAmLimitAM_IFINDEX_MAX) + 904
	name := testenv.Name("hi")
	err := nsrun.Do(ns, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, Index: high}, PeerName: name + "p"}); err != nil {
			return err
		}
		s := testSpec()
		s.Points = []Point{{"lo", "in"}, {name, "in"}}
		p, err := LoadProbe(s, true)
		if err != nil {
			return err
		}
		defer p.Close()
		in, _ := p.Programs()
		frame := setTOS(udp4().Payload([]byte("12345678")).Bytes(), 1<<2) // color 1
		for ifindex, n := range map[int]int{1: 2, high: 3} {
			for range n {
				if _, err := progrun.Exec(in, frame, ifindex); err != nil {
					return err
				}
			}
		}
		cs, _, err := p.Read(1)
		if err != nil {
			return err
		}
		got := map[string]int64{}
		for _, c := range cs {
			got[c.Ifname] += c.Packets
			if c.Packets > 0 && (c.Bytes != c.Packets*l3len(frame) || c.FirstTAINs == 0 || c.MeanTAINs < c.FirstTAINs || c.MeanTAINs > c.LastTAINs) {
				t.Errorf("row %+v", c)
			}
		}
		if got["lo"] != 2 || got[name] != 3 {
			t.Errorf("packets per interface %v, want lo 2 and %s 3", got, name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestProbeStatNames: one name per enum am_stat value.
func TestProbeStatNames(t *testing.T) {
	if len(StatNames) != int(probeAmStatAM_STAT_MAX) {
		t.Errorf("%d names for %d statistics", len(StatNames), probeAmStatAM_STAT_MAX)
	}
}

// TestOpenProbeAttachesAndDetaches: OpenProbe attaches one tcx program per point on a veth in a
// namespace of its own, and Close leaves none; a missing interface fails before anything
// attaches, naming it.
func TestOpenProbeAttachesAndDetaches(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	a, b := testenv.Netns(t), testenv.Netns(t)
	va, _ := testenv.VethPair(t, a, b, netip.MustParsePrefix("198.18.7.1/24"), netip.MustParsePrefix("198.18.7.2/24"))
	count := func() (in, out int) {
		for _, x := range []struct {
			at ebpf.AttachType
			n  *int
		}{{ebpf.AttachTCXIngress, &in}, {ebpf.AttachTCXEgress, &out}} {
			r, err := link.QueryPrograms(link.QueryOptions{Target: va.Index, Attach: x.at})
			if err != nil {
				t.Fatal(err)
			}
			*x.n = len(r.Programs)
		}
		return in, out
	}
	err := nsrun.Do(a, func() error {
		s := testSpec()
		s.Points = []Point{{va.Name, "in"}, {va.Name, "out"}}
		dp, err := OpenProbe(s)
		if err != nil {
			return err
		}
		if in, out := count(); in != 1 || out != 1 {
			t.Errorf("attached: %d ingress and %d egress programs, want 1 and 1", in, out)
		}
		if err := dp.Close(); err != nil {
			t.Error(err)
		}
		if in, out := count(); in != 0 || out != 0 {
			t.Errorf("after Close: %d ingress and %d egress programs", in, out)
		}
		s.Points = append(s.Points, Point{"fpnosuchif", "in"})
		if _, err := OpenProbe(s); err == nil || !strings.Contains(err.Error(), "fpnosuchif") {
			t.Errorf("a missing interface: %v", err)
		}
		if in, out := count(); in != 0 || out != 0 {
			t.Errorf("after a failed open: %d ingress and %d egress programs", in, out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
