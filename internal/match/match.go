// Package match is the connection selector that tune's rules and prio's advertisements share:
// remote and local prefixes, port ranges and direction, with their YAML keys and checks.
package match

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/flowplane/flowplane/internal/config"
	"github.com/flowplane/flowplane/internal/ipnet"
)

// Direction selects active opens (connect), passive ones (accept) or both.
type Direction uint8

// Directions, as bits (the BPF programs use the same values).
const (
	Active  Direction = 1
	Passive Direction = 2
	AnyDir            = Active | Passive
)

func (d Direction) String() string {
	switch d {
	case Active:
		return "active"
	case Passive:
		return "passive"
	}
	return "any"
}

// PortRange is an inclusive port range.
type PortRange struct{ Lo, Hi uint16 }

// AnyPort is every port.
var AnyPort = PortRange{0, 65535}

func (r PortRange) String() string {
	if r == AnyPort {
		return "any"
	}
	if r.Lo == r.Hi {
		return fmt.Sprint(r.Lo)
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

// Contains reports whether p is in the range.
func (r PortRange) Contains(p uint16) bool { return p >= r.Lo && p <= r.Hi }

// Match selects connections. Empty prefix lists match any address of either family.
type Match struct {
	Remote, Local         []netip.Prefix
	RemotePort, LocalPort PortRange
	Dir                   Direction
}

// Any is the selector that takes every connection.
func Any() Match { return Match{RemotePort: AnyPort, LocalPort: AnyPort, Dir: AnyDir} }

// Keys are the YAML keys DecodeKey reads.
var Keys = []string{"remote", "local", "remote_port", "local_port", "direction"}

// DecodeKey reads key (one of Keys) of a selector at field f into m, reporting problems to el.
// It returns false for any other key, which the caller decodes.
func (m *Match) DecodeKey(el *config.Collector, key string, v *yaml.Node, f string) bool {
	switch key {
	case "remote", "local":
		ps := Prefixes(el, v, f)
		if key == "remote" {
			m.Remote = ps
		} else {
			m.Local = ps
		}
	case "remote_port", "local_port":
		if s, ok := el.Scalar(v, f); ok {
			pr, err := ParsePorts(s)
			if err != nil {
				el.Add(v.Line, f, "%v", err)
			}
			if key == "remote_port" {
				m.RemotePort = pr
			} else {
				m.LocalPort = pr
			}
		}
	case "direction":
		if s, ok := el.Scalar(v, f); ok {
			switch s {
			case "active", "outgoing", "connect":
				m.Dir = Active
			case "passive", "incoming", "accept":
				m.Dir = Passive
			case "any", "both":
				m.Dir = AnyDir
			default:
				el.Add(v.Line, f, "%q is not a direction; use active (connect), passive (accept) or any", s)
			}
		}
	default:
		return false
	}
	return true
}

// CheckFamilies reports a selector whose remote and local prefixes can never both hold (a v4
// remote and a v6 local, or the reverse).
func (m *Match) CheckFamilies(el *config.Collector, line int, field string) {
	if len(m.Remote) == 0 || len(m.Local) == 0 {
		return
	}
	for _, a := range m.Remote {
		for _, b := range m.Local {
			if a.Addr().Is4() == b.Addr().Is4() {
				return
			}
		}
	}
	el.Add(line, field, "remote and local prefixes are of different families; no connection can match")
}

// Prefixes reads a prefix or a list of prefixes (a bare address is its host prefix).
func Prefixes(el *config.Collector, v *yaml.Node, f string) []netip.Prefix {
	var items []*yaml.Node
	switch v.Kind {
	case yaml.SequenceNode:
		items = v.Content
	case yaml.ScalarNode:
		items = []*yaml.Node{v}
	default:
		el.Add(v.Line, f, "must be a prefix or a list of prefixes, e.g. [10.0.0.0/8, fd00::/8]")
		return nil
	}
	var out []netip.Prefix
	for _, it := range items {
		s, ok := el.Scalar(it, f)
		if !ok {
			continue
		}
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			a, err2 := netip.ParseAddr(s)
			if err2 != nil {
				el.Add(it.Line, f, "%q is not an address or prefix (e.g. 10.1.0.0/16, fd00::/8)", s)
				continue
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		if pfx.Addr().Is4In6() {
			el.Add(it.Line, f, "%q is IPv4-mapped; write the IPv4 prefix (mapped connections count as IPv4)", s)
			continue
		}
		if pfx.Addr().Zone() != "" {
			el.Add(it.Line, f, "%q has a zone; prefixes cannot", s)
			continue
		}
		if err := ipnet.Network(pfx); err != nil {
			el.Add(it.Line, f, "%v", err)
			continue
		}
		out = append(out, pfx)
	}
	if len(items) == 0 {
		el.Add(v.Line, f, "empty list; leave the key out to match any address")
	}
	return out
}

// ParsePorts reads a port (443) or an inclusive range (8000-8999).
func ParsePorts(s string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	a, err := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	if err != nil {
		return AnyPort, fmt.Errorf("%q is not a port or range (e.g. 443 or 8000-8999)", s)
	}
	b := a
	if isRange {
		if b, err = strconv.ParseUint(strings.TrimSpace(hi), 10, 16); err != nil || b < a {
			return AnyPort, fmt.Errorf("%q is not a port range low-high with low ≤ high (e.g. 8000-8999)", s)
		}
	}
	return PortRange{uint16(a), uint16(b)}, nil
}
