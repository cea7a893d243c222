package altmark

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/stats"
)

// The kernel side of the probe: bpf/altmark/probe.bpf.c on tcx ingress and egress, and the read
// rule's Read (docs/altmark.md).

// carrierCodes are enum am_carrier.
var carrierCodes = map[string]uint32{
	carrierDSCP:       uint32(probeAmCarrierAM_CARRIER_DSCP),
	carrierIPv4Flag:   uint32(probeAmCarrierAM_CARRIER_IPV4FLAG),
	carrierIPv6AltMrk: uint32(probeAmCarrierAM_CARRIER_IPV6ALTMARK),
}

// sampleSize is struct am_sample's size in the ring.
var sampleSize = binary.Size(probeAmSample{})

// kpoint is a measurement point resolved to its interface index.
type kpoint struct {
	Point
	ifindex uint32
	dir     uint8 // enum am_dir
}

type pointID struct {
	ifindex uint32
	dir     uint8
}

// Probe is the loaded probe program and its maps; after Attach, on its interfaces too. It is
// the Datapath OpenProbe returns.
type Probe struct {
	spec     ProbeSpec
	objs     probeObjects
	points   []kpoint
	byID     map[pointID]int
	rings    [2]*ringbuf.Reader
	links    []link.Link
	log      *slog.Logger
	mu       sync.Mutex
	lastLost uint64 // AM_STAT_SAMPLE_LOST + AM_STAT_TABLE_FULL at the last read
}

