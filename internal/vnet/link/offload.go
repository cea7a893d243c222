package link

import (
	"encoding/binary"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// UDP segmentation offload: one sendmsg carries many equal-sized packets (UDP_SEGMENT) and the
// receiving socket gets them back coalesced (UDP_GRO). On loopback that turns dozens of kernel
// traversals into one, which is most of the cost of a packet. Either side falls back to one
// datagram per packet when the kernel refuses.

const (
	maxGSOSegs  = 64
	maxGSOBytes = 65000 // a UDP datagram carries at most 65507 bytes
)

// enableGRO asks the kernel to coalesce received datagrams; it reports success.
func enableGRO(c *net.UDPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	_ = rc.Control(func(fd uintptr) {
		ok = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1) == nil
	})
	return ok
}

// gsoCmsg builds the control message asking the kernel to split a datagram into size-byte
// segments.
func gsoCmsg(b []byte, size int) []byte {
	n := unix.CmsgSpace(2)
	if cap(b) < n {
		b = make([]byte, n)
	}
	b = b[:n]
	clear(b)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level = unix.IPPROTO_UDP
	h.Type = unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(b[unix.CmsgLen(0):], uint16(size))
	return b
}

// groSize extracts the segment size from a received UDP_GRO control message, or 0.
func groSize(oob []byte) int {
	for len(oob) >= unix.CmsgLen(0) {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.CmsgLen(0) || l > len(oob) {
			return 0
		}
		if h.Level == unix.IPPROTO_UDP && h.Type == unix.UDP_GRO && l >= unix.CmsgLen(4) {
			return int(binary.NativeEndian.Uint32(oob[unix.CmsgLen(0):]))
		}
		sp := unix.CmsgSpace(l - unix.CmsgLen(0))
		if sp > len(oob) {
			return 0
		}
		oob = oob[sp:]
	}
	return 0
}
