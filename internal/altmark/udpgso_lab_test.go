package altmark

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// sendGSO sends n datagrams of seg bytes from h1 to addr:port in one UDP GSO send
// (UDP_SEGMENT): one GSO packet at h1's egress.
func sendGSO(t *testing.T, l *lab.Lab, addr string, port, n, seg int) {
	t.Helper()
	err := nsrun.Do(l.Netns("h1"), func() error {
		c, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: net.ParseIP(addr), Port: port})
		if err != nil {
			return err
		}
		defer c.Close()
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT, seg) }); err != nil {
			return err
		}
		if serr != nil {
			return serr
		}
		_, err = c.Write(make([]byte, n*seg))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLabMarkUDPGSO: a UDP GSO send from h1 is one GSO packet at the marker. With room for the
// header in every segment, the marker inserts it keeping gso_size (the kernel grows UDP GSO only
// so: gso_size delimits datagrams) and every datagram reaches h2 with the option; when one
// segment plus the header would exceed the MTU, the packet is passed unmarked (too_big) and
// still arrives.
func TestLabMarkUDPGSO(t *testing.T) {
	t.Parallel()
	testenv.Need(t, "tcpdump")
	l := labtest.Up(t, hostHost)
	dev := labDev(t, l, "h1")
	markIn(t, l, "h1", dev, "carrier: ipv6-altmark\nperiod: 100ms\nflowmon_id: 3\nselect: {protocols: [udp]}\n")
	h2 := labtest.Addr(t, l, "h2", "6")
	var srv *net.UDPConn
	if err := nsrun.Do(l.Netns("h2"), func() (err error) {
		srv, err = net.ListenUDP("udp6", &net.UDPAddr{IP: net.ParseIP(h2), Port: 7001})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	recv := func(n, size int) int {
		got, buf := 0, make([]byte, 2000)
		_ = srv.SetReadDeadline(time.Now().Add(3 * time.Second))
		for got < n {
			m, err := srv.Read(buf)
			if err != nil {
				break
			}
			if m == size {
				got++
			}
		}
		return got
	}
	// 1000-byte datagrams: 40 + 8 + 8 + 1000 = 1056 bytes per datagram with the header.
	ps := labtest.Capture(t, l, "h2", []string{"-i", labDev(t, l, "h2"), "ip6 and src host " + labtest.Addr(t, l, "h1", "6")}, func() {
		sendGSO(t, l, h2, 7001, 8, 1000)
		if got := recv(8, 1000); got != 8 {
			t.Errorf("h2 received %d of 8 datagrams", got)
		}
	})
	// A veth hands the GSO packet to h2 whole (h2's UDP segments it): what crosses is one packet
	// of 8 datagrams, or segments, each with the option; their UDP payloads add up to 8000.
	udps, with, payload := 0, 0, 0
	for _, p := range ps {
		udp, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if udp == nil || udp.DstPort != 7001 {
			continue
		}
		udps++
		if opt, ok := altmarkData(p, false); ok && binary.BigEndian.Uint32(opt)>>12 == 3 {
			with++
		}
		payload += p.Metadata().Length - 14 - 40 - 8 - 8
	}
	if udps == 0 || with != udps || payload != 8*1000 {
		t.Errorf("%d UDP packets to h2, %d with the option (FlowMonID 3), %d payload bytes (want 8000)", udps, with, payload)
	}
	st := markStatusIn(t, l, "h1")
	if st.Counters["inserted"] != 1 || st.Counters["adjust_failed"] != 0 {
		t.Errorf("one GSO packet: counters %v", st.Counters)
	}

	// 1452-byte datagrams fill the 1500-byte MTU: no room for 8 more bytes in a segment.
	sendGSO(t, l, h2, 7001, 4, 1452)
	if got := recv(4, 1452); got != 4 {
		t.Errorf("h2 received %d of 4 full-size datagrams", got)
	}
	st = markStatusIn(t, l, "h1")
	if st.Counters["too_big"] != 1 || st.Counters["inserted"] != 1 {
		t.Errorf("a GSO packet of full-size segments: counters %v", st.Counters)
	}
}
