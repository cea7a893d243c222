package lab

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/flowplane/flowplane/internal/ipnet"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/topo"
)

// These run inside a node's namespace (nsrun.Do): /proc/sys/net and netlink act on the namespace
// of the calling thread.

func setupNode(n *topo.Node) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	forward := "0"
	if n.Kind == topo.Router {
		forward = "1"
	}
	for _, s := range []struct{ key, val string }{
		{"ipv4/ip_forward", forward},
		{"ipv6/conf/all/forwarding", forward},
		{"ipv6/conf/default/accept_dad", "0"}, // addresses usable at once; the lab has no duplicates
	} {
		if err := os.WriteFile(filepath.Join("/proc/sys/net", s.key), []byte(s.val), 0o644); err != nil {
			return fmt.Errorf("sysctl net.%s: %w", s.key, err)
		}
	}
	return nil
}

// addLink creates the veth pair straight into the two namespaces (it never exists in the
// host's), then configures each end.
func (l *Lab) addLink(link *topo.Link) error {
	if link.Impaired() {
		if err := l.addRelayedLink(link); err != nil {
			return err
		}
		return l.setupEnds(link)
	}
	hA, err := netns.GetFromPath(nsrun.Path(l.Netns(link.A.Node.Name)))
	if err != nil {
		return err
	}
	defer hA.Close()
	hB, err := netns.GetFromPath(nsrun.Path(l.Netns(link.B.Node.Name)))
	if err != nil {
		return err
	}
	defer hB.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: l.IfName(link.A), MTU: link.MTU, Namespace: netlink.NsFd(hA)},
		PeerName:      l.IfName(link.B),
		PeerMTU:       uint32(link.MTU),
		PeerNamespace: netlink.NsFd(hB),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/%s: %w", veth.Name, veth.PeerName, err)
	}
	return l.setupEnds(link)
}

// setupEnds configures the two node ends of a link.
func (l *Lab) setupEnds(link *topo.Link) error {
	for _, end := range []*topo.Iface{link.A, link.B} {
		if err := nsrun.Do(l.Netns(end.Node.Name), func() error { return l.setupIface(end) }); err != nil {
			return fmt.Errorf("%s %s: %w", end.Node.Name, end.Name, err)
		}
	}
	return nil
}

func (l *Lab) setupIface(ifc *topo.Iface) error {
	dev, err := netlink.LinkByName(l.IfName(ifc))
	if err != nil {
		return err
	}
	if ifc.Link.Impaired() {
		// The relay copies frames as they are: a checksum left to an offload would reach the
		// receiver unfinished, and a corrupted bit must hit the bytes a checksum covers. Without
		// checksum offload TSO goes too, so the relay sees wire-sized frames.
		if err := ethtoolSet(dev.Attrs().Name, ethtoolValue{ethtoolSetTxCsum, 0}); err != nil {
			return err
		}
	}
	if l.lossy() {
		// Loss is decided per skb, and one GSO skb can carry dozens of segments: losing them
		// together would be a burst, not the independent per-packet loss of a wire. Senders size
		// GSO skbs by their own device, and forwarded skbs stay whole until after the tcx hook,
		// so every interface of a lossy lab sends one segment per skb.
		if err := netlink.LinkSetGSOMaxSegs(dev, 1); err != nil {
			return fmt.Errorf("limit GSO to one segment: %w", err)
		}
	}
	for _, p := range []netip.Prefix{ifc.IPv4, ifc.IPv6} {
		addr := &netlink.Addr{IPNet: ipnet.FromPrefix(p)}
		if p.Addr().Is6() {
			addr.Flags = 0x02 // IFA_F_NODAD
		}
		if err := netlink.AddrAdd(dev, addr); err != nil {
			return fmt.Errorf("add address %s: %w", p, err)
		}
	}
	if err := netlink.LinkSetUp(dev); err != nil {
		return fmt.Errorf("bring up: %w", err)
	}
	if ifc.Peer().Node.XDP {
		if err := prepareXDPPeer(dev.Attrs().Name); err != nil {
			return err
		}
	}
	// A link's rate and loss apply to what each end sends (each end's own, if it gives them).
	// What an xdp node sends may leave by XDP redirect, which skips its qdisc and clsact: that
	// direction is impaired where it arrives instead (check refuses links between two xdp nodes).
	peer := ifc.Peer()
	shapeHere := ShapedEgress(ifc)
	if (ifc.Node.XDP || peer.Node.XDP) && !shapeHere {
		if err := addQueue(dev); err != nil {
			return err
		}
	}
	if shapeHere {
		if err := shape(dev, ifc.Rate); err != nil {
			return err
		}
	}
	if ifc.HasLoss && !ifc.Node.XDP && !ifc.Link.Impaired() { // a relay does its link's loss
		if err := l.attachLoss(ifc, dev); err != nil {
			return err
		}
	}
	if peer.Node.XDP {
		if peer.HasLoss {
			if err := l.attachLossXDP(ifc, dev); err != nil {
				return err
			}
		}
		if peer.Rate > 0 {
			if err := shapeIngress(dev, l.ifbName(ifc), peer.Rate); err != nil {
				return err
			}
		}
	}
	return nil
}

// ifbName names the ifb device that shapes what ifc receives: its own name with "i" after
// "fp" ("fpi<tag>-eth0"), within the 15 bytes of an interface name.
func (l *Lab) ifbName(ifc *topo.Iface) string {
	n := "fpi" + strings.TrimPrefix(l.IfName(ifc), "fp")
	if len(n) > 15 {
		n = n[:15]
	}
	return n
}

func (l *Lab) addRoutes(n *topo.Node) error {
	for _, r := range l.Topology.Routes(n) {
		dev, err := netlink.LinkByName(l.IfName(r.Dev))
		if err != nil {
			return err
		}
		route := &netlink.Route{LinkIndex: dev.Attrs().Index, Dst: ipnet.FromPrefix(r.Dst), Gw: r.Via.AsSlice()}
		if err := netlink.RouteAdd(route); err != nil {
			return fmt.Errorf("add route %s via %s: %w", r.Dst, r.Via, err)
		}
	}
	return nil
}

// lossy is true when some link of the lab drops packets with the loss program.
func (l *Lab) lossy() bool {
	for _, link := range l.Topology.Links {
		if (link.A.Loss > 0 || link.B.Loss > 0) && !link.Impaired() {
			return true
		}
	}
	return false
}
