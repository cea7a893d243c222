package altmark

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/flowplane/flowplane/internal/config"
	"github.com/flowplane/flowplane/internal/ipnet"
	"github.com/flowplane/flowplane/internal/units"
)

// Config is the probe's configuration file, and the body of the REST API's GET/PUT /config:
// the JSON names are the file's keys. Parse validates it; Spec turns it into what the kernel
// side needs.
type Config struct {
	ProbeID    string      `json:"probe_id"`
	Interfaces []Interface `json:"interfaces"`
	Period     Duration    `json:"period"`
	Periods    int64       `json:"periods"` // periods to record, 0 = until stopped
	StartColor int         `json:"start_color"`
	Carrier    string      `json:"carrier"`
	DSCPBits   []int       `json:"dscp_bits,omitempty"`
	HashRef    uint32      `json:"hash_ref"`
	HashBits   int         `json:"hash_bits"`
	NMax       int         `json:"nmax"`
	Protocols  []string    `json:"protocols,omitempty"`
	Backbone   []string    `json:"backbone,omitempty"`
	// ipv6-altmark: the FlowMonIDs every point writes a row for in every period (zeros when
	// none came), and how many periods a FlowMonID seen at any point keeps its rows.
	FlowMonIDs  []IDRange `json:"flowmon_ids,omitempty"`
	FlowMonKeep *int64    `json:"flowmon_keep,omitempty"` // nil but with ipv6-altmark
	DataDir     string    `json:"data_dir"`
	IPFIX       *IPFIX    `json:"ipfix,omitempty"`
	Warnings    []string  `json:"-"` // accepted, but worth saying (a short period)
}

// startCheck is the File of the errors of the checks made at start (interfaces, data_dir):
// probe run puts its --config file there.
const startCheck = "config"

// Interface is one monitored interface and the directions counted on it.
type Interface struct {
	Name      string `json:"name"`
	Direction string `json:"direction"` // in, out or both
}

// IPFIX is where period records are exported.
type IPFIX struct {
	Collector         string `json:"collector"` // host:port
	Transport         string `json:"transport"` // udp or tcp
	ObservationDomain uint32 `json:"observation_domain"`
	// Enterprise is the private enterprise number of the elements IANA has no number for yet.
	Enterprise uint32 `json:"enterprise"`
}

// IDRange is FlowMonIDs First to Last, written as 7 or "4096-4127" in JSON.
type IDRange struct{ First, Last uint32 }

// MarshalJSON writes r as the configuration file spells it.
func (r IDRange) MarshalJSON() ([]byte, error) {
	if r.First == r.Last {
		return json.Marshal(r.First)
	}
	return json.Marshal(fmt.Sprintf("%d-%d", r.First, r.Last))
}

// Duration is a time.Duration written as "1s" in JSON.
type Duration time.Duration

// MarshalJSON writes d as Go's duration text.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Defaults and limits.
const (
	DefaultDataDir   = "/var/lib/flowplane/altmark"
	defaultPeriod    = time.Second
	minPeriod        = 10 * time.Millisecond
	maxPeriod        = time.Hour
	defaultHashBits  = 8
	defaultNMax      = 1000
	maxNMax          = 1 << 16
	defaultIPFIXPort = "4739"
	documentationPEN = 32473 // RFC 5612: the enterprise number for documentation and examples
	defaultObsDomain = 1
	maxIfnameLen     = 15 // IFNAMSIZ - 1
	maxFlowMonIDs    = 4096
	// A FlowMonID seen at any point keeps its zero rows this many periods after its last
	// packet: an outage of a flow that was running reads as loss, not as a flow gone, for
	// this long; then its rows stop, as a finished flow's should.
	defaultFlowMonKeep = 10
	maxFlowMonKeep     = 1 << 20
	carrierDSCP        = "dscp"
	carrierIPv4Flag    = "ipv4-flag"
	carrierIPv6AltMrk  = "ipv6-altmark"
)

var (
	carriers   = []string{carrierDSCP, carrierIPv4Flag, carrierIPv6AltMrk}
	directions = []string{"in", "out", "both"}
	probeIDRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
)

