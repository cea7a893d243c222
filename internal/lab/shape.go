package lab

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/topo"
)

// ShapedEgress reports whether the lab shapes what ifc sends with shape's HTB (root 1:, class
// 1:1) on ifc's device: ifc has a rate (Iface.Rate: its endpoint's, else the link's) and is not
// on an xdp node, whose sending direction is shaped where it arrives instead (shapeIngress).
func ShapedEgress(ifc *topo.Iface) bool { return ifc.Rate > 0 && !ifc.Node.XDP }

// shape limits a device's egress to rate (bits/s) with one HTB class, as
// `tc qdisc add dev D root handle 1: htb default 1; tc class add dev D parent 1: classid 1:1
// htb rate R ceil R burst B cburst B`.
//
// B is the larger of 64 KiB (one GSO packet) and 2 ms at the rate, plus an MTU. tc's default, one
// jiffy of bytes, is smaller than a GSO packet, and on a busy machine every late HTB timer then
// loses sending time for good: measured here, 40mbit gave 0.83-0.90 of the rate with the default
// burst and 0.95-0.96 (the TCP goodput ceiling is 1448/1514 = 0.956) with this one.
func shape(dev netlink.Link, rate uint64) error {
	root := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT})
	root.Defcls = 1
	if err := netlink.QdiscAdd(root); err != nil {
		return fmt.Errorf("add htb qdisc: %w", err)
	}
	burst := uint32(max(64<<10, rate/8*2/1000) + uint64(dev.Attrs().MTU) + 14)
	// A lone class never shares, so its quantum only needs to be legal (tc warns above 200000).
	quantum := uint32(min(max(rate/8/10, 1514), 200000))
	class := netlink.NewHtbClass(
		netlink.ClassAttrs{LinkIndex: dev.Attrs().Index, Parent: netlink.MakeHandle(1, 0), Handle: netlink.MakeHandle(1, 1)},
		netlink.HtbClassAttrs{Rate: rate, Ceil: rate, Buffer: burst, Cbuffer: burst, Quantum: quantum},
	)
	if err := netlink.ClassAdd(class); err != nil {
		return fmt.Errorf("add htb class: %w", err)
	}
	return nil
}

// shapeIngress limits what dev receives to rate (bits/s): its clsact ingress redirects every
// packet to an ifb device of its own (ifbName, in dev's namespace), whose egress is shaped as
// shape does; ifb then hands the packets back to dev's receive path. Used where the sender
// forwards with XDP redirects, which skip the sender's qdisc (docs/lab.md).
func shapeIngress(dev netlink.Link, ifbName string, rate uint64) error {
	ifb := &netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: ifbName, MTU: dev.Attrs().MTU, TxQLen: 1000}}
	if err := netlink.LinkAdd(ifb); err != nil {
		return fmt.Errorf("add ifb %s: %w", ifbName, err)
	}
	il, err := netlink.LinkByName(ifbName)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(il); err != nil {
		return fmt.Errorf("bring up %s: %w", ifbName, err)
	}
	if err := shape(il, rate); err != nil {
		return err
	}
	if err := ensureClsact(dev); err != nil {
		return err
	}
	// u32 with no selector matches everything (this kernel has no cls_matchall).
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: dev.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
			Priority: 2, Protocol: unix.ETH_P_ALL},
		Actions: []netlink.Action{netlink.NewMirredAction(il.Attrs().Index)},
	}
	if err := netlink.FilterAdd(f); err != nil {
		return fmt.Errorf("redirect ingress of %s to %s: %w", dev.Attrs().Name, ifbName, err)
	}
	return nil
}