// OpenProbe loads the probe for s and attaches it to every point: the Datapath of the loop.
func OpenProbe(s ProbeSpec) (Datapath, error) {
	p, err := LoadProbe(s, true)
	if err != nil {
		return nil, err
	}
	if err := p.Attach(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// LoadProbe loads the probe program for s without attaching it (tests and benchmarks run it
// with BPF_PROG_TEST_RUN: their packets come from the loopback device, ifindex 1). With
// sampling false it only counts.
func LoadProbe(s ProbeSpec, sampling bool) (*Probe, error) {
	code, ok := carrierCodes[s.Carrier]
	if !ok {
		return nil, fmt.Errorf("altmark probe: unknown carrier %q", s.Carrier)
	}
	if s.HashBits < 0 || s.HashBits > 32 || s.NMax < 1 || s.PeriodNs <= 0 {
		return nil, fmt.Errorf("altmark probe: hash_bits %d, nmax %d, period %d ns out of range", s.HashBits, s.NMax, s.PeriodNs)
	}
	p := &Probe{spec: s, byID: map[pointID]int{}, log: slog.Default()}
	for _, pt := range s.Points {
		ifc, err := net.InterfaceByName(pt.Ifname)
		if err != nil {
			return nil, fmt.Errorf("altmark probe: interface %q: %w", pt.Ifname, err)
		}
		kp := kpoint{Point: pt, ifindex: uint32(ifc.Index)}
		switch pt.Direction {
		case "in":
			kp.dir = uint8(probeAmDirAM_DIR_IN)
		case "out":
			kp.dir = uint8(probeAmDirAM_DIR_OUT)
		default:
			return nil, fmt.Errorf("altmark probe: %s: direction %q: want in or out", pt.Ifname, pt.Direction)
		}
		id := pointID{kp.ifindex, kp.dir}
		if _, dup := p.byID[id]; dup {
			continue
		}
		p.byID[id] = len(p.points)
		p.points = append(p.points, kp)
	}
	if len(p.points) > int(probeAmLimitAM_MAX_POINTS) {
		return nil, fmt.Errorf("altmark probe: %d points, at most %d", len(p.points), probeAmLimitAM_MAX_POINTS)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("altmark probe: remove memlock limit: %w", err)
	}
	spec, err := loadProbe()
	if err != nil {
		return nil, fmt.Errorf("altmark probe: load spec: %w", err)
	}
	var mask [8]uint32
	for _, proto := range s.Protocols {
		mask[proto/32] |= 1 << (proto % 32)
	}
	startMask := uint32(1<<s.HashBits - 1)
	vars := map[string]any{
		"carrier": code, "color_bit": uint32(s.DSCPBits[0]), "delay_bit": uint32(s.DSCPBits[1]),
		"hash_ref": s.HashRef, "start_mask": startMask, "nmax": uint32(s.NMax),
		"sampling": boolU32(sampling), "proto_filter": boolU32(len(s.Protocols) > 0), "proto_mask": mask,
		"backbone": boolU32(len(s.Backbone) > 0), "period_ns": uint64(s.PeriodNs), "start_color": uint32(s.StartColor),
	}
	for name, v := range vars {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("altmark probe: set %s: %w", name, err)
		}
	}
	ringSize := ringBytes(s.NMax, len(p.points))
	spec.Maps["am_samples0"].MaxEntries = ringSize
	spec.Maps["am_samples1"].MaxEntries = ringSize
	if err := spec.LoadAndAssign(&p.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("altmark probe: load: %+v", ve)
		}
		return nil, fmt.Errorf("altmark probe: load: %w", err)
	}
	if err := p.init(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// ringBytes sizes one color's sample ring: room for 4·NMAX samples per point (a period keeps
// NMAX/2 to NMAX, plus the ones the growing hash length drops at read-out), a power of two
// between 64 KiB and 64 MiB. A full ring is counted (AM_STAT_SAMPLE_LOST) and logged.
func ringBytes(nmax, points int) uint32 {
	need := 4 * nmax * max(points, 1) * (sampleSize + 8)
	size := uint32(64 << 10)
	for int(size) < need && size < 64<<20 {
		size <<= 1
	}
	return size
}

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// init sets every point's hash length, the points' counter slots, the backbone prefixes and
// the ring readers.
func (p *Probe) init() error {
	slots := map[uint32]*probeAmIfslots{}
	for i, kp := range p.points {
		if kp.ifindex >= uint32(probeAmLimitAM_IFINDEX_MAX) {
			continue // counted in am_counts by (ifindex, direction)
		}
		if slots[kp.ifindex] == nil {
			slots[kp.ifindex] = &probeAmIfslots{}
		}
		slots[kp.ifindex].Slot[kp.dir] = uint32(i) + 1
	}
	for ifindex, v := range slots {
		if err := p.objs.AmIfslots.Update(&ifindex, v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("altmark probe: point slots of ifindex %d: %w", ifindex, err)
		}
	}
	for c := range 2 {
		if err := p.resetColor(uint8(c)); err != nil {
			return err
		}
	}
	for _, pfx := range p.spec.Backbone {
		if !pfx.Addr().Is4() {
			return fmt.Errorf("altmark probe: backbone %s: IPv4 prefixes only", pfx)
		}
		a := pfx.Masked().Addr().As4()
		key := probeAmLpmKey{Prefixlen: uint32(pfx.Bits()), Addr: binary.NativeEndian.Uint32(a[:])}
		if err := p.objs.AmBackbone.Update(&key, uint8(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("altmark probe: backbone %s: %w", pfx, err)
		}
	}
	for c, m := range []*ebpf.Map{p.objs.AmSamples0, p.objs.AmSamples1} {
		rd, err := ringbuf.NewReader(m)
		if err != nil {
			return fmt.Errorf("altmark probe: sample ring %d: %w", c, err)
		}
		p.rings[c] = rd
	}
	return nil
}

// resetColor puts every point's hash length state of color c back to the start.
func (p *Probe) resetColor(c uint8) error {
	for _, kp := range p.points {
		key := probeAmPointKey{Ifindex: kp.ifindex, Dir: kp.dir, Color: c}
		val := probeAmPoint{Bits: uint32(p.spec.HashBits)}
		if err := p.objs.AmPoints.Update(&key, &val, ebpf.UpdateLock); err != nil {
			if err := p.objs.AmPoints.Update(&key, &val, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("altmark probe: reset %s %s color %d: %w", kp.Ifname, kp.Direction, c, err)
			}
		}
	}
	return nil
}

// Programs are the ingress and egress programs.
func (p *Probe) Programs() (in, out *ebpf.Program) {
	return p.objs.AltmarkProbeIn, p.objs.AltmarkProbeOut
}

// Attach attaches the probe to every point (tcx ingress for in, egress for out). On error
// nothing stays attached.
func (p *Probe) Attach() error {
	for _, kp := range p.points {
		prog, hook := p.objs.AltmarkProbeIn, attach.TCXIngress(int(kp.ifindex))
		if kp.Direction == "out" {
			prog, hook = p.objs.AltmarkProbeOut, attach.TCXEgress(int(kp.ifindex))
		}
		l, err := attach.Attach(hook, prog)
		if err != nil {
			for _, l := range p.links {
				l.Close()
			}
			p.links = nil
			return fmt.Errorf("altmark probe: attach to %s %s: %w", kp.Ifname, kp.Direction, err)
		}
		p.links = append(p.links, l)
	}
	return nil
}

// Close detaches the programs and frees the maps.
func (p *Probe) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, l := range p.links {
		errs = append(errs, l.Close())
	}
	p.links = nil
	for i, r := range p.rings {
		if r != nil {
			errs = append(errs, r.Close())
			p.rings[i] = nil
		}
	}
	errs = append(errs, p.objs.Close())
	return errors.Join(errs...)
}

// StatNames name enum am_stat's values, in order (a test checks the count).
var StatNames = []string{"seen", "counted", "not_ip", "unmarked", "filtered", "backbone", "no_point",
	"mal_l2", "mal_ipv4", "mal_ipv6", "mal_ext", "mal_opt", "mal_l4", "table_full", "sampled", "sample_lost", "hash_grown", "gso"}

// Stats are the probe's per-CPU statistics summed, by StatNames.
func (p *Probe) Stats() (map[string]uint64, error) {
	all, err := stats.All(p.objs.AmStats)
	if err != nil {
		return nil, fmt.Errorf("altmark probe stats: %w", err)
	}
	m := map[string]uint64{}
	for i, v := range all {
		if i < len(StatNames) {
			m[StatNames[i]] = v
		}
	}
	return m, nil
}

type rowKey struct {
	point   int
	flowmon uint32
}

// Read returns period n's counters and samples (n's color, (n + start_color) mod 2) and zeroes
// that color: counters, hash lengths, samples (docs/altmark.md, read rule).
func (p *Probe) Read(n int64) ([]Counter, []Sample, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	color := uint8((n + int64(p.spec.StartColor)) & 1)

	// The final hash length of each point in this period.
	final := make([]uint32, len(p.points))
	for i, kp := range p.points {
		var st probeAmPoint
		key := probeAmPointKey{Ifindex: kp.ifindex, Dir: kp.dir, Color: color}
		if err := p.objs.AmPoints.Lookup(&key, &st); err != nil {
			return nil, nil, fmt.Errorf("altmark probe: hash length of %s %s: %w", kp.Ifname, kp.Direction, err)
		}
		final[i] = st.Bits
	}

	rows, malformed, err := p.readCounts(color)
	if err != nil {
		return nil, nil, err
	}
	samples, err := p.drain(color, final)
	if err != nil {
		return nil, nil, err
	}
	if err := p.resetColor(color); err != nil {
		return nil, nil, err
	}

	var out []Counter
	seen := make([]bool, len(p.points))
	for k, c := range rows {
		kp := p.points[k.point]
		c.Ifname, c.Ifindex, c.Direction = kp.Ifname, int32(kp.ifindex), kp.Direction
		c.HashBits = int32(final[k.point])
		if k.flowmon == uint32(probeAmLimitAM_FLOWMON_NONE) {
			c.FlowMonID = -1
			c.Malformed = int64(malformed[k.point])
			seen[k.point] = true
		} else {
			c.FlowMonID = int64(k.flowmon)
		}
		out = append(out, *c)
	}
	for i, kp := range p.points {
		if seen[i] {
			continue
		}
		out = append(out, Counter{Ifname: kp.Ifname, Ifindex: int32(kp.ifindex), Direction: kp.Direction, FlowMonID: -1,
			HashBits: int32(final[i]), Malformed: int64(malformed[i])})
	}
	p.warnLosses()
	return out, samples, nil
}

// readCounts sums and deletes the counters of color c: rows per (point, FlowMonID) and the
// malformed packets per point.
func (p *Probe) readCounts(c uint8) (map[rowKey]*Counter, []uint64, error) {
	type acc struct {
		packets, bytes, first, last uint64
		sumHi, sumLo                uint64
	}
	accs := map[rowKey]*acc{}
	// add sums a counter's per-CPU values into its row.
	add := func(rk rowKey, vals []probeAmCount) {
		a := accs[rk]
		if a == nil {
			a = &acc{}
			accs[rk] = a
		}
		for _, v := range vals {
			if v.Packets == 0 {
				continue
			}
			if a.packets == 0 || v.FirstNs < a.first {
				a.first = v.FirstNs
			}
			a.last = max(a.last, v.LastNs)
			a.packets += v.Packets
			a.bytes += v.Bytes
			var carry uint64
			a.sumLo, carry = bits.Add64(a.sumLo, v.SumNsLo, 0)
			a.sumHi += v.SumNsHi + carry
		}
	}
	malformed := make([]uint64, len(p.points))
	var keys []probeAmCountKey
	var key probeAmCountKey
	var vals []probeAmCount
	it := p.objs.AmCounts.Iterate()
	for it.Next(&key, &vals) {
		if key.Color != c {
			continue
		}
		keys = append(keys, key)
		i, ok := p.byID[pointID{key.Ifindex, key.Dir}]
		if !ok {
			continue // not ours (cannot happen: only our points are attached)
		}
		if key.Kind == uint8(probeAmKindAM_KIND_MALFORMED) {
			for _, v := range vals {
				malformed[i] += v.Packets
			}
			continue
		}
		add(rowKey{i, key.Flowmon}, vals)
	}
	if err := it.Err(); err != nil {
		return nil, nil, fmt.Errorf("altmark probe: read counters: %w", err)
	}
	// The points' own counters (carriers without FlowMonID): sum, then zero.
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, nil, fmt.Errorf("altmark probe: %w", err)
	}
	zeros := make([]probeAmCount, cpus)
	for i := range p.points {
		idx := uint32(2*i) + uint32(c)
		if err := p.objs.AmPointCounts.Lookup(&idx, &vals); err != nil {
			return nil, nil, fmt.Errorf("altmark probe: read counters: %w", err)
		}
		if slices.ContainsFunc(vals, func(v probeAmCount) bool { return v.Packets > 0 }) {
			add(rowKey{i, uint32(probeAmLimitAM_FLOWMON_NONE)}, vals)
		}
		if err := p.objs.AmPointCounts.Update(&idx, zeros, ebpf.UpdateExist); err != nil {
			return nil, nil, fmt.Errorf("altmark probe: zero counters: %w", err)
		}
	}
	for i := range keys {
		if err := p.objs.AmCounts.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, nil, fmt.Errorf("altmark probe: zero counters: %w", err)
		}
	}
	rows := map[rowKey]*Counter{}
	for k, a := range accs {
		c := &Counter{Packets: int64(a.packets), Bytes: int64(a.bytes)}
		if a.packets > 0 {
			c.FirstTAINs, c.LastTAINs = int64(a.first), int64(a.last)
			if a.sumHi < a.packets {
				mean, _ := bits.Div64(a.sumHi, a.sumLo, a.packets)
				c.MeanTAINs = int64(mean)
			}
		}
		rows[k] = c
	}
	return rows, malformed, nil
}

