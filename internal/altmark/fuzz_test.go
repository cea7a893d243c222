package altmark

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/progrun"
	"github.com/flowplane/flowplane/internal/stats"
)

// Coverage-guided fuzzing of the probe and the marker (go test -fuzz, make fuzz): fuzzer-made
// frames through BPF_PROG_TEST_RUN, the carrier chosen by the input, programs loaded once per
// fuzzing process.

// fuzzFrames are the seeds: well-formed packets of every layout the parser reads.
func fuzzFrames() [][]byte {
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	return [][]byte{
		udp4().Payload([]byte("12345678")).Bytes(),
		withTOS(packet.IP(src4, dst4).TCP(40000, 80, "PA").Seq(1).Ack(2).Payload([]byte("data")).Bytes(), 0x2b),
		packet.IP(src4, dst4).Echo(1, 2, false).Bytes(),
		withFragOff(udp4().Bytes(), 0x8000), // reserved flag set
		udp6().Payload([]byte("12345678")).Bytes(),
		withTC(packet.IP(src6, dst6).TCP(40000, 80, "S").Seq(1).MSS(1460).Bytes(), 0x0c),
		packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Destination, altmarkOpt(7, true, false)).UDP(1, 2).Bytes(),
		packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6HopByHop, cat([]byte{1, 0}, altmarkOpt(9, false, true))).
			IPv6Ext(layers.IPProtocolIPv6Destination, []byte{0x1e, 2, 0xaa, 0xbb}).TCP(1, 2, "A").Bytes(),
		packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Routing, []byte{4, 0, 0, 0, 0, 0}).UDP(1, 2).Bytes(),
		packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Fragment, []byte{0, 1, 0, 0, 0, 1}).UDP(1, 2).Bytes(),
		packet.IP(src6, dst6).Echo(1, 2, false).Bytes(),
	}
}

// The probe's outcome counters: every packet increments exactly one.
var probeOutcomes = []string{"counted", "not_ip", "unmarked", "filtered", "backbone", "mal_l2", "mal_ipv4", "mal_ipv6",
	"mal_ext", "mal_opt", "mal_l4"}

