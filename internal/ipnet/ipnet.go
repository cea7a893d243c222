// Package ipnet holds what subsystems share about IP networks: net/netip values converted for
// the netlink API, interfaces by name, and IP protocol names.
package ipnet

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
)

// FromPrefix keeps the address bits (an interface address, not only its network).
func FromPrefix(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Network refuses a prefix with host bits set, as ip route does: 198.18.1.5/24 is a typo or an
// address meant as /32, and masking it silently would match what the user did not write.
func Network(p netip.Prefix) error {
	if p == p.Masked() {
		return nil
	}
	return fmt.Errorf("%s has host bits set; write %s (the network) or %s/%d (the address)",
		p, p.Masked(), p.Addr(), p.Addr().BitLen())
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

// protoNames are the IP protocols every subsystem prints and accepts by name (as
// /etc/protocols, lowercase); protoAliases their other names.
var (
	protoNames   = map[uint8]string{1: "icmp", 6: "tcp", 17: "udp", 47: "gre", 50: "esp", 58: "icmpv6", 132: "sctp"}
	protoAliases = map[string]uint8{"ipv6-icmp": 58}
)

// ProtoName is protocol p's name ("tcp"), or its number when it has none here.
func ProtoName(p uint8) string {
	if n, ok := protoNames[p]; ok {
		return n
	}
	return strconv.Itoa(int(p))
}

// ProtoNumber is the number of the protocol called name.
func ProtoNumber(name string) (uint8, bool) {
	for p, n := range protoNames {
		if n == name {
			return p, true
		}
	}
	p, ok := protoAliases[name]
	return p, ok
}

// ProtoNameList is every name ProtoNumber knows, sorted.
func ProtoNameList() []string {
	out := slices.Collect(maps.Values(protoNames))
	out = append(out, slices.Collect(maps.Keys(protoAliases))...)
	slices.Sort(out)
	return out
}
