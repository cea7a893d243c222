package altmark

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/flowplane/flowplane/internal/config"
	"github.com/flowplane/flowplane/internal/match"
)

// MarkConfig is the marker's configuration file (`altmark mark apply --config`). ParseMarkConfig
// validates it; Spec turns it into what the BPF program needs.
type MarkConfig struct {
	File       string         `json:"file"`
	Period     Duration       `json:"-"`
	PeriodMs   int64          `json:"period_ms"` // Period in records (Duration has no UnmarshalJSON)
	StartColor int            `json:"start_color"`
	Carrier    string         `json:"carrier"`
	DSCPBits   []int          `json:"dscp_bits,omitempty"`  // dscp: color bit, delay bit (0-5)
	Header     string         `json:"header,omitempty"`     // ipv6-altmark: destination or hop-by-hop
	FlowMonID  *uint32        `json:"flowmon_id,omitempty"` // ipv6-altmark: fixed ID; nil = per flow
	FlowMonMin uint32         `json:"flowmon_first,omitempty"`
	FlowMonMax uint32         `json:"flowmon_last,omitempty"`
	Double     int            `json:"double_packets"` // per flow and period; 0 = off
	Select     MarkSelect     `json:"select"`
	Backbone   []netip.Prefix `json:"backbone,omitempty"`
	MTU        int            `json:"mtu,omitempty"` // ipv6-altmark: 0 = the device's
	Warnings   []string       `json:"-"`
	ports      [2]match.PortRange
	protos     []uint8
	raw        map[string]bool // keys given
}

// MarkSelect is the traffic the marker colors; empty lists select everything.
type MarkSelect struct {
	Src       []netip.Prefix `json:"src,omitempty"`
	Dst       []netip.Prefix `json:"dst,omitempty"`
	Protocols []string       `json:"protocols,omitempty"`
	SrcPort   string         `json:"src_port,omitempty"`
	DstPort   string         `json:"dst_port,omitempty"`
}

const (
	headerDest      = "destination"
	headerHBH       = "hop-by-hop"
	flowmonMax      = 1<<20 - 1
	minMTU          = 1280 // RFC 8200 §5
	maxMTU          = 65535
	maxDouble       = 1 << 16
	maxMarkPrefixes = 256 // the LPM tries' size in marker.bpf.c
	warnPeriod      = 100 * time.Millisecond
)

// The keys each mapping of a marker configuration accepts: the decoder checks files against
// these lists, and docs_test.go holds docs/altmark.md's configuration reference to them.
var (
	markKeys   = []string{"period", "start_color", "carrier", "dscp_bits", "header", "flowmon_id", "flowmon_range", "double", "select", "backbone", "mtu"}
	doubleKeys = []string{"packets"}
	selectKeys = []string{"src", "dst", "protocols", "src_port", "dst_port"}
)

// ParseMarkConfig reads and validates a marker configuration. The error is config.Errors naming
// every bad field with its line; warnings (a short period) are in Warnings.
func ParseMarkConfig(file string, data []byte) (*MarkConfig, error) {
	el := &config.Collector{File: file}
	c := decodeMarkConfig(el, data)
	if err := el.Err(); err != nil {
		return nil, err
	}
	c.File = file
	c.Warnings = el.Warnings
	return c, nil
}

// LoadMarkConfig reads and validates the file at path.
func LoadMarkConfig(path string) (*MarkConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, config.Errors{{File: path, Msg: fmt.Sprintf("cannot read: %v", err)}}
	}
	return ParseMarkConfig(path, data)
}

