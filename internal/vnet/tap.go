package vnet

import (
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/ipnet"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/topo"
	"github.com/flowplane/flowplane/internal/vnet/link"
)

// TAPSpec gives Node an extra interface on a TAP device created in the existing network
// namespace Netns, so Linux there can ping and talk TCP to the vnet (needs root). The link gets
// the first /24 of 198.18.0.0/15 no link uses: vnet takes .1, Linux .2, and Linux routes
// 198.18.0.0/15 through vnet. RIP advertises the subnet but sends nothing to Linux.
type TAPSpec struct {
	Node  string
	Netns string
}

// ParseTAPSpec reads NODE=NETNS.
func ParseTAPSpec(s string) (TAPSpec, error) {
	node, ns, ok := strings.Cut(s, "=")
	if !ok || node == "" || ns == "" {
		return TAPSpec{}, cli.Usagef("--tap %q: write NODE=NETNS, e.g. --tap r1=mylinux (create the namespace with ip netns add)", s)
	}
	return TAPSpec{Node: node, Netns: ns}, nil
}

var vnetPool = netip.MustParsePrefix("198.18.0.0/15")

// tapSubnets picks one free /24 per spec.
func tapSubnets(t *topo.Topology, n int) ([]netip.Prefix, error) {
	var used []netip.Prefix
	for _, l := range t.Links {
		used = append(used, l.A.IPv4.Masked())
	}
	var out []netip.Prefix
	for p := netip.PrefixFrom(vnetPool.Addr(), 24); vnetPool.Contains(p.Addr()) && len(out) < n; {
		free := true
		for _, u := range append(used, out...) {
			if u.Overlaps(p) {
				free = false
				break
			}
		}
		if free {
			out = append(out, p)
		}
		a := p.Addr().As4()
		a[2]++
		if a[2] == 0 {
			a[1]++
		}
		p = netip.PrefixFrom(netip.AddrFrom4(a), 24)
	}
	if len(out) < n {
		return nil, errors.New("no free /24 left in 198.18.0.0/15 for TAP links")
	}
	return out, nil
}

type tapIface struct {
	node string
	cfg  IfaceConfig
}

// openTAPs creates the TAP devices of specs; the caller closes them on failure.
func openTAPs(t *topo.Topology, specs []TAPSpec) ([]tapIface, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	subnets, err := tapSubnets(t, len(specs))
	if err != nil {
		return nil, cli.Usage(err)
	}
	var out []tapIface
	fail := func(err error) ([]tapIface, error) {
		for _, ti := range out {
			ti.cfg.Link.Close()
		}
		return nil, err
	}
	count := map[string]int{}
	for k, s := range specs {
		tn := t.Node(s.Node)
		if tn == nil {
			return fail(cli.Usagef("--tap %s=%s: no node %q in %s", s.Node, s.Netns, s.Node, t.File))
		}
		if _, err := os.Stat(nsrun.Path(s.Netns)); err != nil {
			return fail(cli.Usagef("--tap %s=%s: no network namespace %q; create it with `ip netns add %s`", s.Node, s.Netns, s.Netns, s.Netns))
		}
		sub := subnets[k]
		vaddr := netip.PrefixFrom(sub.Addr().Next(), 24)
		laddr := netip.PrefixFrom(vaddr.Addr().Next(), 24)
		tap, err := openTAPIn(s.Netns, vaddr, laddr)
		if err != nil {
			return fail(fmt.Errorf("--tap %s=%s: %w", s.Node, s.Netns, err))
		}
		out = append(out, tapIface{node: s.Node, cfg: IfaceConfig{Name: fmt.Sprintf("tap%d", count[s.Node]), Addr: vaddr,
			Peer: laddr.Addr(), Link: tap, Passive: true}})
		count[s.Node]++
	}
	return out, nil
}

// openTAPIn creates a TAP device in netns, addresses the Linux side and routes vnet through it.
func openTAPIn(netns string, vaddr, laddr netip.Prefix) (*link.TAP, error) {
	b := make([]byte, 3)
	_, _ = crand.Read(b)
	name := "fpv" + hex.EncodeToString(b)
	var tap *link.TAP
	err := nsrun.Do(netns, func() error {
		var err error
		if tap, err = link.OpenTAP(name, 1500, vaddr.Addr()); err != nil {
			return err
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipnet.FromPrefix(laddr)}); err != nil {
			return fmt.Errorf("address %s: %w", laddr, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipnet.FromPrefix(vnetPool), Gw: vaddr.Addr().AsSlice()}); err != nil {
			return fmt.Errorf("route %v via %v: %w", vnetPool, vaddr.Addr(), err)
		}
		return nil
	})
	if err != nil && tap != nil {
		tap.Close()
	}
	return tap, err
}