// The keys each mapping of a probe configuration accepts: the decoder checks files against
// these lists, and docs_test.go holds docs/altmark.md's configuration reference to them.
var (
	configKeys    = []string{"probe_id", "interfaces", "period", "periods", "start_color", "carrier", "dscp_bits", "hash_ref", "hash_bits", "nmax", "protocols", "backbone", "flowmon_ids", "flowmon_keep", "data_dir", "ipfix"}
	interfaceKeys = []string{"name", "direction"}
	ipfixKeys     = []string{"collector", "transport", "observation_domain", "enterprise"}
)

// ParseConfig reads and validates a probe configuration (YAML, or JSON, which is YAML too).
// The error is config.Errors naming every bad field with its line; nothing is half-accepted.
func ParseConfig(file string, data []byte) (*Config, error) {
	el := &config.Collector{File: file}
	c := decodeConfig(el, data)
	if err := el.Err(); err != nil {
		return nil, err
	}
	c.Warnings = el.Warnings
	return c, nil
}

// LoadConfig reads and validates the file at path.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return ParseConfig(path, data)
}

func decodeConfig(el *config.Collector, data []byte) *Config {
	root := el.Root(data, "a probe needs at least interfaces and carrier (see docs/altmark.md)")
	if root == nil {
		return nil
	}
	c := &Config{Period: Duration(defaultPeriod), HashBits: defaultHashBits, NMax: defaultNMax, DataDir: DefaultDataDir}
	d := &dec{el: el}
	el.EachKey(root, "", configKeys, func(key string, v *yaml.Node) {
		switch key {
		case "probe_id":
			if s, ok := el.Scalar(v, key); ok {
				if !probeIDRE.MatchString(s) {
					el.Add(v.Line, key, "%q: use 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit (it names a directory)", s)
				}
				c.ProbeID = s
			}
		case "interfaces":
			c.Interfaces = decodeInterfaces(d, v)
		case "period":
			if dur, ok := decodePeriod(d, v, key); ok {
				c.Period = Duration(dur)
			}
		case "periods":
			if n, ok := d.integer(v, key, 0, 1<<40); ok {
				c.Periods = n
			}
		case "start_color":
			if n, ok := d.integer(v, key, 0, 1); ok {
				c.StartColor = int(n)
			}
		case "carrier":
			c.Carrier = decodeCarrier(d, v, key)
		case "dscp_bits":
			c.DSCPBits = decodeDSCPBits(d, v)
		case "hash_ref":
			if n, ok := d.integer(v, key, 0, 1<<32-1); ok {
				c.HashRef = uint32(n)
			}
		case "hash_bits":
			if n, ok := d.integer(v, key, 0, 32); ok {
				c.HashBits = int(n)
			}
		case "nmax":
			if n, ok := d.integer(v, key, 2, maxNMax); ok {
				c.NMax = int(n)
			}
		case "protocols":
			c.Protocols = decodeProtocols(d, v)
		case "backbone":
			c.Backbone = decodeBackbone(d, v)
		case "flowmon_ids":
			c.FlowMonIDs = decodeFlowMonIDs(d, v)
		case "flowmon_keep":
			if n, ok := d.integer(v, key, 0, maxFlowMonKeep); ok {
				c.FlowMonKeep = &n
			}
		case "data_dir":
			if s, ok := el.Scalar(v, key); ok {
				if s == "" {
					el.Add(v.Line, key, "empty; give the directory the period records go to")
				}
				c.DataDir = s
			}
		case "ipfix":
			c.IPFIX = decodeIPFIX(d, v)
		}
	})
	if root.Kind != yaml.MappingNode {
		if root.Tag == "!!null" { // EachKey takes null for an empty mapping; a whole file cannot be
			el.Add(root.Line, "", "the file holds no settings; a probe needs at least interfaces and carrier")
		}
		return c
	}
	if c.ProbeID == "" {
		host, err := os.Hostname()
		if err != nil || !probeIDRE.MatchString(host) {
			el.Add(root.Line, "probe_id", "missing, and the hostname %q cannot stand in for it; give probe_id", host)
		}
		c.ProbeID = host
	}
	if !config.HasKey(root, "interfaces") {
		el.Add(root.Line, "interfaces", "missing; list the monitored interfaces, e.g. interfaces: [{name: eth0, direction: both}]")
	}
	if !config.HasKey(root, "carrier") {
		el.Add(root.Line, "carrier", "missing; one of %s (the marker's carrier)", strings.Join(carriers, ", "))
	}
	if c.Carrier == carrierDSCP && c.DSCPBits == nil {
		c.DSCPBits = []int{0, 1}
	}
	only := func(key, carrier, what string) {
		if config.HasKey(root, key) && c.Carrier != carrier && c.Carrier != "" {
			el.Add(config.KeyLine(root, key), key, "only the %s carrier %s; carrier is %s", carrier, what, c.Carrier)
		}
	}
	only("dscp_bits", carrierDSCP, "uses DSCP bits")
	only("backbone", carrierIPv4Flag, "has a backbone prefix")
	only("flowmon_ids", carrierIPv6AltMrk, "has FlowMonIDs")
	only("flowmon_keep", carrierIPv6AltMrk, "has FlowMonIDs")
	if c.Carrier == carrierIPv6AltMrk && !config.HasKey(root, "flowmon_keep") {
		keep := int64(defaultFlowMonKeep)
		c.FlowMonKeep = &keep
	}
	return c
}