func decodeMarkConfig(el *config.Collector, data []byte) *MarkConfig {
	root := el.Root(data, "a marker needs at least carrier (see docs/altmark.md, Marker configuration)")
	if root == nil {
		return nil
	}
	c := &MarkConfig{Period: Duration(defaultPeriod), PeriodMs: defaultPeriod.Milliseconds(), FlowMonMin: 1, FlowMonMax: flowmonMax, ports: [2]match.PortRange{match.AnyPort, match.AnyPort}, raw: map[string]bool{}}
	d := &dec{el: el}
	el.EachKey(root, "", markKeys, func(key string, v *yaml.Node) {
		c.raw[key] = true
		switch key {
		case "period":
			if dur, ok := decodePeriod(d, v, key); ok {
				c.Period = Duration(dur)
				c.PeriodMs = dur.Milliseconds()
			}
		case "start_color":
			if n, ok := d.integer(v, key, 0, 1); ok {
				c.StartColor = int(n)
			}
		case "carrier":
			c.Carrier = decodeCarrier(d, v, key)
		case "dscp_bits":
			c.DSCPBits = decodeDSCPBits(d, v)
		case "header":
			if s, ok := el.Scalar(v, key); ok {
				if s != headerDest && s != headerHBH {
					el.Add(v.Line, key, "%q: want destination (a Destination Options header, the default) or hop-by-hop", s)
				}
				c.Header = s
			}
		case "flowmon_id":
			if s, ok := el.Scalar(v, key); ok && s != "per-flow" {
				if n, ok := d.integer(v, key, 0, flowmonMax); ok {
					id := uint32(n)
					c.FlowMonID = &id
				}
			}
		case "flowmon_range":
			if s, ok := el.Scalar(v, key); ok {
				lo, hi, err := parseRange(s)
				if err != nil {
					el.Add(v.Line, key, "%v", err)
				} else {
					c.FlowMonMin, c.FlowMonMax = lo, hi
				}
			}
		case "double":
			el.EachKey(v, key, doubleKeys, func(k string, kv *yaml.Node) {
				if n, ok := d.integer(kv, "double.packets", 1, maxDouble); ok {
					c.Double = int(n)
				}
			})
			if v.Kind == yaml.MappingNode && !config.HasKey(v, "packets") || v.Tag == "!!null" {
				el.Add(v.Line, "double.packets", "missing; how many packets per flow and period get the delay mark, e.g. double: {packets: 4}")
			}
		case "select":
			decodeSelect(d, v, c)
		case "backbone":
			c.Backbone = match.Prefixes(el, v, key)
			for _, p := range c.Backbone {
				if !p.Addr().Is4() {
					el.Add(v.Line, key, "%s is not an IPv4 prefix (the ipv4-flag carrier is IPv4 only)", p)
				}
			}
			if len(c.Backbone) > maxMarkPrefixes {
				el.Add(v.Line, key, "%d prefixes; at most %d", len(c.Backbone), maxMarkPrefixes)
			}
		case "mtu":
			if n, ok := d.integer(v, key, minMTU, maxMTU); ok {
				c.MTU = int(n)
			}
		}
	})
	if root.Kind != yaml.MappingNode {
		if root.Tag == "!!null" {
			el.Add(root.Line, "", "the file holds no settings; a marker needs at least carrier")
		}
		return c
	}
	if !config.HasKey(root, "carrier") {
		el.Add(root.Line, "carrier", "missing; one of %s", strings.Join(carriers, ", "))
	}
	only := func(key, carrier, what string) {
		if c.raw[key] && c.Carrier != carrier && c.Carrier != "" {
			el.Add(config.KeyLine(root, key), key, "only the %s carrier has %s; carrier is %s", carrier, what, c.Carrier)
		}
	}
	only("dscp_bits", carrierDSCP, "DSCP bits")
	only("header", carrierIPv6AltMrk, "an extension header")
	only("flowmon_id", carrierIPv6AltMrk, "a FlowMonID")
	only("flowmon_range", carrierIPv6AltMrk, "a FlowMonID")
	only("mtu", carrierIPv6AltMrk, "an MTU to respect (it alone grows packets)")
	only("backbone", carrierIPv4Flag, "backbone prefixes")
	if c.Carrier == carrierIPv4Flag && c.Double > 0 {
		el.Add(config.KeyLine(root, "double"), "double", "the ipv4-flag carrier has one bit, the color; double marking needs dscp or ipv6-altmark")
	}
	if c.Carrier == carrierDSCP && c.DSCPBits == nil {
		c.DSCPBits = []int{0, 1}
	}
	if c.Carrier == carrierIPv6AltMrk && c.Header == "" {
		c.Header = headerDest
	}
	if c.raw["flowmon_range"] && c.FlowMonID != nil {
		el.Add(config.KeyLine(root, "flowmon_range"), "flowmon_range", "a range is for flowmon_id: per-flow; flowmon_id is fixed at %d", *c.FlowMonID)
	}
	return c
}

