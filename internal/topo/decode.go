package topo

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/flowplane/flowplane/internal/config"
	"github.com/flowplane/flowplane/internal/units"
)

// The decoder walks yaml.v3's node tree rather than unmarshalling into structs so that every
// message can carry a line number and unknown keys can list the known ones.

type nodeSpec struct {
	name string
	line int
	kind Kind
	xdp  bool
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

func decode(file string, data []byte) (*spec, config.Errors) {
	el := &config.Collector{File: file}
	s := &spec{}
	root := el.Root(data, msgEmpty)
	if root == nil {
		return s, el.Errs
	}
	el.EachKey(root, "", TopLevel.Keys, func(key string, v *yaml.Node) {
		switch key {
		case "name":
			if str, ok := el.Scalar(v, "name"); ok {
				if err := ValidName(str); err != nil {
					el.Add(v.Line, "name", "%v", err)
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
		if s.nodes == nil && !config.HasKey(root, "nodes") {
			el.Add(root.Line, "nodes", "%s", msgNodesMissing)
		}
		if s.links == nil && !config.HasKey(root, "links") {
			el.Add(root.Line, "links", "%s", msgLinksMissing)
		}
	}
	return s, el.Errs
}

func decodeNodes(el *config.Collector, v *yaml.Node) []nodeSpec {
	if v.Kind != yaml.MappingNode {
		el.Add(v.Line, "nodes", "%s", msgNodesType)
		return nil
	}
	var nodes []nodeSpec
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		field := "nodes." + k.Value
		n := nodeSpec{name: k.Value, line: k.Line, kind: Host}
		if !nodeNameRE.MatchString(k.Value) {
			el.Add(k.Line, field, msgNodeName, k.Value)
		}
		el.EachKey(val, field, NodeLevel.Keys, func(key string, kv *yaml.Node) {
			switch key {
			case "kind":
				if str, ok := el.Scalar(kv, field+".kind"); ok {
					if isKind(str) {
						n.kind = Kind(str)
					} else {
						el.Add(kv.Line, field+".kind", msgKind, str)
					}
				}
			case "xdp":
				if str, ok := el.Scalar(kv, field+".xdp"); ok {
					if slices.Contains(Booleans, str) {
						n.xdp = str == "true"
					} else {
						el.Add(kv.Line, field+".xdp", msgBoolean, str)
					}
				}
			case "env":
				n.env = decodeEnv(el, kv, field+".env")
			}
		})
		nodes = append(nodes, n)
	}
	if len(nodes) == 0 {
		el.Add(v.Line, "nodes", "%s", msgNodesEmpty)
	}
	return nodes
}

func decodeEnv(el *config.Collector, v *yaml.Node, field string) map[string]string {
	if v.Kind != yaml.MappingNode {
		el.Add(v.Line, field, "%s", msgEnvType)
		return nil
	}
	env := map[string]string{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		if k.Value == "" || strings.ContainsAny(k.Value, EnvNameForbidden) {
			el.Add(k.Line, field, msgEnvName, k.Value)
			continue
		}
		if str, ok := el.Scalar(val, field+"."+k.Value); ok {
			env[k.Value] = str
		}
	}
	return env
}

func decodeLinks(el *config.Collector, v *yaml.Node) []linkSpec {
	if v.Kind != yaml.SequenceNode {
		el.Add(v.Line, "links", "%s", msgLinksType)
		return nil
	}
	links := make([]linkSpec, 0, len(v.Content))
	for i, lv := range v.Content {
		field := fmt.Sprintf("links[%d]", i)
		l := linkSpec{line: lv.Line}
		percent := func(kv *yaml.Node, key string, dst *float64) {
			if str, ok := el.Scalar(kv, field+"."+key); ok {
				p, err := units.ParsePercent(str)
				if err != nil {
					el.Add(kv.Line, field+"."+key, "%v", err)
				}
				*dst = p
			}
		}
		delay := func(kv *yaml.Node, key string, dst *time.Duration) {
			if str, ok := el.Scalar(kv, field+"."+key); ok {
				d, err := parseDelay(str)
				if err != nil {
					el.Add(kv.Line, field+"."+key, "%v", err)
				}
				*dst = d
			}
		}
		el.EachKey(lv, field, LinkLevel.Keys, func(key string, kv *yaml.Node) {
			switch key {
			case "endpoints":
				l.ends = decodeEndpoints(el, kv, field+".endpoints")
			case "mtu":
				if str, ok := el.Scalar(kv, field+".mtu"); ok {
					mtu, err := strconv.Atoi(str)
					if err != nil || mtu < 1280 || mtu > 65535 {
						el.Add(kv.Line, field+".mtu", "%q is not an MTU from 1280 (the IPv6 minimum) to 65535", str)
					}
					l.mtu = mtu
				}
			case "rate":
				if str, ok := el.Scalar(kv, field+".rate"); ok {
					r, err := units.ParseRate(str)
					if err != nil {
						el.Add(kv.Line, field+".rate", "%v", err)
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
		if lv.Kind == yaml.MappingNode && !config.HasKey(lv, "endpoints") {
			el.Add(lv.Line, field+".endpoints", "%s", msgEndpointsMissing)
		}
		if l.jitter > l.delay {
			el.Add(lv.Line, field+".jitter", "jitter %v is larger than delay %v; jitter varies the delay and cannot make it negative", l.jitter, l.delay)
		}
		links = append(links, l)
	}
	return links
}

func decodeEndpoints(el *config.Collector, v *yaml.Node, field string) []endpointSpec {
	if v.Kind != yaml.SequenceNode || len(v.Content) != EndpointsPerLink {
		el.Add(v.Line, field, "%s", msgEndpointsType)
		return nil
	}
	ends := make([]endpointSpec, 0, EndpointsPerLink)
	for i, ev := range v.Content {
		f := fmt.Sprintf("%s[%d]", field, i)
		e := endpointSpec{line: ev.Line}
		if ev.Kind == yaml.ScalarNode {
			e.node = ev.Value
			ends = append(ends, e)
			continue
		}
		el.EachKey(ev, f, EndpointLevel.Keys, func(key string, kv *yaml.Node) {
			str, ok := el.Scalar(kv, f+"."+key)
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
					el.Add(kv.Line, f+"."+key, "%q is not an address with prefix length, e.g. 198.18.1.1/24 or fd00:1::1/64", str)
				case key == "ipv4" && !p.Addr().Is4():
					el.Add(kv.Line, f+".ipv4", "%q is not an IPv4 address", str)
				case key == "ipv6" && (!p.Addr().Is6() || p.Addr().Is4In6()):
					el.Add(kv.Line, f+".ipv6", "%q is not an IPv6 address", str)
				case p.Addr() == p.Masked().Addr() && p.Bits() < p.Addr().BitLen()-1:
					el.Add(kv.Line, f+"."+key, "%q is the network address of its prefix; give an interface address, e.g. %s", str, p.Addr().Next())
				case key == "ipv4":
					e.ipv4 = p
				default:
					e.ipv6 = p
				}
			}
		})
		if e.node == "" && ev.Kind == yaml.MappingNode && !config.HasKey(ev, "node") {
			el.Add(ev.Line, f+".node", "%s", msgEndpointNodeMiss)
		}
		ends = append(ends, e)
	}
	return ends
}
