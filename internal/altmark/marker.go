package altmark

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
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
	Flows    int               `json:"flows"` // flows in the per-flow table
	Counters map[string]uint64 `json:"counters"`
}

// markCounterNames are the enum mark_reason names as status shows them, in enum order.
var markCounterNames = []string{"seen", "color0", "color1", "double", "inserted", "updated", "flow_full",
	"marked", "not_ip", "not_selected", "backbone", "wrong_family", "malformed", "too_big", "no_position", "adjust_failed"}

func carrierCode(s string) markerMarkCarrier {
	switch s {
	case carrierIPv4Flag:
		return markerMarkCarrierMARK_CARRIER_IPV4FLAG
	case carrierIPv6AltMrk:
		return markerMarkCarrierMARK_CARRIER_IPV6ALTMARK
	}
	return markerMarkCarrierMARK_CARRIER_DSCP
}

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
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

// openMarker loads the marker with s's constants and prefixes (nothing attached).
func openMarker(s MarkSpec) (*markerObjects, error) {
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
		"sport_lo": s.SrcPorts.Lo, "sport_hi": s.SrcPorts.Hi, "dport_lo": s.DstPorts.Lo, "dport_hi": s.DstPorts.Hi,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	objs := &markerObjects{}
	if err := spec.LoadAndAssign(objs, nil); err != nil {
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