// decodeFlowMonIDs reads flowmon_ids: a list of FlowMonIDs and first-last ranges.
func decodeFlowMonIDs(d *dec, v *yaml.Node) []IDRange {
	el := d.el
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		el.Add(v.Line, "flowmon_ids", "must be a non-empty list of FlowMonIDs and ranges, e.g. [7, 4096-4127]")
		return nil
	}
	var out []IDRange
	total := 0
	for i, iv := range v.Content {
		f := fmt.Sprintf("flowmon_ids[%d]", i)
		s, ok := el.Scalar(iv, f)
		if !ok {
			continue
		}
		r, err := parseIDRange(s)
		if err != nil {
			el.Add(iv.Line, f, "%v", err)
			continue
		}
		total += int(r.Last-r.First) + 1
		out = append(out, r)
	}
	if total > maxFlowMonIDs {
		el.Add(v.Line, "flowmon_ids", "%d FlowMonIDs; at most %d (every point writes a row for each in every period)", total, maxFlowMonIDs)
	}
	return out
}

// parseIDRange reads "7" or "4096-4127".
func parseIDRange(s string) (IDRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 0, 32)
	b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 0, 32)
	if err1 != nil || err2 != nil || a > b || b > flowmonMax {
		return IDRange{}, fmt.Errorf("%q is not a FlowMonID (0 to %d) or a range first-last of them, e.g. 4096-4127", s, flowmonMax)
	}
	return IDRange{First: uint32(a), Last: uint32(b)}, nil
}

func decodeInterfaces(d *dec, v *yaml.Node) []Interface {
	el := d.el
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		el.Add(v.Line, "interfaces", "must be a non-empty list, e.g. [{name: eth0, direction: both}]")
		return nil
	}
	var out []Interface
	for i, iv := range v.Content {
		field := fmt.Sprintf("interfaces[%d]", i)
		ifc := Interface{Direction: "both"}
		el.EachKey(iv, field, interfaceKeys, func(key string, kv *yaml.Node) {
			f := field + "." + key
			s, ok := el.Scalar(kv, f)
			if !ok {
				return
			}
			switch key {
			case "name":
				if s == "" || len(s) > maxIfnameLen || strings.ContainsAny(s, "/ \t:") {
					el.Add(kv.Line, f, "%q is not an interface name (1 to %d characters, no '/', ':' or spaces)", s, maxIfnameLen)
				}
				for j, o := range out {
					if o.Name == s {
						el.Add(kv.Line, f, "interface %s given twice (also interfaces[%d]); use direction: both", s, j)
					}
				}
				ifc.Name = s
			case "direction":
				if !slices.Contains(directions, s) {
					el.Add(kv.Line, f, "%q: want in (tcx ingress), out (tcx egress) or both", s)
				}
				ifc.Direction = s
			}
		})
		if (iv.Kind == yaml.MappingNode || iv.Tag == "!!null") && !config.HasKey(iv, "name") {
			el.Add(iv.Line, field+".name", "missing; name the interface")
		}
		out = append(out, ifc)
	}
	return out
}

