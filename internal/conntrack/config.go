package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/flowplane/flowplane/internal/config"
	"github.com/flowplane/flowplane/internal/ipnet"
	"github.com/flowplane/flowplane/internal/units"
	"gopkg.in/yaml.v3"
)

// Timeout names, in the order of the BPF program's timeout slots (enum ct_timeout: the TCP
// states first). Slot 0 (TCP NONE) is never used for a live entry.
var timeoutNames = []string{
	"tcp_none", "tcp_syn_sent", "tcp_syn_recv", "tcp_established", "tcp_fin_wait", "tcp_close_wait",
	"tcp_last_ack", "tcp_time_wait", "tcp_close", "tcp_syn_sent2", "udp_unreplied", "udp_stream", "icmp",
	"tcp_unacknowledged", "tcp_retrans",
}

// DefaultTimeouts are nf_conntrack's defaults.
func DefaultTimeouts() map[string]time.Duration {
	return map[string]time.Duration{
		"tcp_none":        10 * time.Second,
		"tcp_syn_sent":    120 * time.Second,
		"tcp_syn_recv":    60 * time.Second,
		"tcp_established": 5 * 24 * time.Hour,
		"tcp_fin_wait":    120 * time.Second,
		"tcp_close_wait":  60 * time.Second,
		"tcp_last_ack":    30 * time.Second,
		"tcp_time_wait":   120 * time.Second,
		"tcp_close":       10 * time.Second,
		"tcp_syn_sent2":   120 * time.Second,
		"udp_unreplied":   30 * time.Second,
		"udp_stream":      120 * time.Second,
		"icmp":            30 * time.Second,
		// nf_conntrack_tcp_timeout_unacknowledged: the cap while data is unacknowledged.
		"tcp_unacknowledged": 300 * time.Second,
		// nf_conntrack_tcp_timeout_max_retrans: the cap after 3 retransmissions in a row.
		"tcp_retrans": 300 * time.Second,
	}
}

// Config is what `conntrack run` is told: interfaces from the flags, the rest from the
// optional YAML file.
type Config struct {
	Inside  []string
	Outside []string
	// Mode is "firewall" (drop what the policy refuses) or "track" (observe only).
	Mode string
	// Hook is where the program runs: "auto" (default: per interface, XDP where it can forward
	// at full speed, tc elsewhere), "xdp", or "tc" (tcx ingress, after GRO).
	Hook string
	// Liberal accepts TCP segments outside the tracked window (nf's tcp_be_liberal).
	Liberal bool
	// TCPLoose lets an ACK from inside pick up a connection whose handshake was not seen
	// (nf_conntrack_tcp_loose; default true, as nf's).
	TCPLoose *bool
	// Timeouts override DefaultTimeouts by name ("tcp_established": "1h").
	Timeouts map[string]string
	Allow    struct {
		// Ports outside may open connections to: "tcp/22", "udp/53", "icmp".
		Ports []string
		// Prefixes outside may open connections to.
		Prefixes []string
	}
	Table struct {
		Confirmed   uint32
		Unconfirmed uint32
	}
}

