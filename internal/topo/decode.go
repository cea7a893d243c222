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
	"github.com/flowplane/flowplane/internal/impair"
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
	imp        impSpec // overrides of the link's
	rl         rateLoss
}

// rateLoss is a rate and a loss as a link or an endpoint gives them.
type rateLoss struct {
	rate             uint64
	hasRate, hasLoss bool
	loss             float64
	lossGE           *impair.GilbertElliott
}

// over returns r with what o sets taken from o.
func (r rateLoss) over(o rateLoss) rateLoss {
	if o.hasRate {
		r.rate, r.hasRate = o.rate, true
	}
	if o.hasLoss {
		r.loss, r.lossGE, r.hasLoss = o.loss, o.lossGE, true
	}
	return r
}

// decodeRateLoss reads key (rate or loss) into r.
func decodeRateLoss(el *config.Collector, r *rateLoss, key, field string, kv *yaml.Node) {
	str, ok := el.Scalar(kv, field)
	if !ok {
		return
	}
	var err error
	switch key {
	case "rate":
		r.rate, err = units.ParseRate(str)
		r.hasRate = true
	case "loss":
		r.loss, r.lossGE, err = parseLoss(str)
		r.hasLoss = true
	}
	if err != nil {
		el.Add(kv.Line, field, "%v", err)
	}
}

// impSpec is an Impairment as a file gives it: the keys it sets, and their values.
type impSpec struct {
	set map[string]bool
	Impairment
}

// over returns s with the keys o sets taken from o.
func (s impSpec) over(o impSpec) Impairment {
	im := s.Impairment
	for k := range o.set {
		switch k {
		case "delay":
			im.Delay = o.Delay
		case "jitter":
			im.Jitter = o.Jitter
		case "distribution":
			im.Distribution = o.Distribution
		case "reorder":
			im.Reorder = o.Reorder
		case "duplicate":
			im.Duplicate = o.Duplicate
		case "corrupt":
			im.Corrupt = o.Corrupt
		}
	}
	if im.Distribution == "" {
		im.Distribution = impair.Distributions[0]
	}
	im.Given = len(s.set)+len(o.set) > 0
	return im
}

// decodeImpairment reads one of ImpairmentKeys into s.
func decodeImpairment(el *config.Collector, s *impSpec, key, field string, kv *yaml.Node) {
	str, ok := el.Scalar(kv, field)
	if !ok {
		return
	}
	if s.set == nil {
		s.set = map[string]bool{}
	}
	s.set[key] = true
	percent := func(dst *float64) {
		p, err := units.ParsePercent(str)
		if err != nil {
			el.Add(kv.Line, field, "%v", err)
		}
		*dst = p
	}
	delay := func(dst *time.Duration) {
		d, err := parseDelay(str)
		if err != nil {
			el.Add(kv.Line, field, "%v", err)
		}
		*dst = d
	}
	switch key {
	case "delay":
		delay(&s.Delay)
	case "jitter":
		delay(&s.Jitter)
	case "reorder":
		percent(&s.Reorder)
	case "duplicate":
		percent(&s.Duplicate)
	case "corrupt":
		percent(&s.Corrupt)
	case "distribution":
		if !slices.Contains(impair.Distributions, impair.Distribution(str)) {
			el.Add(kv.Line, field, "unknown distribution %q; use %s", str, orList(impair.Distributions))
			return
		}
		s.Distribution = impair.Distribution(str)
	}
}

func checkJitter(el *config.Collector, im Impairment, line int, field string) {
	if im.Jitter > im.Delay {
		el.Add(line, field+".jitter", "jitter %v is larger than delay %v; jitter varies the delay and cannot make it negative", im.Jitter, im.Delay)
	}
}

type linkSpec struct {
	line int
	ends []endpointSpec
	mtu  int
	rl   rateLoss
	imp  impSpec
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
			case "rate", "loss":
				decodeRateLoss(el, &l.rl, key, field+"."+key, kv)
			default:
				decodeImpairment(el, &l.imp, key, field+"."+key, kv)
			}
		})
		if lv.Kind == yaml.MappingNode && !config.HasKey(lv, "endpoints") {
			el.Add(lv.Line, field+".endpoints", "%s", msgEndpointsMissing)
		}
		checkJitter(el, l.imp.over(impSpec{}), lv.Line, field)
		for j, e := range l.ends {
			if e.imp.set["delay"] || e.imp.set["jitter"] {
				checkJitter(el, l.imp.over(e.imp), e.line, fmt.Sprintf("%s.endpoints[%d]", field, j))
			}
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
			if slices.Contains(ImpairmentKeys, key) {
				decodeImpairment(el, &e.imp, key, f+"."+key, kv)
				return
			}
			if key == "rate" || key == "loss" {
				decodeRateLoss(el, &e.rl, key, f+"."+key, kv)
				return
			}
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
