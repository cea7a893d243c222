package vnet

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"time"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/topo"
	"github.com/flowplane/flowplane/internal/vnet/clock"
	"github.com/flowplane/flowplane/internal/vnet/link"
	"github.com/flowplane/flowplane/internal/vnet/rip"
	"github.com/flowplane/flowplane/internal/vnet/tcp"
)

// Options configures a network or a standalone node.
type Options struct {
	// BasePort is the first UDP port; link i uses BasePort+2i (end A) and BasePort+2i+1 (end B).
	// 0 derives it from the topology name (so separate node processes agree); -1 lets the
	// kernel pick ports (in-process only: tests run in parallel without collisions).
	BasePort int
	Bind     netip.Addr // UDP address links bind to; default 127.0.0.1
	TCP      tcp.Config
	RIP      rip.Config
	Logger   *slog.Logger
	Seed     uint64    // impairment randomness; 0 random
	TAPs     []TAPSpec // extra interfaces on TAP devices (root only)
}

// fill sets the defaults of what o leaves zero, and checks a TCP configuration it gives.
func (o *Options) fill() error {
	if reflect.ValueOf(o.TCP).IsZero() {
		o.TCP = tcp.DefaultConfig()
	} else if err := o.TCP.Check(); err != nil {
		return cli.Usagef("Options.TCP: %v", err)
	}
	if o.RIP.Period == 0 {
		o.RIP = rip.DefaultConfig()
	}
	if !o.Bind.IsValid() {
		o.Bind = netip.MustParseAddr("127.0.0.1")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// BasePortFor derives the UDP base port of a topology from its name: deterministic, so every
// process of a multi-process network computes the same ports, and spread over 20000-59999.
func BasePortFor(t *topo.Topology) int {
	h := fnv.New32a()
	h.Write([]byte(t.Name))
	return 20000 + int(h.Sum32()%1000)*40
}

func (o *Options) basePort(t *topo.Topology) (int, error) {
	base := o.BasePort
	if base == 0 {
		base = BasePortFor(t)
	}
	if base > 0 && base+2*len(t.Links) > 65535 {
		return 0, cli.Usagef("base port %d leaves no room for %d links (2 UDP ports each); choose a base port below %d", base, len(t.Links), 65535-2*len(t.Links))
	}
	return base, nil
}

// Network is a whole topology running in this process.
type Network struct {
	Topo  *topo.Topology
	nodes map[string]*Node
	order []*Node
	links map[*topo.Link][2]*link.UDP
}

// LinkEnds returns the UDP links of both ends of l (end A first), for statistics.
func (nw *Network) LinkEnds(l *topo.Link) [2]*link.UDP { return nw.links[l] }

// Start runs every node of t in this process, links over UDP on the loopback interface.
func Start(t *topo.Topology, opts Options) (*Network, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	base, err := opts.basePort(t)
	if err != nil {
		return nil, err
	}
	nw := &Network{Topo: t, nodes: map[string]*Node{}, links: map[*topo.Link][2]*link.UDP{}}
	ends := map[*topo.Iface]*link.UDP{}
	fail := func(err error) (*Network, error) {
		for _, u := range ends {
			u.Close()
		}
		return nil, err
	}
	for _, l := range t.Links {
		var pair [2]*link.UDP
		for k, ifc := range []*topo.Iface{l.A, l.B} {
			port := 0
			if base > 0 {
				port = base + 2*l.Index + k
			}
			u, err := link.Listen(&net.UDPAddr{IP: opts.Bind.AsSlice(), Port: port}, l.MTU)
			if err != nil {
				return fail(fmt.Errorf("link %d (%s-%s, line %d): %w; another vnet may be running: pass a different base port", l.Index, l.A.Node.Name, l.B.Node.Name, l.Line, err))
			}
			seed := opts.Seed
			if seed != 0 {
				seed += uint64(2*l.Index + k)
			}
			u.SetImpair(ifc.Params(seed))
			ends[ifc] = u
			pair[k] = u
		}
		nw.links[l] = pair
	}
	taps, err := openTAPs(t, opts.TAPs)
	if err != nil {
		return fail(err)
	}
	clk := clock.NewReal()
	for _, tn := range t.Nodes {
		var ifcs []IfaceConfig
		for _, ti := range tn.Ifaces {
			ifcs = append(ifcs, IfaceConfig{Name: ti.Name, Addr: ti.IPv4, Peer: ti.Peer().IPv4.Addr(), Link: ends[ti]})
		}
		for _, tp := range taps {
			if tp.node == tn.Name {
				ifcs = append(ifcs, tp.cfg)
			}
		}
		n := NewNode(NodeConfig{Name: tn.Name, Router: tn.Kind == topo.Router, Clock: clk, Logger: opts.Logger,
			TCP: opts.TCP, RIP: opts.RIP}, ifcs)
		nw.nodes[tn.Name] = n
		nw.order = append(nw.order, n)
	}
	for _, tn := range t.Nodes {
		n := nw.nodes[tn.Name]
		for i, ti := range tn.Ifaces {
			ifc := n.ifaces[i]
			ends[ti].Start(ends[ti.Peer()].LocalAddr(), func(p []byte) { n.Input(ifc, p) }, func() { n.flush(ifc) })
		}
	}
	for _, n := range nw.order {
		n.StartLinks()
		n.Start()
	}
	return nw, nil
}

// Node returns the node called name, or nil.
func (nw *Network) Node(name string) *Node { return nw.nodes[name] }

// Nodes lists nodes in file order.
func (nw *Network) Nodes() []*Node { return nw.order }

// SetLinkUp brings both ends of a link up or down, as pulling a cable would.
func (nw *Network) SetLinkUp(l *topo.Link, up bool) {
	for _, ti := range []*topo.Iface{l.A, l.B} {
		n := nw.nodes[ti.Node.Name]
		n.SetUp(n.ifaces[ifaceIndex(ti)], up)
	}
}

func ifaceIndex(ti *topo.Iface) int {
	for i, x := range ti.Node.Ifaces {
		if x == ti {
			return i
		}
	}
	return -1
}

// Converged reports whether every node has a route to every link subnet it can reach over
// interfaces that are up, and none to a subnet it cannot.
func (nw *Network) Converged() bool {
	for _, n := range nw.order {
		have := map[netip.Prefix]bool{}
		for _, r := range n.Routes() {
			have[r.Prefix] = true
		}
		for _, l := range nw.Topo.Links {
			if have[l.A.IPv4.Masked()] != nw.reachable(n.Name, l) {
				return false
			}
		}
	}
	return true
}

func (nw *Network) ifaceUp(ti *topo.Iface) bool {
	return nw.nodes[ti.Node.Name].ifaces[ifaceIndex(ti)].Up()
}

// reachable: can node reach link l's subnet, forwarding through routers only, over up
// interfaces? A subnet counts as reachable from a node with an up interface on it.
func (nw *Network) reachable(node string, l *topo.Link) bool {
	start := nw.Topo.Node(node)
	seen := map[*topo.Node]bool{start: true}
	q := []*topo.Node{start}
	for len(q) > 0 {
		cur := q[0]
		q = q[1:]
		for _, end := range []*topo.Iface{l.A, l.B} {
			if end.Node == cur && nw.ifaceUp(end) {
				return true
			}
		}
		if cur != start && cur.Kind != topo.Router {
			continue
		}
		for _, i := range cur.Ifaces {
			if !nw.ifaceUp(i) || !nw.ifaceUp(i.Peer()) {
				continue
			}
			if p := i.Peer().Node; !seen[p] {
				seen[p] = true
				q = append(q, p)
			}
		}
	}
	return false
}

// WaitConverged polls until every node has every reachable route or the timeout passes.
func (nw *Network) WaitConverged(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !nw.Converged() {
		if time.Now().After(deadline) {
			return errors.New("vnet: routing did not converge in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// Close stops every node.
func (nw *Network) Close() {
	for _, n := range nw.order {
		n.Close()
	}
}

// StartNode runs one node of t in this process; its neighbours are other processes that found
// the same UDP ports from the same file.
func StartNode(t *topo.Topology, name string, opts Options) (*Node, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	tn := t.Node(name)
	if tn == nil {
		var names []string
		for _, n := range t.Nodes {
			names = append(names, n.Name)
		}
		return nil, cli.Usagef("%s: no node %q; nodes are: %s", t.File, name, strings.Join(names, ", "))
	}
	base, err := opts.basePort(t)
	if err != nil {
		return nil, err
	}
	if base < 0 {
		return nil, cli.Usage(errors.New("a standalone node needs fixed ports: base port must not be -1"))
	}
	var ifcs []IfaceConfig
	var udps []*link.UDP
	var peers []*net.UDPAddr
	for _, ti := range tn.Ifaces {
		l := ti.Link
		k := 0
		if l.B == ti {
			k = 1
		}
		port := base + 2*l.Index + k
		u, err := link.Listen(&net.UDPAddr{IP: opts.Bind.AsSlice(), Port: port}, l.MTU)
		if err != nil {
			for _, x := range udps {
				x.Close()
			}
			return nil, fmt.Errorf("node %s %s: %w", name, ti.Name, err)
		}
		u.SetImpair(ti.Params(opts.Seed))
		udps = append(udps, u)
		peers = append(peers, &net.UDPAddr{IP: opts.Bind.AsSlice(), Port: base + 2*l.Index + 1 - k})
		ifcs = append(ifcs, IfaceConfig{Name: ti.Name, Addr: ti.IPv4, Peer: ti.Peer().IPv4.Addr(), Link: u})
	}
	for _, sp := range opts.TAPs {
		if sp.Node != name {
			for _, x := range udps {
				x.Close()
			}
			return nil, cli.Usagef("--tap %s=%s: this process runs node %s only", sp.Node, sp.Netns, name)
		}
	}
	taps, err := openTAPs(t, opts.TAPs)
	if err != nil {
		for _, x := range udps {
			x.Close()
		}
		return nil, err
	}
	for _, tp := range taps {
		ifcs = append(ifcs, tp.cfg)
	}
	n := NewNode(NodeConfig{Name: name, Router: tn.Kind == topo.Router, Logger: opts.Logger, TCP: opts.TCP, RIP: opts.RIP}, ifcs)
	for i, u := range udps {
		ifc := n.ifaces[i]
		u.Start(peers[i], func(p []byte) { n.Input(ifc, p) }, func() { n.flush(ifc) })
	}
	n.StartLinks()
	n.Start()
	return n, nil
}
