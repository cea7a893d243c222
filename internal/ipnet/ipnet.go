// Package ipnet holds what subsystems share about IP networks: net/netip values converted for
// the netlink API, interfaces by name, and IP protocol names.
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

// Protocols are the IP protocol numbers by the names every subsystem prints and accepts (as
// /etc/protocols, lowercase; ipv6-icmp is icmpv6's other name).
var Protocols = map[string]uint8{"icmp": 1, "tcp": 6, "udp": 17, "gre": 47, "esp": 50, "icmpv6": 58, "ipv6-icmp": 58, "sctp": 132}

// ProtoName is protocol p's name ("tcp"), or its number when it has none here.
func ProtoName(p uint8) string {
	best := ""
	for name, n := range Protocols {
		if n == p && (best == "" || len(name) < len(best)) { // icmpv6, not ipv6-icmp
			best = name
		}
	}
	if best == "" {
		return fmt.Sprint(p)
	}
	return best
}
