package link

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TAP is a link to a Linux TAP device: the kernel's side of the device is an ordinary Ethernet
// interface (in whatever namespace it was created), so Linux ping and TCP talk to vnet. The TAP
// link speaks just enough Ethernet for that: it answers ARP for its own address, learns the
// kernel's MAC from the frames the kernel sends, and carries IPv4.
type TAP struct {
	f      *os.File
	name   string
	mtu    int
	mac    [6]byte    // our (vnet's) MAC on the segment
	addr   netip.Addr // our IPv4 address, answered in ARP
	peer   atomic.Pointer[[6]byte]
	closed atomic.Bool
	wmu    sync.Mutex
	wbuf   []byte
	Stats  Stats
	// ARP and non-IPv4 frames handled or dropped.
	ARPReplies, NonIP atomic.Uint64
}

const (
	ethHeader = 14
	etherIPv4 = 0x0800
	etherARP  = 0x0806
)

// OpenTAP creates (or attaches to) TAP device name in the calling thread's network namespace;
// run it inside nsrun.Do to put the device in a namespace. addr is vnet's address on the link.
func OpenTAP(name string, mtu int, addr netip.Addr) (*TAP, error) {
	if len(name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("tap name %q longer than %d bytes", name, unix.IFNAMSIZ-1)
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var req [unix.IFNAMSIZ + 64]byte
	copy(req[:], name)
	binary.NativeEndian.PutUint16(req[unix.IFNAMSIZ:], unix.IFF_TAP|unix.IFF_NO_PI)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); e != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("create tap %s: %w", name, e)
	}
	t := &TAP{f: os.NewFile(uintptr(fd), "/dev/net/tun:"+name), name: name, mtu: mtu, addr: addr,
		wbuf: make([]byte, ethHeader+mtu)}
	// A locally administered MAC derived from the address, so captures are readable.
	a := addr.As4()
	t.mac = [6]byte{0x02, 0xf9, a[0], a[1], a[2], a[3]}
	// Linux TCP ignores frames not addressed to its MAC (broadcast will not do), so learn the
	// kernel side's MAC now rather than wait for its first frame.
	if mac, err := hwaddr(name); err == nil {
		t.peer.Store(&mac)
	}
	return t, nil
}

// hwaddr reads an interface's MAC in the calling thread's namespace (SIOCGIFHWADDR).
func hwaddr(name string) ([6]byte, error) {
	var mac [6]byte
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return mac, err
	}
	defer unix.Close(s)
	var req [unix.IFNAMSIZ + 24]byte // struct ifreq: name, then a sockaddr
	copy(req[:], name)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(s), unix.SIOCGIFHWADDR, uintptr(unsafe.Pointer(&req[0]))); e != 0 {
		return mac, e
	}
	copy(mac[:], req[unix.IFNAMSIZ+2:])
	return mac, nil
}

// Name is the kernel interface name.
func (t *TAP) Name() string { return t.name }

// MTU is the IP MTU of the link.
func (t *TAP) MTU() int { return t.mtu }

// Start reads frames in a goroutine, handing IPv4 packets to handle.
func (t *TAP) Start(handle func([]byte), flush func()) {
	go func() {
		buf := make([]byte, ethHeader+t.mtu+4)
		for {
			n, err := t.f.Read(buf)
			if err != nil {
				if t.closed.Load() || errors.Is(err, os.ErrClosed) {
					return
				}
				time.Sleep(time.Millisecond) // EIO while the device is down: do not spin
				continue
			}
			t.frame(buf[:n], handle)
			flush()
		}
	}()
}

func (t *TAP) frame(f []byte, handle func([]byte)) {
	if len(f) < ethHeader {
		t.Stats.RxForeign.Add(1)
		return
	}
	var src [6]byte
	copy(src[:], f[6:12])
	switch binary.BigEndian.Uint16(f[12:]) {
	case etherIPv4:
		t.learn(src)
		t.Stats.receive(f[ethHeader:], t.mtu, handle)
	case etherARP:
		t.arp(f[ethHeader:], src)
	default:
		t.NonIP.Add(1) // IPv6 neighbour discovery and the like: vnet is IPv4 only
	}
}

// learn records the kernel's MAC address; it stores only changes, so a frame costs no allocation.
func (t *TAP) learn(src [6]byte) {
	if p := t.peer.Load(); p == nil || *p != src {
		t.peer.Store(&src)
	}
}

// arp answers requests for our address (RFC 826), learning the asker.
func (t *TAP) arp(p []byte, src [6]byte) {
	if len(p) < 28 || binary.BigEndian.Uint16(p[0:]) != 1 || binary.BigEndian.Uint16(p[2:]) != etherIPv4 || p[4] != 6 || p[5] != 4 {
		t.Stats.RxForeign.Add(1)
		return
	}
	t.learn(src)
	if binary.BigEndian.Uint16(p[6:]) != 1 || netip.AddrFrom4([4]byte(p[24:28])) != t.addr {
		return // a reply, or a request for someone else
	}
	var r [ethHeader + 28]byte
	copy(r[0:6], p[8:14]) // to the sender's hardware address
	copy(r[6:12], t.mac[:])
	binary.BigEndian.PutUint16(r[12:], etherARP)
	a := r[ethHeader:]
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], etherIPv4)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 2) // reply
	copy(a[8:14], t.mac[:])
	copy(a[14:18], p[24:28]) // our address
	copy(a[18:24], p[8:14])
	copy(a[24:28], p[14:18])
	t.ARPReplies.Add(1)
	t.wmu.Lock()
	_, _ = t.f.Write(r[:])
	t.wmu.Unlock()
}

// Send writes an IPv4 packet to the kernel in an Ethernet frame. Until the kernel has sent us a
// frame (it always ARPs first) the destination is broadcast, which Linux accepts.
func (t *TAP) Send(pkt []byte) {
	if len(pkt) > t.mtu || t.closed.Load() {
		t.Stats.TxDropped.Add(1)
		return
	}
	dst := [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if p := t.peer.Load(); p != nil {
		dst = *p
	}
	t.wmu.Lock()
	defer t.wmu.Unlock()
	f := t.wbuf[:ethHeader+len(pkt)]
	copy(f[0:6], dst[:])
	copy(f[6:12], t.mac[:])
	binary.BigEndian.PutUint16(f[12:], etherIPv4)
	copy(f[ethHeader:], pkt)
	if _, err := t.f.Write(f); err != nil {
		t.Stats.TxDropped.Add(1)
		return
	}
	t.Stats.TxPackets.Add(1)
	t.Stats.TxBytes.Add(uint64(len(pkt)))
}

// Close removes the device (a non-persistent TAP disappears with its last descriptor).
func (t *TAP) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	return t.f.Close()
}