// FuzzAltmarkProbe runs the probe of the carrier and direction the input picks: the verdict is
// TCX_NEXT, the packet leaves unchanged, it is counted under exactly one outcome, and under a
// malformed IP header (Ethernet/VLAN, IPv4, IPv6 outcomes) if and only if packet.ReadHeaders
// and the IP length fields say so.
func FuzzAltmarkProbe(f *testing.F) {
	probes := make([]*Probe, len(carriers)) // once per fuzzing process
	for i, c := range carriers {
		s := testSpec()
		s.Carrier = c
		probes[i] = loadTestProbe(f, s, true)
	}
	for _, fr := range fuzzFrames() {
		for pick := range 2 * len(probes) {
			f.Add(fr, uint8(pick))
		}
	}
	f.Fuzz(func(t *testing.T, frame []byte, pick uint8) {
		p := probes[int(pick>>1)%len(probes)]
		in, out := p.Programs()
		prog := in
		if pick&1 == 1 {
			prog = out
		}
		if !progrun.Accepts(prog, frame) {
			return
		}
		before, err := p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		r, err := progrun.Exec(prog, frame, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.Ret != tcxNext {
			t.Fatalf("verdict %d, want TCX_NEXT\n%x", int32(r.Ret), frame)
		}
		if !bytes.Equal(r.Out, frame) {
			t.Fatalf("the probe changed the packet\nin:  %x\nout: %x", frame, r.Out)
		}
		after, err := p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, o := range probeOutcomes {
			for range after[o] - before[o] {
				got = append(got, o)
			}
		}
		if after["seen"]-before["seen"] != 1 || len(got) != 1 {
			t.Fatalf("seen +%d, outcomes %v: want one each\n%x", after["seen"]-before["seen"], got, frame)
		}
		ipBad := slices.Contains([]string{"mal_l2", "mal_ipv4", "mal_ipv6"}, got[0])
		if want := badIPHeader(frame); want != ipBad {
			t.Fatalf("counted %s; reference reading: IP header malformed %v\n%x", got[0], want, frame)
		}
	})
}

// badIPHeader: the frame's Ethernet, VLAN or fixed IP header is truncated or inconsistent
// (packet.ReadHeaders), or its IP length runs past the frame or, for IPv4, below the header;
// an IPv6 payload length of 0 is a jumbogram, which the probe does not read.
func badIPHeader(frame []byte) bool {
	h := packet.ReadHeaders(frame)
	switch {
	case h.Malformed == "ethernet" || h.Malformed == "ipv4" || h.Malformed == "ipv6":
		return true
	case h.Family == 4:
		return h.End > len(frame) || h.End < h.L4
	case h.Family == 6:
		return h.End > len(frame) || h.End == h.L3+40
	}
	return false
}

// fuzzMarkers are the marker configurations FuzzAltmarkMarker runs, one per carrier and
// header; the input picks.
var fuzzMarkers = []string{
	"carrier: dscp\nperiod: 100ms\n",
	"carrier: dscp\nperiod: 100ms\ndscp_bits: [5, 3]\nstart_color: 1\n",
	"carrier: ipv4-flag\nperiod: 100ms\n",
	"carrier: ipv6-altmark\nperiod: 100ms\nflowmon_id: 0xabcde\nmtu: 1500\n",
	"carrier: ipv6-altmark\nperiod: 100ms\nflowmon_id: 0x12345\nheader: hop-by-hop\nmtu: 1500\n",
}

// The marker's counters, as indexes; from MARK_NOT_IP on, the reasons a packet is left unmarked.
const (
	mSeen, mColor0, mColor1 = int(markerMarkReasonMARK_SEEN), int(markerMarkReasonMARK_COLOR0), int(markerMarkReasonMARK_COLOR1)
	mInserted, mUpdated     = int(markerMarkReasonMARK_INSERTED), int(markerMarkReasonMARK_UPDATED)
	mMarked, mFirstUnmarked = int(markerMarkReasonMARK_MARKED), int(markerMarkReasonMARK_NOT_IP)
)

// FuzzAltmarkMarker runs the marker of the configuration the input picks. The verdict is
// TCX_NEXT. A packet left unmarked leaves unchanged, counted under one reason. A marked one
// differs from the input only in its carrier, and gopacket reads the carrier back: the color of
// the run's period (when the run began and ended in one), DSCP and reserved-flag changes with a
// valid IPv4 header checksum if the input had one, the AltMark option with the FlowMonID in a
// Hop-by-Hop or Destination Options header whose option TLVs fill it exactly, the IPv6 payload
// length and header chain adjusted for an inserted header.
func FuzzAltmarkMarker(f *testing.F) {
	type marker struct {
		objs *markerObjects
		c    *MarkConfig
	}
	ms := make([]marker, len(fuzzMarkers)) // once per fuzzing process
	for i, src := range fuzzMarkers {
		objs, c := loadMark(f, src)
		ms[i] = marker{objs, c}
	}
	for _, fr := range fuzzFrames() {
		for pick := range ms {
			f.Add(fr, uint8(pick))
		}
	}
	f.Fuzz(func(t *testing.T, frame []byte, pick uint8) {
		m := ms[int(pick)%len(ms)]
		if !progrun.Accepts(m.objs.AltmarkMark, frame) {
			return
		}
		before := markCounts(t, m.objs)
		l := int64(m.c.Period)
		t0 := tai()
		r, err := progrun.Exec(m.objs.AltmarkMark, frame, 0)
		t1 := tai()
		if err != nil {
			t.Fatal(err)
		}
		after := markCounts(t, m.objs)
		d := func(i int) uint64 { return after[i] - before[i] }
		if int32(r.Ret) != -1 {
			t.Fatalf("verdict %d, want TCX_NEXT\n%x", int32(r.Ret), frame)
		}
		var reasons uint64
		for i := mFirstUnmarked; i < len(after); i++ {
			reasons += d(i)
		}
		if d(mSeen) != 1 || d(mMarked)+reasons != 1 {
			t.Fatalf("seen +%d, marked +%d, unmarked reasons +%d\n%x", d(mSeen), d(mMarked), reasons, frame)
		}
		if d(mMarked) == 0 {
			if !bytes.Equal(r.Out, frame) {
				t.Fatalf("an unmarked packet changed\nin:  %x\nout: %x", frame, r.Out)
			}
			return
		}
		color := -1 // unknown: the run straddled a color change
		if t0/l == t1/l {
			color = int((t0/l + int64(m.c.StartColor)) % 2)
		}
		if d(mColor0)+d(mColor1) != 1 || color >= 0 && d(mColor0+color) != 1 {
			t.Fatalf("color0 +%d, color1 +%d, the period's color %d", d(mColor0), d(mColor1), color)
		}
		if color < 0 {
			color = int(d(mColor1))
		}
		var why string
		switch m.c.Carrier {
		case carrierDSCP:
			why = checkDSCP(frame, r.Out, m.c.Spec(), color)
		case carrierIPv4Flag:
			why = checkIPv4Flag(frame, r.Out, color)
		default:
			why = checkAltMark(frame, r.Out, m.c, color, d(mInserted) == 1, d(mUpdated) == 1)
		}
		if why != "" {
			t.Fatalf("%s: %s\nin:  %x\nout: %x", m.c.Carrier, why, frame, r.Out)
		}
	})
}

func markCounts(t *testing.T, objs *markerObjects) []uint64 {
	t.Helper()
	c, err := stats.All(objs.MarkStats)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// diff lists the offsets where a and b differ (a and b of one length).
func diff(a, b []byte) []int {
	var at []int
	for i := range a {
		if a[i] != b[i] {
			at = append(at, i)
		}
	}
	return at
}

// fixedHeader is gopacket's reading of frame's fixed IP header, decoded alone: IPv4's 20 bytes
// with IHL and total length set to match, IPv6's 40 with no next header (the marker reads no
// IPv4 options and writes no IPv6 extension header here; gopacket would refuse malformed ones).
// For IPv4, sumOK says whether the header checksum over the whole header is right.
func fixedHeader(frame []byte) (ip4 *layers.IPv4, ip6 *layers.IPv6, l3 int, sumOK bool) {
	h := packet.ReadHeaders(frame)
	switch h.Family {
	case 4:
		hdr := bytes.Clone(frame[h.L3 : h.L3+20])
		hdr[0], hdr[2], hdr[3] = 0x45, 0, 20
		ip4 = &layers.IPv4{}
		if ip4.DecodeFromBytes(hdr, gopacket.NilDecodeFeedback) != nil {
			return nil, nil, h.L3, false
		}
		full := frame[h.L3:h.L4]
		return ip4, nil, h.L3, ipv4Checksum(full) == binary.BigEndian.Uint16(full[10:])
	case 6:
		hdr := bytes.Clone(frame[h.L3 : h.L3+40])
		hdr[6] = byte(layers.IPProtocolNoNextHeader)
		ip6 = &layers.IPv6{}
		if ip6.DecodeFromBytes(hdr, gopacket.NilDecodeFeedback) != nil {
			return nil, nil, h.L3, false
		}
		return nil, ip6, h.L3, false
	}
	return nil, nil, h.L3, false
}

// checkDSCP: only the ToS / traffic class byte (and the IPv4 checksum) changed, the color bit
// reads the color, the delay bit is clear (no double marking configured), the rest is as was.
func checkDSCP(in, out []byte, s MarkSpec, color int) string {
	if len(out) != len(in) {
		return fmt.Sprintf("length %d → %d", len(in), len(out))
	}
	ip4, ip6, l3, outSum := fixedHeader(out)
	changeable := []int{l3 + 1, l3 + 10, l3 + 11} // ToS, checksum
	var tos, was uint8
	switch {
	case ip4 != nil:
		if _, _, _, inSum := fixedHeader(in); inSum && !outSum {
			return "the IPv4 header checksum is wrong after marking"
		}
		tos, was = ip4.TOS, in[l3+1]
	case ip6 != nil:
		changeable = []int{l3, l3 + 1} // the traffic class's two halves
		tos, was = ip6.TrafficClass, uint8(binary.BigEndian.Uint16(in[l3:])>>4)
	default:
		return "gopacket finds no IP header"
	}
	for _, i := range diff(in, out) {
		if !slices.Contains(changeable, i) {
			return fmt.Sprintf("byte %d changed", i)
		}
	}
	if got := int(tos&s.ColorMask) / int(s.ColorMask); got != color {
		return fmt.Sprintf("color bit reads %d, want %d", got, color)
	}
	if tos&s.DelayMask != 0 {
		return "delay bit set"
	}
	if keep := ^(s.ColorMask | s.DelayMask); tos&keep != was&keep {
		return fmt.Sprintf("ToS %#x → %#x beyond the carrier bits", was, tos)
	}
	return ""
}

// checkIPv4Flag: only the flags (and the checksum) changed, the reserved flag reads the color.
func checkIPv4Flag(in, out []byte, color int) string {
	if len(out) != len(in) {
		return fmt.Sprintf("length %d → %d", len(in), len(out))
	}
	ip, _, l3, outSum := fixedHeader(out)
	if ip == nil {
		return "gopacket finds no IPv4 header"
	}
	for _, i := range diff(in, out) {
		if i != l3+6 && i != l3+10 && i != l3+11 {
			return fmt.Sprintf("byte %d changed", i)
		}
	}
	if got := int(ip.Flags&layers.IPv4EvilBit) >> 2; got != color {
		return fmt.Sprintf("reserved flag %d, want %d", got, color)
	}
	if (in[l3+6]^out[l3+6])&0x7f != 0 {
		return "flags or offset changed beyond the reserved flag"
	}
	if _, _, _, inSum := fixedHeader(in); inSum && !outSum {
		return "the IPv4 header checksum is wrong after marking"
	}
	return ""
}

// checkAltMark: gopacket reads the IPv6 header and the Hop-by-Hop or Destination Options
// header after it (or after a Hop-by-Hop header) holding the AltMark option, whose TLVs fill
// the header exactly; the option has the configured FlowMonID, L = color, D = 0. An inserted
// header (8 bytes, the configured kind) is first, takes the old next header, and adds 8 to the
// payload length; everything else is as it was.
func checkAltMark(in, out []byte, c *MarkConfig, color int, inserted, updated bool) string {
	p := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.DecodeOptions{NoCopy: true})
	ip6, ok := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	if !ok {
		return "gopacket finds no IPv6 header"
	}
	l3 := packet.ReadHeaders(out).L3
	in6 := layers.IPv6{}
	if err := in6.DecodeFromBytes(in[l3:], gopacket.NilDecodeFeedback); err != nil {
		return fmt.Sprintf("gopacket cannot read the input's IPv6 header: %v", err)
	}
	switch {
	case inserted == updated:
		return fmt.Sprintf("inserted %v, updated %v", inserted, updated)
	case inserted:
		if len(out) != len(in)+8 || int(ip6.Length) != int(in6.Length)+8 {
			return fmt.Sprintf("inserted: %d → %d bytes, payload length %d → %d", len(in), len(out), in6.Length, ip6.Length)
		}
		kind := layers.IPProtocolIPv6Destination
		if c.Header == "hop-by-hop" {
			kind = layers.IPProtocolIPv6HopByHop
		}
		ext := out[l3+40:]
		if ip6.NextHeader != kind || layers.IPProtocol(ext[0]) != in6.NextHeader || ext[1] != 0 {
			return fmt.Sprintf("header chain %v → %v (length %d), was %v", ip6.NextHeader, layers.IPProtocol(ext[0]), ext[1], in6.NextHeader)
		}
		if !bytes.Equal(out[l3+48:], in[l3+40:]) || !bytes.Equal(out[:l3+4], in[:l3+4]) || !bytes.Equal(out[l3+7:l3+40], in[l3+7:l3+40]) {
			return "bytes beyond the IPv6 header's length and next header changed"
		}
	default:
		if len(out) != len(in) {
			return fmt.Sprintf("updated: %d → %d bytes", len(in), len(out))
		}
	}
	// The option, read by gopacket where carrier.h looks: the first extension header, or
	// Destination Options right after Hop-by-Hop.
	var opts []*layers.IPv6HopByHopOption
	var hdr []byte
	if h, ok := p.Layer(layers.LayerTypeIPv6HopByHop).(*layers.IPv6HopByHop); ok && hasAltMark(h.Options) {
		opts, hdr = h.Options, h.Contents
	} else if d, ok := p.Layer(layers.LayerTypeIPv6Destination).(*layers.IPv6Destination); ok {
		for _, o := range d.Options {
			opts = append(opts, (*layers.IPv6HopByHopOption)(o))
		}
		hdr = d.Contents
	}
	if !hasAltMark(opts) {
		return "gopacket finds no AltMark option"
	}
	if why := tlvLayout(hdr); why != "" {
		return why
	}
	for _, o := range opts {
		if o.OptionType != 0x12 {
			continue
		}
		w := binary.BigEndian.Uint32(o.OptionData)
		if id := w >> 12; id != *c.FlowMonID || int(w>>11&1) != color || w>>10&1 != 0 {
			return fmt.Sprintf("AltMark reads FlowMonID %#x L %d D %d, want %#x L %d D 0", id, w>>11&1, w>>10&1, *c.FlowMonID, color)
		}
	}
	if updated {
		at := diff(in, out)
		if len(at) > 0 && at[len(at)-1]-at[0] >= 4 {
			return fmt.Sprintf("bytes %v changed: more than the option's data", at)
		}
	}
	return ""
}

func hasAltMark(opts []*layers.IPv6HopByHopOption) bool {
	return slices.ContainsFunc(opts, func(o *layers.IPv6HopByHopOption) bool {
		return o.OptionType == 0x12 && o.OptionLength == 4 && len(o.OptionData) == 4
	})
}

// tlvLayout walks the options of a Hop-by-Hop or Destination Options header (RFC 8200 4.2):
// Pad1 is one byte, every other option type, length, data; they must end where the header does.
func tlvLayout(hdr []byte) string {
	if len(hdr) < 2 || len(hdr) != (int(hdr[1])+1)*8 {
		return fmt.Sprintf("extension header of %d bytes, length field %d", len(hdr), hdr[1])
	}
	i := 2
	for i < len(hdr) {
		if hdr[i] == 0 {
			i++
			continue
		}
		if i+2 > len(hdr) || i+2+int(hdr[i+1]) > len(hdr) {
			return fmt.Sprintf("option at %d overruns its header", i)
		}
		i += 2 + int(hdr[i+1])
	}
	return ""
}
