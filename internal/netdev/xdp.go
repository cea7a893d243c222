// Package netdev reads what the kernel reports about a network device's XDP abilities, from the
// netdev generic netlink family (include/uapi/linux/netdev.h, Linux ≥ 6.3), as
// `ynl --family netdev --do dev-get` does.
package netdev

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

const (
	cmdDevGet       = 1 // NETDEV_CMD_DEV_GET
	aDevIfindex     = 1 // NETDEV_A_DEV_IFINDEX
	aDevXDPFeatures = 3 // NETDEV_A_DEV_XDP_FEATURES
)

// XDPFeatures is NETDEV_A_DEV_XDP_FEATURES.
type XDPFeatures uint64

// Native reports NETDEV_XDP_ACT_BASIC: the driver runs XDP itself (no generic fallback).
func (f XDPFeatures) Native() bool { return f&(1<<0) != 0 }

// Redirect reports NETDEV_XDP_ACT_NDO_XMIT: frames XDP redirects into the device are sent, not
// dropped. On veth the kernel sets it exactly when the peer has GRO or an XDP program.
func (f XDPFeatures) Redirect() bool { return f&(1<<2) != 0 }

// ErrNoFamily means the kernel has no netdev family (before Linux 6.3): features unknown.
var ErrNoFamily = errors.New("no netdev generic netlink family")

// ReadXDPFeatures asks the kernel for the XDP features of the device with ifindex in the
// calling thread's network namespace.
func ReadXDPFeatures(ifindex int) (XDPFeatures, error) {
	fam, err := netlink.GenlFamilyGet("netdev")
	if err != nil {
		return 0, ErrNoFamily
	}
	req := nl.NewNetlinkRequest(int(fam.ID), unix.NLM_F_REQUEST)
	// The header is written by hand: nl.Genlmsg serialises its reserved bytes from beyond the
	// struct (garbage), which the kernel's strict validation refuses with EINVAL.
	req.RawData = append([]byte{cmdDevGet, 1, 0, 0}, nl.NewRtAttr(aDevIfindex, nl.Uint32Attr(uint32(ifindex))).Serialize()...)
	msgs, err := req.Execute(unix.NETLINK_GENERIC, 0)
	if err != nil {
		return 0, fmt.Errorf("netdev dev-get: %w", err)
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofGenlmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofGenlmsg:])
		if err != nil {
			return 0, fmt.Errorf("netdev dev-get: %w", err)
		}
		for _, a := range attrs {
			if a.Attr.Type == aDevXDPFeatures && len(a.Value) >= 8 {
				return XDPFeatures(*(*uint64)(unsafe.Pointer(&a.Value[0]))), nil
			}
		}
	}
	return 0, ErrNoFamily
}
