package topo

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/flowplane/flowplane/internal/config"
)

// Auto-assigned addresses: link i gets the i-th free /24 of 198.18.0.0/15 (RFC 2544 benchmarking
// space) and the i-th free /64 of fd00::/8; endpoint A takes .1 / ::1, endpoint B .2 / ::2.
var (
	autoV4 = netip.MustParsePrefix("198.18.0.0/15")
	autoV6 = netip.MustParsePrefix("fd00::/8")
)

func build(file string, s *spec) (*Topology, error) {
	el := &config.Collector{File: file}
	t := &Topology{Name: s.name, File: file}
	if err := ValidName(s.name); err != nil && s.nameLine == 0 {
		el.Add(0, "name", "%v; add a name: key", err)
	}
	byName := map[string]*Node{}
	for _, ns := range s.nodes {
		if _, dup := byName[ns.name]; dup {
			el.Add(ns.line, "nodes."+ns.name, "node %q defined twice", ns.name)
			continue
		}
		n := &Node{Name: ns.name, Kind: ns.kind, XDP: ns.xdp, Env: ns.env}
		byName[ns.name] = n
		t.Nodes = append(t.Nodes, n)
	}
	for i, ls := range s.links {
		field := fmt.Sprintf("links[%d].endpoints", i)
		l := &Link{Index: i, Line: ls.line, MTU: ls.mtu, Rate: ls.rl.rate, Loss: ls.rl.loss, HasLoss: ls.rl.hasLoss, LossGE: ls.rl.lossGE}
		if l.MTU == 0 {
			l.MTU = DefaultMTU
		}
		if !checkEnds(el, s, i) {
			continue
		}
		ifaces := [2]*Iface{}
		for j, e := range ls.ends {
			n := byName[e.node]
			rl := ls.rl.over(e.rl)
			ifaces[j] = &Iface{Name: fmt.Sprintf("eth%d", len(n.Ifaces)), Node: n, Link: l, IPv4: e.ipv4, IPv6: e.ipv6,
				Egress: ls.imp.over(e.imp), Rate: rl.rate, Loss: rl.loss, HasLoss: rl.hasLoss, LossGE: rl.lossGE}
			n.Ifaces = append(n.Ifaces, ifaces[j])
		}
		l.A, l.B = ifaces[0], ifaces[1]
		checkLinkAddrs(el, field, ls)
		t.Links = append(t.Links, l)
	}
	checkUnique(el, t, s)
	if len(el.Errs) > 0 {
		return nil, el.Errs
	}
	if err := assignAddrs(t); err != nil {
		el.Add(0, "links", "%v", err)
		return nil, el.Errs
	}
	return t, nil
}

// checkEnds reports whether link i of s joins two different nodes of s, saying why not when it
// does not (a link with no two endpoints was reported as it was read).
func checkEnds(el *config.Collector, s *spec, i int) bool {
	ls := s.links[i]
	if len(ls.ends) != 2 {
		return false
	}
	ok := true
	for j, e := range ls.ends {
		if e.node == "" { // reported as it was read
			ok = false
		} else if !slices.ContainsFunc(s.nodes, func(n nodeSpec) bool { return n.name == e.node }) {
			el.Add(e.line, fmt.Sprintf("links[%d].endpoints[%d]", i, j), "unknown node %q; nodes are: %s", e.node, nodeNames(s))
			ok = false
		}
	}
	if ok && ls.ends[0].node == ls.ends[1].node {
		el.Add(ls.line, fmt.Sprintf("links[%d].endpoints", i), "both endpoints are %q; a link joins two different nodes", ls.ends[0].node)
		ok = false
	}
	return ok
}

// checkLinkAddrs checks that a family is given on both endpoints or neither, in one subnet.
func checkLinkAddrs(el *config.Collector, field string, ls linkSpec) {
	a, b := ls.ends[0], ls.ends[1]
	for _, fam := range []struct {
		name string
		a, b netip.Prefix
	}{{"ipv4", a.ipv4, b.ipv4}, {"ipv6", a.ipv6, b.ipv6}} {
		switch {
		case fam.a.IsValid() != fam.b.IsValid():
			el.Add(ls.line, field, "%s is set on one endpoint only; set it on both (same subnet) or on neither to have it assigned", fam.name)
		case fam.a.IsValid() && fam.a.Masked() != fam.b.Masked():
			el.Add(ls.line, field, "%s addresses %s and %s are not in one subnet", fam.name, fam.a, fam.b)
		}
	}
}

