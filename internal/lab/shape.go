package lab

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

// shape limits a device's egress to rate (bits/s) with one HTB class, as
// `tc qdisc add dev D root handle 1: htb default 1; tc class add dev D parent 1: classid 1:1
// htb rate R ceil R`. Burst sizes are tc's defaults (one jiffy of bytes plus an MTU).
func shape(dev netlink.Link, rate uint64) error {
	root := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT})
	root.Defcls = 1
	if err := netlink.QdiscAdd(root); err != nil {
		return fmt.Errorf("add htb qdisc: %w", err)
	}
	class := netlink.NewHtbClass(
		netlink.ClassAttrs{LinkIndex: dev.Attrs().Index, Parent: netlink.MakeHandle(1, 0), Handle: netlink.MakeHandle(1, 1)},
		netlink.HtbClassAttrs{Rate: rate, Ceil: rate},
	)
	if err := netlink.ClassAdd(class); err != nil {
		return fmt.Errorf("add htb class: %w", err)
	}
	return nil
}
