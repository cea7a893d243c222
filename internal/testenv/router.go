package testenv

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/flowplane/flowplane/internal/nsrun"
)

// The addresses of a Router's hosts, and the MACs its neighbour table gives them.
const (
	RouterInHost   = "198.18.1.10"
	RouterOutHost  = "198.18.2.10"
	RouterInHost6  = "fd00:1::10"
	RouterOutHost6 = "fd00:2::10"
)

var (
	RouterInMAC  = net.HardwareAddr{0x02, 0, 0, 0, 1, 0x10}
	RouterOutMAC = net.HardwareAddr{0x02, 0, 0, 0, 2, 0x10}
)

// Router is a router namespace for test runs of forwarding programs: an inside and an outside
// veth, each leading to a host namespace, forwarding on, and permanent neighbour entries for
// the hosts (IPv4 and IPv6), so bpf_fib_lookup resolves them without any traffic.
type Router struct {
	NS      string
	In, Out Veth // the router's ends
}

// NewRouter builds a Router, removed in t.Cleanup.
func NewRouter(t testing.TB) *Router {
	t.Helper()
	Privileged(t)
	rns, h1, h2 := Netns(t), Netns(t), Netns(t)
	in, _ := VethPair(t, rns, h1, netip.MustParsePrefix("198.18.1.1/24"), netip.MustParsePrefix(RouterInHost+"/24"))
	out, _ := VethPair(t, rns, h2, netip.MustParsePrefix("198.18.2.1/24"), netip.MustParsePrefix(RouterOutHost+"/24"))
	err := nsrun.Do(rns, func() error {
		for _, s := range []string{"ipv4/ip_forward", "ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(filepath.Join("/proc/sys/net", s), []byte("1"), 0o644); err != nil {
				return err
			}
		}
		for _, x := range []struct {
			v    Veth
			addr string
			mac  net.HardwareAddr
			self string
		}{{in, RouterInHost, RouterInMAC, ""}, {in, RouterInHost6, RouterInMAC, "fd00:1::1/64"}, {out, RouterOutHost, RouterOutMAC, ""}, {out, RouterOutHost6, RouterOutMAC, "fd00:2::1/64"}} {
			l, err := netlink.LinkByIndex(x.v.Index)
			if err != nil {
				return err
			}
			if x.self != "" {
				a, _ := netlink.ParseAddr(x.self)
				a.Flags = 0x02 // IFA_F_NODAD
				if err := netlink.AddrAdd(l, a); err != nil {
					return err
				}
			}
			fam := netlink.FAMILY_V4
			if netip.MustParseAddr(x.addr).Is6() {
				fam = netlink.FAMILY_V6
			}
			if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: x.v.Index, Family: fam, State: netlink.NUD_PERMANENT,
				IP: net.ParseIP(x.addr), HardwareAddr: x.mac}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("set up router namespace: %v", err)
	}
	return &Router{NS: rns, In: in, Out: out}
}
