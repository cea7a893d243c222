package altmark

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/match"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/stats"
)

// markSubsystem names the marker's pins (/sys/fs/bpf/flowplane/altmark-mark/<netns>/<dev>/)
// and records (/run/flowplane/altmark-mark/<netns>-<dev>.json); the probe keeps its own.
const markSubsystem = "altmark-mark"

// MarkRecord is what `altmark mark` leaves for status and remove.
type MarkRecord struct {
	Dev    string     `json:"dev"`
	Netns  string     `json:"netns"`
	Config MarkConfig `json:"config"`
}

// MarkStatus is one marker and its counters.
type MarkStatus struct {
	MarkRecord
	// Leftover says why this marker is listed though it is not whole: what a crash left, which
	// the next mark apply or remove on the device cleans (internal/attach). Only Dev is set.
	Leftover string            `json:"leftover,omitempty"`
	Flows    int               `json:"flows"` // flows in the per-flow table
	Counters map[string]uint64 `json:"counters"`
}

// markCounterNames are the enum mark_reason names as status shows them, in enum order.
var markCounterNames = []string{"seen", "color0", "color1", "double", "inserted", "updated", "flow_full",
	"marked", "not_ip", "not_selected", "backbone", "wrong_family", "malformed", "too_big", "no_position", "adjust_failed"}

func carrierCode(s string) markerAmCarrier {
	switch s {
	case carrierIPv4Flag:
		return markerAmCarrierAM_CARRIER_IPV4FLAG
	case carrierIPv6AltMrk:
		return markerAmCarrierAM_CARRIER_IPV6ALTMARK
	}
	return markerAmCarrierAM_CARRIER_DSCP
}

// lpmKey is p as the marker's LPM tries hold it: IPv4 as IPv4-mapped IPv6.
func lpmKey(p netip.Prefix) markerMarkLpmKey {
	a, bits := p.Addr(), p.Bits()
	if a.Is4() {
		a = netip.AddrFrom16(a.As16())
		bits += 96
	}
	return markerMarkLpmKey{Prefixlen: uint32(bits), Addr: a.As16()}
}

