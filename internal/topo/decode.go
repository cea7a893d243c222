package topo

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// The decoder walks yaml.v3's node tree rather than unmarshalling into structs so that every
// message can carry a line number and unknown keys can list the known ones.

type nodeSpec struct {
	name string
	line int
	kind Kind
	env  map[string]string
}

type endpointSpec struct {
	node       string
	line       int
	ipv4, ipv6 netip.Prefix
}

type linkSpec struct {
	line      int
	ends      []endpointSpec
	mtu       int
	rate      uint64
	loss      float64
	hasLoss   bool
	delay     time.Duration
	jitter    time.Duration
	reorder   float64
	duplicate float64
	corrupt   float64
}

type spec struct {
	name     string
	nameLine int
	nodes    []nodeSpec
	links    []linkSpec
}

func decode(file string, data []byte) (*spec, Errors) {
	el := &errorList{file: file}
	s := &spec{}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		// yaml.v3 messages read "yaml: line N: …"; keep them, minus the library prefix.
		el.add(0, "", "not valid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
		return s, el.errs
	}
	if len(doc.Content) == 0 {
		el.add(0, "", "the file is empty; a topology needs nodes and links (see docs/lab.md)")
		return s, el.errs
	}
	root := doc.Content[0]
	eachKey(el, root, "", []string{"name", "nodes", "links"}, func(key string, v *yaml.Node) {
		switch key {
		case "name":
			if str, ok := scalar(el, v, "name"); ok {
				if err := ValidName(str); err != nil {
					el.add(v.Line, "name", "%v", err)
				}
				s.name, s.nameLine = str, v.Line
			}
		case "nodes":
			s.nodes = decodeNodes(el, v)
		case "links":
			s.links = decodeLinks(el, v)
		}
	})
	if root.Kind == yaml.MappingNode {
		if s.nodes == nil && !hasKey(root, "nodes") {
			el.add(root.Line, "nodes", "missing; list the hosts and routers, e.g. nodes: {h1: {}, r1: {kind: router}}")
		}
		if s.links == nil && !hasKey(root, "links") {
			el.add(root.Line, "links", "missing; list the links, e.g. links: [{endpoints: [h1, r1]}]")
		}
	}
	return s, el.errs
}

func decodeNodes(el *errorList, v *yaml.Node) []nodeSpec {
	if v.Kind != yaml.MappingNode {
		el.add(v.Line, "nodes", "must be a mapping of node name to its settings, e.g. {h1: {}, r1: {kind: router}}")
		return nil
	}
	var nodes []nodeSpec
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		field := "nodes." + k.Value
		n := nodeSpec{name: k.Value, line: k.Line, kind: Host}
		if !nodeNameRE.MatchString(k.Value) {
			el.add(k.Line, field, "node name %q must be 1-15 lowercase letters, digits or dashes, starting with a letter", k.Value)
		}
		eachKey(el, val, field, []string{"kind", "env"}, func(key string, kv *yaml.Node) {
			switch key {
			case "kind":
				if str, ok := scalar(el, kv, field+".kind"); ok {
					switch Kind(str) {
					case Host, Router:
						n.kind = Kind(str)
					default:
						el.add(kv.Line, field+".kind", "unknown kind %q; use host or router", str)
					}
				}
			case "env":
				n.env = decodeEnv(el, kv, field+".env")
			}
		})
		nodes = append(nodes, n)
	}
	if len(nodes) == 0 {
		el.add(v.Line, "nodes", "no nodes; a topology needs at least two")
	}
	return nodes
}

func decodeEnv(el *errorList, v *yaml.Node, field string) map[string]string {
	if v.Kind != yaml.MappingNode {
		el.add(v.Line, field, "must be a mapping of variable name to value")
		return nil
	}
	env := map[string]string{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		if k.Value == "" || strings.ContainsAny(k.Value, "= \t") {
			el.add(k.Line, field, "%q is not a variable name", k.Value)
			continue
		}
		if str, ok := scalar(el, val, field+"."+k.Value); ok {
			env[k.Value] = str
		}
	}
	return env
}

var linkKeys = []string{"endpoints", "mtu", "rate", "loss", "delay", "jitter", "reorder", "duplicate", "corrupt"}

