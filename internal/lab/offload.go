package lab

import (
	"fmt"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Legacy ethtool commands (linux/ethtool.h) that switch one offload each; the kernel maps them
// onto the device's feature bits, as `ethtool -K DEV tx off gro on` does.
const (
	ethtoolSetTxCsum = 0x17 // ETHTOOL_STXCSUM: every tx checksum feature
	ethtoolSetGRO    = 0x2c // ETHTOOL_SGRO
)

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	cmd, data uint32
}

// ifreqData is struct ifreq with its union used as ifr_data.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [16]byte // the rest of the union
}

// prepareXDPPeer sets up ifname, the interface at the other end of a link from a node that
// forwards with XDP redirects (topo.Node.XDP). A frame redirected into a veth reaches its peer
// only through the peer's NAPI, which GRO provides; and a redirected frame has lost the skb's
// checksum state, so its sender must write complete checksums instead of leaving them to an
// offload (CHECKSUM_PARTIAL). docs/conntrack.md has the details.
func prepareXDPPeer(ifname string) error {
	return ethtoolSet(ifname, ethtoolValue{ethtoolSetGRO, 1}, ethtoolValue{ethtoolSetTxCsum, 0})
}

// ethtoolSet applies legacy ethtool settings to ifname, in the calling thread's namespace.
func ethtoolSet(ifname string, settings ...ethtoolValue) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	for _, v := range settings {
		ifr := ifreqData{data: unsafe.Pointer(&v)}
		copy(ifr.name[:unix.IFNAMSIZ-1], ifname)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
			return fmt.Errorf("ethtool command %#x = %d on %s: %w", v.cmd, v.data, ifname, errno)
		}
	}
	return nil
}

// addQueue gives dev, an unshaped interface on a link of an XDP node, a pfifo_fast root qdisc
// (a NIC's default) in place of veth's noqueue. With GRO or XDP on, a veth receives through a
// ring of 256 frames; a sender with a qdisc stops its queue while the ring is full and the burst
// waits, where noqueue drops it (measured: 8 TCP flows through conntrack lost 200,000 segments
// in 4 s without it). Both ends get one, so the kernel's own forwarding out of the XDP node
// (XDP_PASS, or no program) queues too.
func addQueue(dev netlink.Link) error {
	q := &netlink.GenericQdisc{QdiscType: "pfifo_fast",
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}}
	if err := netlink.QdiscAdd(q); err != nil {
		return fmt.Errorf("add pfifo_fast qdisc to %s: %w", dev.Attrs().Name, err)
	}
	return nil
}
