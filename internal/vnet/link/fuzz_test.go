package link

import (
	"encoding/binary"
	"net/netip"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func FuzzGROSize(f *testing.F) {
	f.Add(gsoCmsg(nil, 1500))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, oob []byte) {
		if g := groSize(oob); g < 0 {
			t.Fatalf("negative size %d", g)
		}
	})
}

func TestGROSizeReadsCmsg(t *testing.T) {
	t.Parallel()
	b := make([]byte, unix.CmsgSpace(4))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_GRO
	h.SetLen(unix.CmsgLen(4))
	binary.NativeEndian.PutUint32(b[unix.CmsgLen(0):], 1448)
	if g := groSize(b); g != 1448 {
		t.Fatalf("got %d", g)
	}
}

// FuzzTAPFrame feeds arbitrary Ethernet frames to the TAP parser (ARP answers go to /dev/null).
func FuzzTAPFrame(f *testing.F) {
	arp := make([]byte, 14+28)
	binary.BigEndian.PutUint16(arp[12:], etherARP)
	binary.BigEndian.PutUint16(arp[14:], 1)
	binary.BigEndian.PutUint16(arp[16:], etherIPv4)
	arp[18], arp[19] = 6, 4
	binary.BigEndian.PutUint16(arp[20:], 1)
	copy(arp[38:42], []byte{198, 19, 0, 2})
	f.Add(arp)
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 8, 0, 0x45})
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		f.Fatal(err)
	}
	tp := &TAP{f: devnull, mtu: 1500, addr: netip.MustParseAddr("198.19.0.2"), wbuf: make([]byte, 1514)}
	f.Fuzz(func(t *testing.T, frame []byte) {
		tp.frame(frame, func(p []byte) {
			if len(p) > tp.mtu {
				t.Fatalf("oversized packet passed up: %d", len(p))
			}
		})
	})
}