// decodePeriod reads a period length L, warning when it leaves little room for the read rule.
func decodePeriod(d *dec, v *yaml.Node, key string) (time.Duration, bool) {
	dur, ok := d.duration(v, key, minPeriod, maxPeriod)
	if ok && dur < warnPeriod {
		d.el.Warn(v.Line, key, "%v is short: RFC 9341 needs L > 2×(clock error + delay spread) between the measurement points; give the probes time to read each color", dur)
	}
	return dur, ok
}

// decodeCarrier reads the marker's carrier, which the probe must be told too.
func decodeCarrier(d *dec, v *yaml.Node, key string) string {
	s, ok := d.el.Scalar(v, key)
	if ok && !slices.Contains(carriers, s) {
		d.el.Add(v.Line, key, "%q: want one of %s (the marker's carrier)", s, strings.Join(carriers, ", "))
	}
	return s
}

func decodeDSCPBits(d *dec, v *yaml.Node) []int {
	if v.Kind != yaml.SequenceNode || len(v.Content) != 2 {
		d.el.Add(v.Line, "dscp_bits", "must be a list of two DSCP bit numbers, color then delay, e.g. [0, 1] (bit 0 is the DSCP's least significant bit)")
		return nil
	}
	var bits []int
	for i, bv := range v.Content {
		n, ok := d.integer(bv, fmt.Sprintf("dscp_bits[%d]", i), 0, 5)
		if !ok {
			return nil
		}
		bits = append(bits, int(n))
	}
	if bits[0] == bits[1] {
		d.el.Add(v.Line, "dscp_bits", "color and delay need two different bits, both are %d", bits[0])
		return nil
	}
	return bits
}

func decodeProtocols(d *dec, v *yaml.Node) []string {
	if v.Kind != yaml.SequenceNode {
		d.el.Add(v.Line, "protocols", "must be a list of IP protocols, e.g. [tcp, udp, 132]; empty counts all")
		return nil
	}
	var out []string
	for i, pv := range v.Content {
		f := fmt.Sprintf("protocols[%d]", i)
		s, ok := d.el.Scalar(pv, f)
		if !ok {
			continue
		}
		s = strings.ToLower(s)
		if _, err := protocolNumber(s); err != nil {
			d.el.Add(pv.Line, f, "%v", err)
			continue
		}
		if slices.Contains(out, s) {
			d.el.Add(pv.Line, f, "protocol %s given twice", s)
			continue
		}
		out = append(out, s)
	}
	return out
}

func protocolNumber(s string) (uint8, error) {
	if n, ok := ipnet.ProtoNumber(s); ok {
		return n, nil
	}
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil {
		return 0, fmt.Errorf("%q is not an IP protocol: give a number 0-255 or one of %s", s, strings.Join(ipnet.ProtoNameList(), ", "))
	}
	return uint8(n), nil
}

func decodeBackbone(d *dec, v *yaml.Node) []string {
	if v.Kind != yaml.SequenceNode {
		d.el.Add(v.Line, "backbone", "must be a list of IPv4 prefixes, e.g. [198.18.0.0/24]")
		return nil
	}
	var out []string
	for i, pv := range v.Content {
		f := fmt.Sprintf("backbone[%d]", i)
		s, ok := d.el.Scalar(pv, f)
		if !ok {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() {
			d.el.Add(pv.Line, f, "%q is not an IPv4 prefix (the ipv4-flag carrier is IPv4 only), e.g. 198.18.0.0/24", s)
			continue
		}
		if err := ipnet.Network(p); err != nil { // as the marker's backbone (internal/match)
			d.el.Add(pv.Line, f, "%v", err)
			continue
		}
		out = append(out, p.String())
	}
	return out
}

func decodeIPFIX(d *dec, v *yaml.Node) *IPFIX {
	el := d.el
	x := &IPFIX{Transport: "udp", ObservationDomain: defaultObsDomain, Enterprise: documentationPEN}
	el.EachKey(v, "ipfix", ipfixKeys, func(key string, kv *yaml.Node) {
		f := "ipfix." + key
		switch key {
		case "collector":
			s, ok := el.Scalar(kv, f)
			if !ok {
				return
			}
			host, port, err := net.SplitHostPort(s)
			if err != nil {
				// A bare host gets the IPFIX port (RFC 7011: 4739).
				host, port = s, defaultIPFIXPort
				s = net.JoinHostPort(host, port)
			}
			if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 || host == "" {
				el.Add(kv.Line, f, "%q is not host:port, e.g. 198.18.0.10:4739", s)
			}
			x.Collector = s
		case "transport":
			if s, ok := el.Scalar(kv, f); ok {
				if s != "udp" && s != "tcp" {
					el.Add(kv.Line, f, "%q: want udp or tcp", s)
				}
				x.Transport = s
			}
		case "observation_domain":
			if n, ok := d.integer(kv, f, 0, 1<<32-1); ok {
				x.ObservationDomain = uint32(n)
			}
		case "enterprise":
			if n, ok := d.integer(kv, f, 1, 1<<32-1); ok {
				x.Enterprise = uint32(n)
			}
		}
	})
	if (v.Kind == yaml.MappingNode || v.Tag == "!!null") && !config.HasKey(v, "collector") {
		el.Add(v.Line, "ipfix.collector", "missing; give the collector's host:port")
	}
	return x
}

// dec reads typed scalars, recording an error naming the field when one is not.
type dec struct{ el *config.Collector }

func (d *dec) integer(v *yaml.Node, f string, lo, hi int64) (int64, bool) {
	s, ok := d.el.Scalar(v, f)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 0, 64)
	if err != nil || n < lo || n > hi {
		d.el.Add(v.Line, f, "%q is not a whole number from %d to %d", s, lo, hi)
		return 0, false
	}
	return n, true
}

