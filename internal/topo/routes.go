package topo

import "net/netip"

// Route is a route a node needs to reach a subnet it is not attached to.
type Route struct {
	Dst  netip.Prefix
	Via  netip.Addr // the neighbour's address on Dev's link, same family as Dst
	Dev  *Iface
	Hops int // routers crossed to reach the subnet
}

// Routes computes n's routes to every subnet of the topology it is not attached to, along
// shortest paths (fewest hops) in which only routers forward: hosts are endpoints, never transit.
// Ties go to the link listed first, so the result is deterministic.
func (t *Topology) Routes(n *Node) []Route {
	// Breadth-first search from n, remembering through which of n's interfaces each node was
	// first reached.
	type visit struct {
		first *Iface
		hops  int
	}
	seen := map[*Node]visit{n: {}}
	queue := []*Node{n}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur != n && cur.Kind != Router {
			continue
		}
		for _, ifc := range cur.Ifaces {
			peer := ifc.Peer().Node
			if _, ok := seen[peer]; ok {
				continue
			}
			v := visit{first: seen[cur].first, hops: seen[cur].hops + 1}
			if cur == n {
				v.first = ifc
			}
			seen[peer] = v
			queue = append(queue, peer)
		}
	}
	var routes []Route
	for _, l := range t.Links {
		if l.A.Node == n || l.B.Node == n {
			continue
		}
		// Reach the subnet through whichever endpoint is nearer; prefer a router, which can
		// also deliver to the far endpoint.
		best, bestRouter, found := visit{}, false, false
		for _, end := range []*Iface{l.A, l.B} {
			v, ok := seen[end.Node]
			if !ok {
				continue
			}
			router := end.Node.Kind == Router
			if !found || v.hops < best.hops || (v.hops == best.hops && router && !bestRouter) {
				best, bestRouter, found = v, router, true
			}
		}
		if !found {
			continue
		}
		peer := best.first.Peer()
		for _, dst := range []netip.Prefix{l.A.IPv4, l.A.IPv6} {
			via := peer.IPv4
			if dst.Addr().Is6() {
				via = peer.IPv6
			}
			routes = append(routes, Route{Dst: dst.Masked(), Via: via.Addr(), Dev: best.first, Hops: best.hops - 1})
		}
	}
	return routes
}