func decodeLinks(el *errorList, v *yaml.Node) []linkSpec {
	if v.Kind != yaml.SequenceNode {
		el.add(v.Line, "links", "must be a list of links, e.g. [{endpoints: [h1, r1]}]")
		return nil
	}
	links := make([]linkSpec, 0, len(v.Content))
	for i, lv := range v.Content {
		field := fmt.Sprintf("links[%d]", i)
		l := linkSpec{line: lv.Line}
		percent := func(kv *yaml.Node, key string, dst *float64) {
			if str, ok := scalar(el, kv, field+"."+key); ok {
				p, err := ParsePercent(str)
				if err != nil {
					el.add(kv.Line, field+"."+key, "%v", err)
				}
				*dst = p
			}
		}
		delay := func(kv *yaml.Node, key string, dst *time.Duration) {
			if str, ok := scalar(el, kv, field+"."+key); ok {
				d, err := parseDelay(str)
				if err != nil {
					el.add(kv.Line, field+"."+key, "%v", err)
				}
				*dst = d
			}
		}
		eachKey(el, lv, field, linkKeys, func(key string, kv *yaml.Node) {
			switch key {
			case "endpoints":
				l.ends = decodeEndpoints(el, kv, field+".endpoints")
			case "mtu":
				if str, ok := scalar(el, kv, field+".mtu"); ok {
					mtu, err := strconv.Atoi(str)
					if err != nil || mtu < 1280 || mtu > 65535 {
						el.add(kv.Line, field+".mtu", "%q is not an MTU from 1280 (the IPv6 minimum) to 65535", str)
					}
					l.mtu = mtu
				}
			case "rate":
				if str, ok := scalar(el, kv, field+".rate"); ok {
					r, err := ParseRate(str)
					if err != nil {
						el.add(kv.Line, field+".rate", "%v", err)
					}
					l.rate = r
				}
			case "loss":
				percent(kv, key, &l.loss)
				l.hasLoss = true
			case "reorder":
				percent(kv, key, &l.reorder)
			case "duplicate":
				percent(kv, key, &l.duplicate)
			case "corrupt":
				percent(kv, key, &l.corrupt)
			case "delay":
				delay(kv, key, &l.delay)
			case "jitter":
				delay(kv, key, &l.jitter)
			}
		})
		if lv.Kind == yaml.MappingNode && !hasKey(lv, "endpoints") {
			el.add(lv.Line, field+".endpoints", "missing; name the two nodes the link joins, e.g. endpoints: [h1, r1]")
		}
		if l.jitter > l.delay {
			el.add(lv.Line, field+".jitter", "jitter %v is larger than delay %v; jitter varies the delay and cannot make it negative", l.jitter, l.delay)
		}
		links = append(links, l)
	}
	return links
}

func decodeEndpoints(el *errorList, v *yaml.Node, field string) []endpointSpec {
	if v.Kind != yaml.SequenceNode || len(v.Content) != 2 {
		el.add(v.Line, field, "must list exactly two endpoints, e.g. [h1, r1] or [{node: h1, ipv4: 198.18.1.1/24}, …]")
		return nil
	}
	ends := make([]endpointSpec, 0, 2)
	for i, ev := range v.Content {
		f := fmt.Sprintf("%s[%d]", field, i)
		e := endpointSpec{line: ev.Line}
		if ev.Kind == yaml.ScalarNode {
			e.node = ev.Value
			ends = append(ends, e)
			continue
		}
		eachKey(el, ev, f, []string{"node", "ipv4", "ipv6"}, func(key string, kv *yaml.Node) {
			str, ok := scalar(el, kv, f+"."+key)
			if !ok {
				return
			}
			switch key {
			case "node":
				e.node = str
			case "ipv4", "ipv6":
				p, err := netip.ParsePrefix(str)
				switch {
				case err != nil:
					el.add(kv.Line, f+"."+key, "%q is not an address with prefix length, e.g. 198.18.1.1/24 or fd00:1::1/64", str)
				case key == "ipv4" && !p.Addr().Is4():
					el.add(kv.Line, f+".ipv4", "%q is not an IPv4 address", str)
				case key == "ipv6" && (!p.Addr().Is6() || p.Addr().Is4In6()):
					el.add(kv.Line, f+".ipv6", "%q is not an IPv6 address", str)
				case p.Addr() == p.Masked().Addr() && p.Bits() < p.Addr().BitLen()-1:
					el.add(kv.Line, f+"."+key, "%q is the network address of its prefix; give an interface address, e.g. %s", str, p.Addr().Next())
				case key == "ipv4":
					e.ipv4 = p
				default:
					e.ipv6 = p
				}
			}
		})
		if e.node == "" && ev.Kind == yaml.MappingNode && !hasKey(ev, "node") {
			el.add(ev.Line, f+".node", "missing; name the node this endpoint is on")
		}
		ends = append(ends, e)
	}
	return ends
}

// eachKey calls fn for each key of a mapping, reporting keys not in known and duplicated keys.
func eachKey(el *errorList, v *yaml.Node, field string, known []string, fn func(key string, v *yaml.Node)) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return // "h1:" with nothing after it: all defaults
	}
	if v.Kind != yaml.MappingNode {
		name := field
		if name == "" {
			name = "the top level"
		}
		el.add(v.Line, field, "%s must be a mapping with keys %s", name, strings.Join(known, ", "))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k := v.Content[i]
		f := join(field, k.Value)
		if !slices.Contains(known, k.Value) {
			sorted := append([]string(nil), known...)
			sort.Strings(sorted)
			el.add(k.Line, f, "unknown key %q; known keys here: %s", k.Value, strings.Join(sorted, ", "))
			continue
		}
		if seen[k.Value] {
			el.add(k.Line, f, "key %q given twice", k.Value)
			continue
		}
		seen[k.Value] = true
		fn(k.Value, v.Content[i+1])
	}
}

func scalar(el *errorList, v *yaml.Node, field string) (string, bool) {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		el.add(v.Line, field, "must be a single value")
		return "", false
	}
	return v.Value, true
}

func hasKey(v *yaml.Node, key string) bool {
	for i := 0; i+1 < len(v.Content); i += 2 {
		if v.Content[i].Value == key {
			return true
		}
	}
	return false
}

func join(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}