func (d *dec) duration(v *yaml.Node, f string, lo, hi time.Duration) (time.Duration, bool) {
	s, ok := d.el.Scalar(v, f)
	if !ok {
		return 0, false
	}
	dur, err := units.ParseDuration(s)
	if errors.Is(err, units.ErrDurationRange) {
		d.el.Add(v.Line, f, "%q is outside %v to %v", s, lo, hi)
		return 0, false
	}
	if err != nil {
		d.el.Add(v.Line, f, "%q is not a duration; write e.g. 1s or 500ms", s)
		return 0, false
	}
	if dur < lo || dur > hi {
		d.el.Add(v.Line, f, "%v is outside %v to %v", dur, lo, hi)
		return 0, false
	}
	if dur%time.Millisecond != 0 {
		d.el.Add(v.Line, f, "%v: give whole milliseconds", dur)
		return 0, false
	}
	return dur, true
}

// Points lists the measurement points, in and out for "both".
func (c *Config) Points() []Point {
	var ps []Point
	for _, i := range c.Interfaces {
		if i.Direction == "in" || i.Direction == "both" {
			ps = append(ps, Point{Ifname: i.Name, Direction: "in"})
		}
		if i.Direction == "out" || i.Direction == "both" {
			ps = append(ps, Point{Ifname: i.Name, Direction: "out"})
		}
	}
	return ps
}

// PeriodNs is the period length L in nanoseconds.
func (c *Config) PeriodNs() int64 { return int64(c.Period) }

// Spec is c in the kernel side's terms. c must have come from ParseConfig.
func (c *Config) Spec() ProbeSpec {
	s := ProbeSpec{
		Points:     c.Points(),
		PeriodNs:   c.PeriodNs(),
		StartColor: c.StartColor,
		Carrier:    c.Carrier,
		HashRef:    c.HashRef,
		HashBits:   c.HashBits,
		NMax:       c.NMax,
	}
	if len(c.DSCPBits) == 2 {
		s.DSCPBits = [2]uint8{uint8(c.DSCPBits[0]), uint8(c.DSCPBits[1])}
	}
	for _, p := range c.Protocols {
		n, _ := protocolNumber(p)
		s.Protocols = append(s.Protocols, n)
	}
	for _, b := range c.Backbone {
		s.Backbone = append(s.Backbone, netip.MustParsePrefix(b))
	}
	return s
}

// CheckInterfaces reports the configured interfaces this namespace does not have, naming the
// field, before anything attaches.
func (c *Config) CheckInterfaces() error {
	var errs config.Errors
	for i, ifc := range c.Interfaces {
		if _, err := net.InterfaceByName(ifc.Name); err != nil {
			errs = append(errs, config.Error{File: startCheck, Field: fmt.Sprintf("interfaces[%d].name", i), Msg: fmt.Sprintf("no interface %q in this network namespace", ifc.Name)})
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}
