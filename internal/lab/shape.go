package lab

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

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