// openMarker loads the marker with s's constants and prefixes (nothing attached), on the
// counters pinned in dir if there are any (dir "": fresh ones).
func openMarker(s MarkSpec, dir string) (*markerObjects, error) {
	spec, err := loadMarker()
	if err != nil {
		return nil, fmt.Errorf("load marker spec: %w", err)
	}
	var protos [8]uint32
	for _, p := range s.Protocols {
		protos[p/32] |= 1 << (p % 32)
	}
	for name, v := range map[string]any{
		"period_ns": s.PeriodNs, "start_color": s.StartColor, "carrier": uint32(carrierCode(s.Carrier)),
		"color_mask": s.ColorMask, "delay_mask": s.DelayMask, "hop_by_hop": boolU32(s.HopByHop),
		"mtu": s.MTU, "flowmon_id": s.FlowMonID, "per_flow_id": boolU32(s.PerFlow),
		"flowmon_first": s.FlowMonFirst, "flowmon_count": max(s.FlowMonCount, 1),
		"double_packets": s.DoublePackets, "any_proto": boolU32(len(s.Protocols) == 0), "proto_mask": protos,
		"sel_src": boolU32(len(s.Src) > 0), "sel_dst": boolU32(len(s.Dst) > 0), "sel_backbone": boolU32(len(s.Backbone) > 0),
		"sel_ports": boolU32(s.SrcPorts != match.AnyPort || s.DstPorts != match.AnyPort),
		"sport_lo":  s.SrcPorts.Lo, "sport_hi": s.SrcPorts.Hi, "dport_lo": s.DstPorts.Lo, "dport_hi": s.DstPorts.Hi,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	objs := &markerObjects{}
	if err := attach.Load(spec, objs, dir, map[string]string{"stats": "mark_stats"}); err != nil {
		return nil, fmt.Errorf("load marker: %w", err)
	}
	for _, l := range []struct {
		m  *ebpf.Map
		ps []netip.Prefix
	}{{objs.MarkSrc, s.Src}, {objs.MarkDst, s.Dst}, {objs.MarkBackbone, s.Backbone}} {
		for _, p := range l.ps {
			if err := l.m.Update(lpmKey(p), uint8(1), ebpf.UpdateAny); err != nil {
				objs.Close()
				return nil, fmt.Errorf("add prefix %s: %w", p, err)
			}
		}
	}
	return objs, nil
}

func markPin(ns, dev string) []string      { return []string{markSubsystem, ns, dev} }
func markRecordName(ns, dev string) string { return ns + "-" + dev }

// markInstance is a marker as internal/attach knows it.
func markInstance(ns, dev string) attach.Instance {
	return attach.Instance{Pin: markPin(ns, dev), What: fmt.Sprintf("marker on %s in this network namespace", dev)}
}

// CheckMarkDevice returns dev's index, or a usage-grade error: no such interface.
func CheckMarkDevice(dev string) (int, error) {
	ifc, err := net.InterfaceByName(dev)
	if err != nil {
		return 0, fmt.Errorf("interface %q: no such network interface in this network namespace", dev)
	}
	return ifc.Index, nil
}

// Mark loads the marker for c and attaches it at the head of dev's tcx egress (before a probe
// on the same device, which then counts the colored packet), pinning link and maps per
// network namespace and device (ApplyMark).
func Mark(dev string, c *MarkConfig) error {
	_, err := ApplyMark(dev, c)
	return err
}

// ApplyMark is Mark, saying whether it replaced a marker already on dev and what a crash had
// left that it cleaned first. A replacement swaps the program in place with link.Update, at
// the same place in the egress chain: every packet is marked by the old marker or the new
// one, the counters carry on and the flow table starts afresh. If the new marker fails to load
// or attach, the old one stays. Anything that fails undoes what came before it.
func ApplyMark(dev string, c *MarkConfig) (attach.Result, error) {
	idx, err := CheckMarkDevice(dev)
	if err != nil {
		return attach.Result{}, err
	}
	ns, err := attach.ThisNetns()
	if err != nil {
		return attach.Result{}, err
	}
	in := markInstance(ns, dev)
	return in.Apply(func(bool) (*attach.Spec, error) {
		objs, err := openMarker(c.Spec(), in.Dir())
		if err != nil {
			return nil, err
		}
		return &attach.Spec{
			Objects: objs,
			Links:   []attach.Link{{Name: "link", Hook: attach.TCXEgress(idx).AtHead(), Program: objs.AltmarkMark}},
			Maps:    map[string]*ebpf.Map{"stats": objs.MarkStats, "flows": objs.MarkFlows},
			Record:  &MarkRecord{Dev: dev, Netns: ns, Config: *c},
		}, nil
	})
}

// RemoveMark detaches the marker from dev in this network namespace; an error matching
// os.ErrNotExist if there is none.
func RemoveMark(dev string) error {
	_, err := removeMark(dev)
	return err
}

func removeMark(dev string) (attach.Result, error) {
	ns, err := attach.ThisNetns()
	if err != nil {
		return attach.Result{}, err
	}
	return markInstance(ns, dev).Remove()
}

// ReadMarkStatus reads every marker of this network namespace.
func ReadMarkStatus() ([]MarkStatus, error) {
	ns, err := attach.ThisNetns()
	if err != nil {
		return nil, err
	}
	out := []MarkStatus{}
	err = runstate.Each(markSubsystem, func(n string) error {
		dev, ok := strings.CutPrefix(n, ns+"-")
		if !ok {
			return nil
		}
		st, err := readMarker(ns, n)
		if err != nil {
			if p, lerr := markInstance(ns, dev).Leftover(); lerr == nil && p != nil {
				return nil // listed with the leftovers below
			}
			return err
		}
		out = append(out, *st)
		return nil
	})
	if err != nil {
		return nil, err
	}
	left, err := attach.Leftovers(markSubsystem, func(n string) (attach.Instance, bool) {
		dev, ok := strings.CutPrefix(n, ns+"-")
		return markInstance(ns, dev), ok
	})
	if err != nil {
		return nil, err
	}
	for _, p := range left {
		out = append(out, MarkStatus{MarkRecord: MarkRecord{Dev: p.Pin[len(p.Pin)-1], Netns: ns}, Leftover: p.Why})
	}
	return out, nil
}

// readMarker reads the marker of record n.
func readMarker(ns, n string) (*MarkStatus, error) {
	var st MarkStatus
	if err := runstate.Load(markSubsystem, n, &st.MarkRecord); err != nil {
		return nil, err
	}
	st.Config.Period = Duration(time.Duration(st.Config.PeriodMs) * time.Millisecond)
	dir := pin.Path(markPin(ns, st.Dev)...)
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "stats"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("marker on %s: open counters: %w", st.Dev, err)
	}
	st.Counters, err = markCounters(m)
	m.Close()
	if err != nil {
		return nil, err
	}
	if fm, err := ebpf.LoadPinnedMap(filepath.Join(dir, "flows"), &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
		var k markerMarkFlowKey
		it := fm.Iterate()
		for it.Next(&k, new(markerMarkFlow)) {
			st.Flows++
		}
		fm.Close()
	}
	return &st, nil
}

// markCounters sums the per-CPU counters of a marker's stats map by name.
func markCounters(m *ebpf.Map) (map[string]uint64, error) {
	c := make(map[string]uint64, len(markCounterNames))
	for i, name := range markCounterNames {
		n, err := stats.Sum(m, uint32(i))
		if err != nil {
			return nil, err
		}
		c[name] = n
	}
	return c, nil
}

// MarkerProgram is a loaded marker that is not attached (benchmarks run it with
// BPF_PROG_TEST_RUN).
type MarkerProgram struct {
	Prog *ebpf.Program
	objs *markerObjects
}

// LoadMarkerProgram loads the marker for c without attaching it.
func LoadMarkerProgram(c *MarkConfig) (*MarkerProgram, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	objs, err := openMarker(c.Spec(), "")
	if err != nil {
		return nil, err
	}
	return &MarkerProgram{Prog: objs.AltmarkMark, objs: objs}, nil
}

// Close frees the program and its maps.
func (m *MarkerProgram) Close() error { return m.objs.Close() }
