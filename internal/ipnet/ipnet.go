// Package ipnet converts between net/netip values and the net.IPNet the netlink API takes.
package ipnet

import (
	"fmt"
	"net"
	"net/netip"
)

// FromPrefix keeps the address bits (an interface address, not only its network).
func FromPrefix(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Addr converts a net.IP, unmapping IPv4-in-IPv6 forms.
func Addr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// Interface finds a network interface of the calling thread's namespace by name. The error
// reads as every subsystem's does: `interface "x": no such network interface`.
func Interface(name string) (*net.Interface, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return nil, fmt.Errorf("interface %q: no such network interface", name)
	}
	return ifc, nil
}