func parseRange(s string) (uint32, uint32, error) {
	lo, hi, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 0, 32)
	b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 0, 32)
	if !ok || err1 != nil || err2 != nil || a > b || b > flowmonMax || a == 0 {
		return 0, 0, fmt.Errorf("%q is not a FlowMonID range first-last with 1 ≤ first ≤ last ≤ %d (e.g. 4096-8191: give each marker of a domain its own)", s, flowmonMax)
	}
	return uint32(a), uint32(b), nil
}

func decodeSelect(d *dec, v *yaml.Node, c *MarkConfig) {
	el := d.el
	el.EachKey(v, "select", selectKeys, func(key string, kv *yaml.Node) {
		f := "select." + key
		switch key {
		case "src", "dst":
			ps := match.Prefixes(el, kv, f)
			if len(ps) > maxMarkPrefixes {
				el.Add(kv.Line, f, "%d prefixes; at most %d", len(ps), maxMarkPrefixes)
			}
			if key == "src" {
				c.Select.Src = ps
			} else {
				c.Select.Dst = ps
			}
		case "protocols":
			if kv.Kind != yaml.SequenceNode || len(kv.Content) == 0 {
				el.Add(kv.Line, f, "must be a non-empty list of IP protocols, e.g. [tcp, udp, 132]; leave it out to mark all")
				return
			}
			for i, pv := range kv.Content {
				pf := fmt.Sprintf("%s[%d]", f, i)
				s, ok := el.Scalar(pv, pf)
				if !ok {
					continue
				}
				s = strings.ToLower(s)
				n, err := protocolNumber(s)
				if err != nil {
					el.Add(pv.Line, pf, "%v", err)
					continue
				}
				if slices.Contains(c.protos, n) {
					el.Add(pv.Line, pf, "protocol %s given twice", s)
					continue
				}
				c.protos = append(c.protos, n)
				c.Select.Protocols = append(c.Select.Protocols, s)
			}
		case "src_port", "dst_port":
			s, ok := el.Scalar(kv, f)
			if !ok {
				return
			}
			pr, err := match.ParsePorts(s)
			if err != nil {
				el.Add(kv.Line, f, "%v", err)
				return
			}
			if key == "src_port" {
				c.Select.SrcPort, c.ports[0] = s, pr
			} else {
				c.Select.DstPort, c.ports[1] = s, pr
			}
		}
	})
}

// MarkSpec is a validated marker configuration in the BPF program's terms.
type MarkSpec struct {
	PeriodNs      uint64
	StartColor    uint32
	Carrier       string
	ColorMask     uint8 // dscp: the TOS / traffic-class bits
	DelayMask     uint8
	HopByHop      bool
	MTU           uint32
	FlowMonID     uint32
	PerFlow       bool
	FlowMonFirst  uint32
	FlowMonCount  uint32
	DoublePackets uint32
	Protocols     []uint8 // empty: all
	Src, Dst      []netip.Prefix
	SrcPorts      match.PortRange
	DstPorts      match.PortRange
	Backbone      []netip.Prefix
}

// Spec is c in the BPF program's terms. c must have come from ParseMarkConfig.
func (c *MarkConfig) Spec() MarkSpec {
	s := MarkSpec{
		PeriodNs: uint64(c.Period), StartColor: uint32(c.StartColor), Carrier: c.Carrier,
		HopByHop: c.Header == headerHBH, MTU: uint32(c.MTU), PerFlow: c.FlowMonID == nil,
		FlowMonFirst: c.FlowMonMin, FlowMonCount: c.FlowMonMax - c.FlowMonMin + 1,
		DoublePackets: uint32(c.Double), Protocols: c.protos, Src: c.Select.Src, Dst: c.Select.Dst,
		SrcPorts: c.ports[0], DstPorts: c.ports[1], Backbone: c.Backbone,
	}
	if c.FlowMonID != nil {
		s.FlowMonID = *c.FlowMonID
	}
	if c.Carrier != carrierIPv6AltMrk {
		s.PerFlow = false
	}
	if len(c.DSCPBits) == 2 { // DSCP bit b is TOS bit b+2: the ECN bits 0-1 stay out of reach
		s.ColorMask = 1 << (c.DSCPBits[0] + 2)
		s.DelayMask = 1 << (c.DSCPBits[1] + 2)
	}
	return s
}