// drain reads every sample in color c's ring and keeps those matching their point's final hash
// length.
func (p *Probe) drain(c uint8, final []uint32) ([]Sample, error) {
	rd := p.rings[c]
	rd.SetDeadline(time.Now()) // return what is there, then ErrDeadlineExceeded
	var out []Sample
	var rec ringbuf.Record
	var s probeAmSample
	for {
		err := rd.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("altmark probe: read samples: %w", err)
		}
		if len(rec.RawSample) < sampleSize {
			continue
		}
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &s); err != nil {
			return nil, fmt.Errorf("altmark probe: decode sample: %w", err)
		}
		i, ok := p.byID[pointID{s.Ifindex, s.Dir}]
		if !ok || uint32(s.Match) < final[i] {
			continue
		}
		kp := p.points[i]
		fm := int64(-1)
		if s.Flowmon != uint32(probeAmLimitAM_FLOWMON_NONE) {
			fm = int64(s.Flowmon)
		}
		out = append(out, Sample{Ifname: kp.Ifname, Direction: kp.Direction, FlowMonID: fm, Color: int32(s.Color),
			Hash: int64(s.Hash), TAINs: int64(s.TaiNs), SrcAddr: addrString(s.Saddr), DstAddr: addrString(s.Daddr),
			Proto: int32(s.Proto), SrcPort: int32(s.Sport), DstPort: int32(s.Dport), Length: int32(s.Length)})
	}
	return out, nil
}

// addrString is the text form of an address as the probe stores it (IPv4 mapped into IPv6).
func addrString(a [16]byte) string {
	return netip.AddrFrom16(a).Unmap().String()
}

// warnLosses logs when samples found a full ring or packets a full counter table since the
// last read: the kernel counts both (Stats); this makes sure they are not silent.
func (p *Probe) warnLosses() {
	st, err := p.Stats()
	if err != nil {
		return
	}
	lost := st["sample_lost"] + st["table_full"]
	if lost > p.lastLost {
		p.log.Warn("altmark probe: samples or counts lost since the last read (full sample ring or counter table)",
			"samples_lost_total", st["sample_lost"], "uncounted_total", st["table_full"])
	}
	p.lastLost = lost
}
