package conntrack

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/testenv"
)

// TestTCHook runs the scripted data-path tests on the TC build of the program: the same
// source, so the same verdicts (mapped from TC_ACT_*) and the same table states.
func TestTCHook(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"TCPLifecycle", TestTCPLifecycle},
		{"TCPInvalid", TestTCPInvalid},
		{"TCPWindowEdges", TestTCPWindowEdges},
		{"TCPSACK", TestTCPSACK},
		{"TCPResync", TestTCPResync},
		{"TCPRSTAfterIgnored", TestTCPRSTAfterIgnored},
		{"TCPHandshakeCorners", TestTCPHandshakeCorners},
		{"UDP", TestUDP},
		{"ICMP", TestICMP},
		{"IPv6", TestIPv6},
		{"ForwardRewrites", TestForwardRewrites},
		{"TrackMode", TestTrackMode},
		{"AllowPolicy", TestAllowPolicy},
		{"TCPPickup", TestTCPPickup},
		{"NotForUs", TestNotForUs},
	} {
		t.Run(c.name, c.fn)
	}
}

// TestTCVerdicts checks the TC program's own verdicts and output bytes: a handshake redirected
// (TC_ACT_REDIRECT) with the MACs rewritten and the TTL decremented, an out-of-window segment
// and an unsolicited outside SYN dropped (TC_ACT_SHOT), and the route cache keeping the
// length whose MTU check passed, as in XDP.
func TestTCVerdicts(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	f := newFixture(t, &Config{Hook: HookTC})
	if f.d.Program().Type().String() != "SchedCLS" {
		t.Fatalf("program type %s, want SchedCLS", f.d.Program().Type())
	}
	ci, si := uint32(1000), uint32(5000)
	for _, s := range []struct {
		name  string
		frame []byte
		out   bool
		ret   uint32
		state string
	}{
		{"unsolicited outside syn", tcpOpen(false, "S", si, 0), true, tcShot, "-"},
		{"syn", tcpOpen(true, "S", ci, 0), false, tcRedirect, "SYN_SENT"},
		{"synack", tcpOpen(false, "SA", si, ci+1), true, tcRedirect, "SYN_RECV"},
		{"ack", tcp(true, "A", ci+1, si+1, 0), false, tcRedirect, "ESTABLISHED"},
		{"data", tcp(true, "PA", ci+1, si+1, 1000), false, tcRedirect, "ESTABLISHED"},
		{"data far beyond the window", tcp(true, "PA", ci+1+10_000_000, si+1, 100), false, tcShot, "ESTABLISHED"},
		{"reply", tcp(false, "A", si+1, ci+1001, 0), true, tcRedirect, "ESTABLISHED"},
		{"reply from the route cache", tcp(false, "A", si+1, ci+1001, 0), true, tcRedirect, "ESTABLISHED"},
	} {
		in, egress, dmac := f.in.Index, f.out, outMAC
		if s.out {
			in, egress, dmac = f.out.Index, f.in, inMAC
		}
		ret, out := f.runRaw(s.frame, in)
		if ret != s.ret {
			t.Fatalf("%s: verdict %d, want %d (counters %v)", s.name, ret, s.ret, f.counters())
		}
		got := "-"
		if es := f.entries(); len(es) == 1 {
			got = es[0].State
		}
		if got != s.state {
			t.Fatalf("%s: state %s, want %s", s.name, got, s.state)
		}
		if ret != tcRedirect {
			continue
		}
		p := packet.Decode(out)
		eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if eth.DstMAC.String() != dmac.String() || eth.SrcMAC.String() != netHW(egress.MAC) {
			t.Errorf("%s: MACs %s → %s, want %s → %s", s.name, eth.SrcMAC, eth.DstMAC, netHW(egress.MAC), dmac)
		}
		if ip.TTL != 63 {
			t.Errorf("%s: TTL %d, want 63", s.name, ip.TTL)
		}
		// The decremented TTL's checksum must verify: the header sums to 0xffff.
		var sum uint32
		hdr := out[14 : 14+20]
		for i := 0; i < len(hdr); i += 2 {
			sum += uint32(hdr[i])<<8 | uint32(hdr[i+1])
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		if sum != 0xffff {
			t.Errorf("%s: IP header checksum does not verify (sum %#x)", s.name, sum)
		}
	}
	if c := f.counters(); c["forwarded"] != 6 || c["policy_drop"] != 1 || c["invalid_window"] != 1 {
		t.Errorf("counters %v", c)
	}
	// The cache holds the length whose MTU check passed: the reply's, 40 bytes (IPv4 + TCP).
	r := f.entries()[0].raw.Route[1]
	if r.Checked == 0 || int(r.Ifindex) != f.in.Index || r.LenOk != 40 {
		t.Errorf("reply route cache %+v, want egress %d with 40 as len_ok", r, f.in.Index)
	}
	// Longer than the MTU and not GSO: the lookup refuses it (FRAG_NEEDED) and the kernel
	// answers; the cached route must not let it through.
	big := packet.IP(outHost, inHost).TCP(80, 40000, "A").Seq(si + 1).Ack(ci + 1001).Payload(make([]byte, 1600)).Bytes()
	if ret, _ := f.runRaw(big, f.out.Index); ret != tcOK {
		t.Errorf("packet over the MTU: verdict %d, want %d (to the kernel)", ret, tcOK)
	}
}

// TestLabTC runs conntrack with the tc hook on r1 of a plain lab (the hosts keep their default
// offloads, checksum offload on) with GRO on r1's veths, so the program sees GRO aggregates:
// a TCP echo and iperf3 go through, ping works, an unsolicited outside connection is refused
// and `list` shows the TCP connection ESTABLISHED.
func TestLabTC(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "iperf3", "ethtool", "ping", "ip")
	c := newCtLab(t, &Config{Hook: HookTC})
	r1, err := c.l.Node("r1")
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range r1.Ifaces {
		labtest.Run(t, c.l, "r1", "ethtool", "-K", c.l.IfName(ifc), "gro", "on")
	}
	// Attached at tcx ingress of both interfaces, and no XDP program.
	for _, ifc := range r1.Ifaces {
		name := c.l.IfName(ifc)
		if n := tcxIngress(t, c, name); n != 1 {
			t.Errorf("%s: %d tcx ingress programs, want 1", name, n)
		}
		if out := labtest.Run(t, c.l, "r1", "ip", "-d", "link", "show", name); strings.Contains(out, "prog/xdp") {
			t.Errorf("an XDP program is attached with --hook tc:\n%s", out)
		}
	}
	c.listen("h2", 8080)
	c.listen("h1", 8081)

	t.Run("tcp echo and list", func(t *testing.T) {
		conn, err := c.dial("h1", "tcp", net.JoinHostPort(c.h2, "8080"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		sport := uint16(conn.LocalAddr().(*net.TCPAddr).Port)
		msg := strings.Repeat("x", 4<<20)
		go func() { _, _ = conn.Write([]byte(msg)) }()
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Fatalf("echo: %v", err)
		}
		// What `flowplane conntrack list --json` prints in r1's namespace.
		var out bytes.Buffer
		err = nsrun.Do(c.l.Netns("r1"), func() error {
			cmd := listCmd()
			cmd.SetArgs([]string{"--json", "--proto", "tcp"})
			cmd.SetOut(&out)
			cmd.SetErr(io.Discard)
			return cmd.Execute()
		})
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		var es []Entry
		if err := json.Unmarshal(out.Bytes(), &es); err != nil {
			t.Fatalf("list --json: %v\n%s", err, out.String())
		}
		e := find(es, "tcp", c.h1, sport, 8080)
		if e == nil || e.State != "ESTABLISHED" || !e.Assured || !e.Confirmed {
			t.Fatalf("list during the connection: %+v\n%s", e, out.String())
		}
		if e.Bytes[0] < uint64(len(msg)) || e.Bytes[1] < uint64(len(msg)) {
			t.Errorf("entry counted %v bytes, want at least %d each way", e.Bytes, len(msg))
		}
	})

	t.Run("ping", c.pingThrough)

	t.Run("unsolicited from outside refused", func(t *testing.T) {
		before := c.counters()["policy_drop"]
		if conn, err := c.dial("h2", "tcp", net.JoinHostPort(c.h1, "8081"), time.Second); err == nil {
			conn.Close()
			t.Fatal("h2 connected to h1 through the firewall")
		}
		if after := c.counters()["policy_drop"]; after <= before {
			t.Errorf("policy_drop %d → %d", before, after)
		}
	})

	t.Run("iperf3", func(t *testing.T) {
		before := c.counters()
		r := labtest.Iperf(t, c.l, "h1", "h2", c.h2, "-t", "2")
		if r.ReceivedBPS <= 0 {
			t.Fatalf("iperf3: %+v", r)
		}
		after := c.counters()
		t.Logf("iperf3 through conntrack --hook tc: %.2f Gbit/s, %d retransmits; counters %v", r.ReceivedBPS/1e9, r.Retransmits, diff(before, after))
		if after["invalid_window"]+after["invalid_tcp_state"]+after["invalid_malformed"] != 0 {
			t.Errorf("a clean transfer counted invalid packets: %v", after)
		}
		if after["forwarded"]-before["forwarded"] < 100 {
			t.Errorf("forwarded %d → %d: the transfer did not go through the program", before["forwarded"], after["forwarded"])
		}
		// GRO on r1: the data connection's packets are aggregates, longer than the MTU on
		// average.
		var data *Entry
		es := c.entries()
		for i, e := range es {
			if e.Proto == "tcp" && e.Orig.Dport != 8080 && (data == nil || e.Bytes[0] > data.Bytes[0]) {
				data = &es[i]
			}
		}
		if data == nil || data.Packets[0] == 0 {
			t.Fatalf("no iperf3 data connection in the table: %+v", es)
		}
		if avg := data.Bytes[0] / data.Packets[0]; avg <= 1500 {
			t.Errorf("average packet %d bytes: no GRO aggregates reached the program", avg)
		} else {
			t.Logf("average forwarded packet of the data connection: %d bytes", avg)
		}
	})

	t.Run("detach", func(t *testing.T) {
		c.stop()
		for _, ifc := range r1.Ifaces {
			if n := tcxIngress(t, c, c.l.IfName(ifc)); n != 0 {
				t.Errorf("%s: %d tcx ingress programs left after run ended", c.l.IfName(ifc), n)
			}
		}
		if len(c.entries()) == 0 {
			t.Error("the pinned table is empty after run ended")
		}
	})
}

// TestHookSwitchKeepsTable loads the XDP program on pinned tables, opens a connection, then
// loads the TC program in its place: it finds the connection in the same tables.
func TestHookSwitchKeepsTable(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	f := newFixture(t, nil)
	load := func(hook string) *fixture {
		t.Helper()
		cfg := &Config{Hook: hook, Inside: []string{"in"}, Outside: []string{"out"}}
		r, err := cfg.resolve()
		if err != nil {
			t.Fatal(err)
		}
		var d *Datapath
		err = nsrun.Do(f.ns, func() error {
			inst, err := Instance()
			if err != nil {
				return err
			}
			t.Cleanup(func() { _ = unpinInstance(inst) })
			d, err = Load(r)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		if err := d.AddInterface(f.in.Index, true); err != nil {
			t.Fatal(err)
		}
		if err := d.AddInterface(f.out.Index, false); err != nil {
			t.Fatal(err)
		}
		g := *f
		g.d, g.tables = d, d.Tables()
		return &g
	}
	ci, si := uint32(1000), uint32(5000)
	x := load(HookXDP)
	x.script(t, handshake(ci, si))
	x.d.Close()
	tc := load(HookTC)
	if tc.d.Hook() != HookTC {
		t.Fatalf("hook %s", tc.d.Hook())
	}
	tc.script(t, []step{
		{name: "data after the switch", frame: tcp(true, "PA", ci+1, si+1, 100), ret: xdpRedirect, state: "ESTABLISHED"},
		{name: "reply after the switch", frame: tcp(false, "A", si+1, ci+101, 0), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
	})
	if e := tc.entries()[0]; e.Packets != [2]uint64{3, 2} {
		t.Errorf("packets %v, want [3 2]: the counts of both programs", e.Packets)
	}
}

// tcxIngress counts the programs at tcx ingress of r1's interface name.
func tcxIngress(t *testing.T, c *ctLab, name string) int {
	t.Helper()
	var n int
	err := nsrun.Do(c.l.Netns("r1"), func() error {
		ifc, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		r, err := link.QueryPrograms(link.QueryOptions{Target: ifc.Index, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		n = len(r.Programs)
		return nil
	})
	if err != nil {
		t.Fatalf("query tcx ingress of %s: %v", name, err)
	}
	return n
}

// TestLabTCPull sends, from h1 through r1 (--hook tc, GRO off so nothing pulls headers before
// the program), a 5000-byte UDP datagram whose skb holds only the Ethernet header in its linear
// part (an AF_PACKET socket with a virtio-net header of hdr_len 14): the program must pull the
// IP and UDP headers in to track it. Without the pull it could not parse it and would pass it
// to the kernel untracked.
func TestLabTCPull(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "ip")
	c := newCtLab(t, &Config{Hook: HookTC})
	var h1If, r1In string
	for _, x := range []struct {
		node string
		i    int
	}{{"h1", 0}, {"r1", 0}, {"r1", 1}, {"h2", 0}} {
		n, err := c.l.Node(x.node)
		if err != nil {
			t.Fatal(err)
		}
		name := c.l.IfName(n.Ifaces[x.i])
		labtest.Run(t, c.l, x.node, "ip", "link", "set", "dev", name, "mtu", "9000")
		if x.node == "h1" {
			h1If = name
		} else if x.node == "r1" && x.i == 0 {
			r1In = name
		}
	}
	mac := func(node, name string) (net.HardwareAddr, int) {
		var ifc *net.Interface
		if err := nsrun.Do(c.l.Netns(node), func() error {
			var err error
			ifc, err = net.InterfaceByName(name)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ifc.HardwareAddr, ifc.Index
	}
	h1MAC, h1Index := mac("h1", h1If)
	r1MAC, _ := mac("r1", r1In)
	frame := packet.IP(c.h1, c.h2).MAC(h1MAC, r1MAC).UDP(5555, 7777).Payload(make([]byte, 5000)).Bytes()
	labtest.Run(t, c.l, "h1", "ping", "-c", "1", "-W", "2", c.h2) // r1 resolves h2: it can redirect
	before := c.counters()
	err := nsrun.Do(c.l.Netns("h1"), func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: h1Index}); err != nil {
			return err
		}
		// struct virtio_net_hdr: flags, gso_type (none), hdr_len, gso_size, csum_start,
		// csum_offset. hdr_len is how much of the frame goes into the skb's linear part.
		vnet := make([]byte, 10)
		binary.LittleEndian.PutUint16(vnet[2:], 14)
		_, err = unix.Write(fd, append(vnet, frame...))
		return err
	})
	if err != nil {
		t.Fatalf("send the datagram from h1: %v", err)
	}
	eventually(t, "an entry for the 5000-byte datagram", func() bool {
		return find(c.entries(), "udp", c.h1, 5555, 7777) != nil
	})
	after := c.counters()
	if after["new"] <= before["new"] || after["forwarded"] <= before["forwarded"] {
		t.Errorf("counters changed by %v, want new and forwarded", diff(before, after))
	}
	if e := find(c.entries(), "udp", c.h1, 5555, 7777); e.Bytes[0] != 5028 {
		t.Errorf("entry counted %d bytes, want 5028 (the whole IP datagram)", e.Bytes[0])
	}
}