// checkUnique rejects an address used twice and links whose subnets overlap (routing would be
// ambiguous).
func checkUnique(el *config.Collector, t *Topology, s *spec) {
	type use struct {
		line int
		what string
	}
	addrs := map[netip.Addr]use{}
	var subnets []struct {
		p    netip.Prefix
		link int
	}
	for i, ls := range s.links {
		if len(ls.ends) != 2 {
			continue
		}
		for j, e := range ls.ends {
			for _, p := range []netip.Prefix{e.ipv4, e.ipv6} {
				if !p.IsValid() {
					continue
				}
				what := fmt.Sprintf("links[%d].endpoints[%d]", i, j)
				if prev, dup := addrs[p.Addr()]; dup {
					el.Add(e.line, what, "address %s is already used by %s (line %d)", p.Addr(), prev.what, prev.line)
					continue
				}
				addrs[p.Addr()] = use{e.line, what}
				if j == 1 {
					continue
				}
				for _, sn := range subnets {
					if sn.p.Overlaps(p.Masked()) && sn.link != i {
						el.Add(e.line, what, "subnet %s overlaps %s of links[%d]; give each link its own subnet", p.Masked(), sn.p, sn.link)
					}
				}
				subnets = append(subnets, struct {
					p    netip.Prefix
					link int
				}{p.Masked(), i})
			}
		}
	}
}

func assignAddrs(t *Topology) error {
	var used []netip.Prefix
	for _, l := range t.Links {
		for _, p := range []netip.Prefix{l.A.IPv4, l.A.IPv6} {
			if p.IsValid() {
				used = append(used, p.Masked())
			}
		}
	}
	next4 := netip.PrefixFrom(autoV4.Addr(), 24)
	next6 := netip.PrefixFrom(autoV6.Addr(), 64)
	for _, l := range t.Links {
		var ok bool
		if !l.A.IPv4.IsValid() {
			if next4, ok = freeSubnet(next4, used, autoV4); !ok {
				return fmt.Errorf("more links than free /24 subnets in %s; give some links addresses", autoV4)
			}
			l.A.IPv4, l.B.IPv4 = hostPrefix(next4, 1), hostPrefix(next4, 2)
			next4 = nextSubnet(next4)
		}
		if !l.A.IPv6.IsValid() {
			if next6, ok = freeSubnet(next6, used, autoV6); !ok {
				return fmt.Errorf("more links than free /64 subnets in %s", autoV6)
			}
			l.A.IPv6, l.B.IPv6 = hostPrefix(next6, 1), hostPrefix(next6, 2)
			next6 = nextSubnet(next6)
		}
	}
	return nil
}

func freeSubnet(p netip.Prefix, used []netip.Prefix, pool netip.Prefix) (netip.Prefix, bool) {
	for ; pool.Contains(p.Addr()); p = nextSubnet(p) {
		free := true
		for _, u := range used {
			if u.Overlaps(p) {
				free = false
				break
			}
		}
		if free {
			return p, true
		}
	}
	return p, false
}

// nextSubnet returns the subnet of the same size right after p.
func nextSubnet(p netip.Prefix) netip.Prefix {
	b := p.Addr().AsSlice()
	bit := p.Bits() - 1 // add 1 at the last bit of the prefix, carrying left
	for i := bit / 8; i >= 0; i-- {
		inc := byte(1)
		if i == bit/8 {
			inc = 1 << (7 - bit%8)
		}
		b[i] += inc
		if b[i] >= inc {
			break
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(a, p.Bits())
}

func hostPrefix(subnet netip.Prefix, host int) netip.Prefix {
	a := subnet.Addr()
	for range host {
		a = a.Next()
	}
	return netip.PrefixFrom(a, subnet.Bits())
}

func nodeNames(s *spec) string {
	var names []string
	for _, n := range s.nodes {
		if !slices.Contains(names, n.name) {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ", ")
}