// LoadConfig reads a YAML config file; a missing path gives the defaults. Every problem in the
// file is reported at once, each with its line and field.
func LoadConfig(path string) (*Config, error) {
	if path == "" {
		return &Config{}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return decodeConfig(path, data)
}

// The keys of the configuration file, per level (timeouts: timeoutNames). The decoder refuses
// any other key, and docs_test.go checks that docs/conntrack.md documents each.
var (
	configKeys = []string{"mode", "hook", "liberal", "tcp_loose", "timeouts", "allow", "table"}
	allowKeys  = []string{"ports", "prefixes"}
	tableKeys  = []string{"confirmed", "unconfirmed"}
)

func decodeConfig(file string, data []byte) (*Config, error) {
	c := &Config{}
	el := &config.Collector{File: file}
	root := el.Root(data, "leave it out to use the defaults, or write e.g. `mode: firewall`")
	if root == nil {
		return nil, el.Err()
	}
	list := func(v *yaml.Node, f string, check func(string) error) []string {
		if v.Kind != yaml.SequenceNode {
			el.Add(v.Line, f, "must be a list, e.g. [a, b]")
			return nil
		}
		var out []string
		for i, e := range v.Content {
			ef := fmt.Sprintf("%s[%d]", f, i)
			if s, ok := el.Scalar(e, ef); ok {
				if err := check(s); err != nil {
					el.Add(e.Line, ef, "%v", err)
					continue
				}
				out = append(out, s)
			}
		}
		return out
	}
	tableSize := func(v *yaml.Node, f string) uint32 {
		s, ok := el.Scalar(v, f)
		if !ok {
			return 0
		}
		n, err := strconv.ParseUint(s, 10, 32)
		switch {
		case errors.Is(err, strconv.ErrRange):
			el.Add(v.Line, f, "%s entries: too many; the most is %d", s, uint32(1<<32-1))
			return 0
		case err != nil || n == 0:
			el.Add(v.Line, f, "%q is not a table size; write a positive number of entries, e.g. 65536", s)
			return 0
		}
		return uint32(n)
	}
	el.EachKey(root, "", configKeys, func(key string, v *yaml.Node) {
		switch key {
		case "mode":
			if s, ok := el.Scalar(v, key); ok {
				if s != "firewall" && s != "track" {
					el.Add(v.Line, key, "%q: want firewall or track", s)
				}
				c.Mode = s
			}
		case "hook":
			if s, ok := el.Scalar(v, key); ok {
				if s != HookAuto && s != HookXDP && s != HookTC {
					el.Add(v.Line, key, "%q: want %s, %s or %s", s, HookAuto, HookXDP, HookTC)
				}
				c.Hook = s
			}
		case "liberal":
			c.Liberal, _ = el.Bool(v, key)
		case "tcp_loose":
			if b, ok := el.Bool(v, key); ok {
				c.TCPLoose = &b
			}
		case "timeouts":
			c.Timeouts = map[string]string{}
			el.EachKey(v, key, timeoutNames, func(name string, tv *yaml.Node) {
				f := config.Join(key, name)
				if s, ok := el.Scalar(tv, f); ok {
					if _, err := checkTimeout(name, s); err != nil {
						el.Add(tv.Line, f, "%v", err)
					}
					c.Timeouts[name] = s
				}
			})
		case "allow":
			el.EachKey(v, key, allowKeys, func(k string, av *yaml.Node) {
				f := config.Join(key, k)
				if k == "ports" {
					c.Allow.Ports = list(av, f, func(s string) error { _, err := parsePortRule(s); return err })
					return
				}
				c.Allow.Prefixes = list(av, f, func(s string) error {
					p, err := netip.ParsePrefix(s)
					if err != nil {
						return fmt.Errorf("%q is not a prefix; write e.g. 198.18.1.0/24 or fd00::/64", s)
					}
					return ipnet.Network(p)
				})
			})
		case "table":
			el.EachKey(v, key, tableKeys, func(k string, tv *yaml.Node) {
				if k == "confirmed" {
					c.Table.Confirmed = tableSize(tv, config.Join(key, k))
				} else {
					c.Table.Unconfirmed = tableSize(tv, config.Join(key, k))
				}
			})
		}
	})
	if err := el.Err(); err != nil {
		return nil, err
	}
	return c, nil
}

// PortRule is one allowed (protocol, port); Port is 0 for ICMP.
type PortRule struct {
	Proto uint8
	Port  uint16
}

// resolved is a validated Config, in the BPF program's terms.
type resolved struct {
	trackOnly bool
	hook      string // HookAuto, HookXDP or HookTC
	liberal   bool
	loose     bool
	timeouts  [len(ctCtConfig{}.Timeout)]uint32
	ports     []PortRule
	prefixes  []netip.Prefix
	confirmed uint32
	embryonic uint32
}

// ParseTimeout parses "name=duration" and checks both.
func ParseTimeout(s string) (string, time.Duration, error) {
	name, val, ok := strings.Cut(s, "=")
	if !ok {
		return "", 0, fmt.Errorf("timeout %q: want name=duration", s)
	}
	d, err := checkTimeout(name, val)
	return name, d, err
}

func checkTimeout(name, val string) (time.Duration, error) {
	if _, ok := DefaultTimeouts()[name]; !ok {
		return 0, fmt.Errorf("unknown timeout %q (known: %s)", name, strings.Join(timeoutNames, ", "))
	}
	const most = time.Duration(1<<32-1) * time.Second // the BPF table holds seconds in 32 bits
	d, err := units.ParseDuration(val)
	if errors.Is(err, units.ErrDurationRange) {
		d = most + time.Second // reported as too long below
	} else if err != nil {
		n, err2 := strconv.ParseUint(val, 10, 64) // a bare number is seconds
		switch {
		case errors.Is(err2, strconv.ErrRange) || err2 == nil && n > uint64(most/time.Second):
			return 0, fmt.Errorf("timeout %s=%s: too long; the most is %ds", name, val, most/time.Second)
		case err2 != nil:
			return 0, fmt.Errorf("timeout %s=%s: not a duration; write e.g. 30s, 5m, 2h30m or 120 (seconds)", name, val)
		}
		d = time.Duration(n) * time.Second
	}
	switch {
	case d < time.Second:
		return 0, fmt.Errorf("timeout %s=%s: too short; the least is 1s", name, val)
	case d > most:
		return 0, fmt.Errorf("timeout %s=%s: too long; the most is %ds", name, val, most/time.Second)
	case d%time.Second != 0:
		return 0, fmt.Errorf("timeout %s=%s: must be a whole number of seconds", name, val)
	}
	return d, nil
}

// timeoutSlots turns a name → duration map (over the defaults) into the BPF array.
func timeoutSlots(over map[string]time.Duration) [len(ctCtConfig{}.Timeout)]uint32 {
	var slots [len(ctCtConfig{}.Timeout)]uint32
	all := DefaultTimeouts()
	for k, v := range over {
		all[k] = v
	}
	for i, n := range timeoutNames {
		slots[i] = uint32(all[n] / time.Second)
	}
	return slots
}

func (c *Config) resolve() (*resolved, error) {
	r := &resolved{liberal: c.Liberal, loose: c.TCPLoose == nil || *c.TCPLoose, confirmed: 262144, embryonic: 65536}
	switch c.Mode {
	case "", "firewall":
	case "track":
		r.trackOnly = true
	default:
		return nil, fmt.Errorf("mode %q: want firewall or track", c.Mode)
	}
	switch c.Hook {
	case "", HookAuto:
		r.hook = HookAuto
	case HookXDP:
		r.hook = HookXDP
	case HookTC:
		r.hook = HookTC
	default:
		return nil, fmt.Errorf("hook %q: want auto, xdp or tc", c.Hook)
	}
	over := map[string]time.Duration{}
	names := make([]string, 0, len(c.Timeouts))
	for k := range c.Timeouts {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		d, err := checkTimeout(k, c.Timeouts[k])
		if err != nil {
			return nil, err
		}
		over[k] = d
	}
	r.timeouts = timeoutSlots(over)
	for _, p := range c.Allow.Ports {
		rule, err := parsePortRule(p)
		if err != nil {
			return nil, err
		}
		r.ports = append(r.ports, rule)
	}
	for _, s := range c.Allow.Prefixes {
		p, err := netip.ParsePrefix(s)
		if err == nil {
			err = ipnet.Network(p) // a Config built in code meets the file's rule too
		}
		if err != nil {
			return nil, fmt.Errorf("allowed prefix: %w", err)
		}
		r.prefixes = append(r.prefixes, p)
	}
	if c.Table.Confirmed != 0 {
		r.confirmed = c.Table.Confirmed
	}
	if c.Table.Unconfirmed != 0 {
		r.embryonic = c.Table.Unconfirmed
	}
	if len(c.Inside)+len(c.Outside) == 0 {
		return nil, errors.New("no interfaces: give --inside and/or --outside")
	}
	seen := map[string]string{}
	for _, role := range []struct {
		name string
		ifs  []string
	}{{"inside", c.Inside}, {"outside", c.Outside}} {
		for _, i := range role.ifs {
			if prev, ok := seen[i]; ok {
				if prev == role.name {
					return nil, fmt.Errorf("interface %s given twice as %s", i, prev)
				}
				return nil, fmt.Errorf("interface %s is both inside and outside", i)
			}
			seen[i] = role.name
		}
	}
	return r, nil
}

func parsePortRule(s string) (PortRule, error) {
	proto, port, _ := strings.Cut(strings.ToLower(s), "/")
	var r PortRule
	switch proto {
	case "tcp":
		r.Proto = 6
	case "udp":
		r.Proto = 17
	case "icmp":
		r.Proto = 1
	case "icmpv6", "ipv6-icmp":
		r.Proto = 58
	default:
		return r, fmt.Errorf("allowed port %q: want tcp/N, udp/N, icmp or icmpv6", s)
	}
	if r.Proto == 1 || r.Proto == 58 {
		if port != "" {
			return r, fmt.Errorf("allowed port %q: ICMP has no port", s)
		}
		return r, nil
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return r, fmt.Errorf("allowed port %q: bad port", s)
	}
	r.Port = uint16(n)
	return r, nil
}
