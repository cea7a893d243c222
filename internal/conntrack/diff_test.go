package conntrack

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/testenv"
)

// nftRules is the reference firewall: nf_conntrack with the policy conntrack implements.
const nftRules = `table inet fpct {
	chain fpfwd {
		type filter hook forward priority 0; policy drop;
		ct state invalid drop
		ct state established,related accept
		iifname "%s" ct state new accept
	}
}`

// hostDrop keeps the hosts' own stacks from answering the scripted packets (no RSTs, no ICMP):
// the packet sockets still see everything that arrives.
const hostDrop = `table inet fpcthost { chain in { type filter hook input priority 0; policy drop; }; }`

// diffLab is a lab whose hosts send crafted frames and capture what reaches them.
type diffLab struct {
	t        *testing.T
	l        *lab.Lab
	h1, h2   netip.Addr
	h16, h26 netip.Addr
	r1       map[string]netip.Addr       // host → r1's IPv4 address on its link
	marker   uint16                      // sequence number of the last barrier echo (deliver)
	dev      map[string]string           // node → its eth0 (hosts) or "r1:in"/"r1:out"
	mac      map[string]net.HardwareAddr // same keys
	rx       map[string]int              // host → capture socket
	tx       map[string]int              // host → send socket
}

type dstep struct {
	name  string
	from  string // "h1" (inside) or "h2" (outside)
	frame func(d *diffLab) *packet.Builder
}

// newDiffLab brings up an XDPRouter lab (h1 — r1 — h2) whose hosts send and capture frames.
func newDiffLab(t *testing.T) *diffLab {
	testenv.Need(t, "nft", "conntrack")
	l := labtest.Up(t, labtest.XDPRouter)
	d := &diffLab{t: t, l: l}
	d.h1, d.h2 = netip.MustParseAddr(labtest.Addr(t, l, "h1", "4")), netip.MustParseAddr(labtest.Addr(t, l, "h2", "4"))
	d.h16, d.h26 = netip.MustParseAddr(labtest.Addr(t, l, "h1", "6")), netip.MustParseAddr(labtest.Addr(t, l, "h2", "6"))
	r1, err := l.Node("r1")
	if err != nil {
		t.Fatal(err)
	}
	d.r1 = map[string]netip.Addr{"h1": r1.Ifaces[0].IPv4.Addr(), "h2": r1.Ifaces[1].IPv4.Addr()}
	d.setup()
	return d
}

// startFlowplane runs conntrack on l's r1 with cfg until the test ends, then unpins its tables.
func startFlowplane(t *testing.T, l *lab.Lab, cfg *Config) *ctLab {
	c := &ctLab{t: t, l: l, cfg: cfg}
	c.start()
	t.Cleanup(func() {
		c.stop()
		_ = nsrun.Do(l.Netns("r1"), func() error {
			inst, err := Instance()
			if err == nil {
				_ = unpinInstance(inst)
			}
			return err
		})
	})
	return c
}

func (d *diffLab) setup() {
	t := d.t
	d.dev, d.mac, d.rx, d.tx = map[string]string{}, map[string]net.HardwareAddr{}, map[string]int{}, map[string]int{}
	for _, x := range []struct {
		key, node string
		i         int
	}{{"h1", "h1", 0}, {"h2", "h2", 0}, {"r1:in", "r1", 0}, {"r1:out", "r1", 1}} {
		n, err := d.l.Node(x.node)
		if err != nil {
			t.Fatal(err)
		}
		d.dev[x.key] = d.l.IfName(n.Ifaces[x.i])
		if err := nsrun.Do(d.l.Netns(x.node), func() error {
			link, err := netlink.LinkByName(d.dev[x.key])
			if err != nil {
				return err
			}
			d.mac[x.key] = link.Attrs().HardwareAddr
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Resolve neighbours before the hosts stop answering anything.
	labtest.Run(t, d.l, "h1", "ping", "-c", "1", "-W", "2", d.h2.String())
	labtest.Run(t, d.l, "h1", "ping", "-6", "-c", "1", "-W", "2", d.h26.String())
	// Pin r1's neighbours: the hosts' drop-all input chain would also swallow the NDP probes
	// of an entry gone stale, and the next packets would wait for a neighbour that never answers.
	if err := nsrun.Do(d.l.Netns("r1"), func() error {
		for _, n := range []struct {
			host, side string
			addrs      []netip.Addr
		}{{"h1", "r1:in", []netip.Addr{d.h1, d.h16}}, {"h2", "r1:out", []netip.Addr{d.h2, d.h26}}} {
			link, err := netlink.LinkByName(d.dev[n.side])
			if err != nil {
				return err
			}
			for _, a := range n.addrs {
				family := netlink.FAMILY_V4
				if a.Is6() {
					family = netlink.FAMILY_V6
				}
				if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: family, State: netlink.NUD_PERMANENT,
					IP: a.AsSlice(), HardwareAddr: d.mac[n.host]}); err != nil {
					return fmt.Errorf("pin neighbour %v: %w", a, err)
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"h1", "h2"} {
		nft(t, d.l, h, hostDrop)
		if err := nsrun.Do(d.l.Netns(h), func() error {
			link, err := net.InterfaceByName(d.dev[h])
			if err != nil {
				return err
			}
			for _, m := range []map[string]int{d.rx, d.tx} {
				fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
				if err != nil {
					return err
				}
				if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: link.Index}); err != nil {
					return err
				}
				m[h] = fd
			}
			tv := unix.NsecToTimeval(int64(20 * time.Millisecond))
			return unix.SetsockoptTimeval(d.rx[h], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		}); err != nil {
			t.Fatal(err)
		}
		fds := []int{d.rx[h], d.tx[h]}
		t.Cleanup(func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		})
	}
}

// nft loads rules on node.
func nft(t testing.TB, l *lab.Lab, node, rules string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, err := l.Command(ctx, node, "nft", "-f", "-")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft on %s: %v\n%s", node, err, out)
	}
}

// send injects one scripted frame and reports whether the other host received it.
func (d *diffLab) send(s dstep) bool {
	to := map[string]string{"h1": "h2", "h2": "h1"}[s.from]
	routerSide := map[string]string{"h1": "r1:in", "h2": "r1:out"}[s.from]
	frame := s.frame(d).MAC(d.mac[s.from], d.mac[routerSide]).Bytes()
	d.drain(to)
	if err := unix.Send(d.tx[s.from], frame, 0); err != nil {
		d.t.Fatalf("%s: send: %v", s.name, err)
	}
	// Compare from the addresses to the IP length (TTL, checksum and MACs change on the way,
	// and the kernel trims Ethernet padding where XDP keeps it).
	off, end := 14+12, 14+int(frame[16])<<8|int(frame[17])
	if frame[12] == 0x86 {
		off, end = 14+8, 14+40+int(frame[18])<<8|int(frame[19])
	}
	want := frame[off:end]
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); { // generous: CI machines are loaded
		n, err := unix.Read(d.rx[to], buf)
		if err != nil {
			continue
		}
		if n >= end && bytes.Equal(buf[off:end], want) {
			return true
		}
		if os.Getenv("FPCT_DEBUG") != "" && n > off {
			d.t.Logf("%s: other frame %x\n want %x", s.name, buf[:n], frame)
		}
	}
	return false
}

func (d *diffLab) drain(h string) {
	buf := make([]byte, 2048)
	for {
		if _, err := unix.Read(d.rx[h], buf); err != nil {
			return
		}
	}
}

// state is one connection's final state, as both trackers can print it.
type state struct {
	proto, src, dst, ports, tcp, flags string
	assured                            bool
	timeout                            float64 // seconds left
}

func (s state) String() string {
	return strings.TrimSpace(fmt.Sprintf("%s %s→%s %s %s %s", s.proto, s.src, s.dst, s.ports, s.tcp, s.flags))
}

// detailed is String with the assured flag and the timeout as the smallest default timeout
// (tcp_close 10 s … tcp_established 5 days) at or above the seconds left.
func (s state) detailed() string {
	str := s.String()
	if s.assured {
		str += " assured"
	}
	for _, t := range []float64{10, 30, 60, 120, 300, 432000} {
		if s.timeout <= t+1 {
			return fmt.Sprintf("%s ≤%gs", str, t)
		}
	}
	return str
}

// stateStrings returns each state's String (or detailed), sorted.
func stateStrings(ss []state, detailed bool) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.String()
		if detailed {
			out[i] = s.detailed()
		}
	}
	sort.Strings(out)
	return out
}

// nfStates parses conntrack -L in r1.
func nfStates(t *testing.T, l *lab.Lab) []string { return stateStrings(nfStateList(t, l), false) }

func nfStateList(t *testing.T, l *lab.Lab) []state {
	var out []state
	for _, fam := range []string{"ipv4", "ipv6"} {
		text := labtest.Run(t, l, "r1", "conntrack", "-L", "-f", fam)
		for _, line := range strings.Split(text, "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || strings.HasPrefix(line, "conntrack") {
				continue
			}
			s := state{proto: f[0]}
			if s.proto == "ipv6-icmp" {
				s.proto = "icmpv6"
			}
			fmt.Sscan(f[2], &s.timeout)
			kv := map[string]string{}
			for _, x := range f[3:] {
				if k, v, ok := strings.Cut(x, "="); ok {
					if _, dup := kv[k]; !dup {
						kv[k] = v
					}
				} else if x == "[UNREPLIED]" {
					s.flags = "unreplied"
				} else if x == "[ASSURED]" {
					s.assured = true
				} else if s.proto == "tcp" && s.tcp == "" && !strings.HasPrefix(x, "[") {
					s.tcp = x
				}
			}
			s.src, s.dst = kv["src"], kv["dst"]
			if kv["id"] != "" {
				s.ports = "id=" + kv["id"]
			} else {
				s.ports = kv["sport"] + ">" + kv["dport"]
			}
			out = append(out, s)
		}
	}
	return out
}

func fpStates(es []Entry) []string { return stateStrings(fpStateList(es), false) }

func fpStateList(es []Entry) []state {
	var out []state
	for _, e := range es {
		s := state{proto: e.Proto, src: e.Orig.Src.String(), dst: e.Orig.Dst.String(), assured: e.Assured, timeout: e.Timeout}
		if e.Proto == "tcp" {
			s.tcp = e.State
		}
		if e.Orig.ID != 0 {
			s.ports = fmt.Sprintf("id=%d", e.Orig.ID)
		} else {
			s.ports = fmt.Sprintf("%d>%d", e.Orig.Sport, e.Orig.Dport)
		}
		if !e.SeenReply {
			s.flags = "unreplied"
		}
		out = append(out, s)
	}
	return out
}

func diffScript() []dstep {
	ip := func(from string) func(d *diffLab) (string, string) {
		return func(d *diffLab) (string, string) {
			if from == "h1" {
				return d.h1.String(), d.h2.String()
			}
			return d.h2.String(), d.h1.String()
		}
	}
	tcpS := func(from string, sport, dport uint16, flags string, seq, ack uint32, payload int) func(d *diffLab) *packet.Builder {
		return func(d *diffLab) *packet.Builder {
			s, dd := ip(from)(d)
			b := packet.IP(s, dd).TCP(sport, dport, flags).Seq(seq).Ack(ack)
			if strings.Contains(flags, "S") {
				b = b.MSS(1460).WScale(7)
			}
			if payload > 0 {
				b = b.Payload(bytes.Repeat([]byte{'d'}, payload))
			}
			return b
		}
	}
	c, s := uint16(41000), uint16(8000)
	ci, si := uint32(1000), uint32(5000)
	c2, ci2, si2 := uint16(41001), uint32(70000), uint32(90000)
	c3, ci3, si3, c4 := uint16(41002), uint32(3_000_000_000), uint32(7_000_000), uint16(41003)
	c5, c6, c7, c8, c9, c10 := uint16(41004), uint16(41005), uint16(41006), uint16(41007), uint16(41008), uint16(41009)
	// sackS is tcpS with SACK permitted on SYNs and the SACK blocks given as edges.
	sackS := func(from string, sport, dport uint16, flags string, seq, ack uint32, payload int, edges ...uint32) func(d *diffLab) *packet.Builder {
		return func(d *diffLab) *packet.Builder {
			b := tcpS(from, sport, dport, flags, seq, ack, payload)(d)
			if strings.Contains(flags, "S") {
				b = b.SACKPermitted()
			}
			if len(edges) > 0 {
				b = b.SACK(edges...)
			}
			return b
		}
	}
	udpQ := func(d *diffLab) *packet.Builder {
		return packet.IP(d.h1.String(), d.h2.String()).UDP(5000, 53).Payload([]byte("query"))
	}
	return []dstep{
		{"unsolicited outside syn", "h2", tcpS("h2", s, c, "S", si, 0, 0)},
		{"syn", "h1", tcpS("h1", c, s, "S", ci, 0, 0)},
		{"synack acking a later seq", "h2", tcpS("h2", s, c, "SA", si, ci+2, 0)},
		{"synack", "h2", tcpS("h2", s, c, "SA", si, ci+1, 0)},
		{"ack", "h1", tcpS("h1", c, s, "A", ci+1, si+1, 0)},
		{"data c2s", "h1", tcpS("h1", c, s, "PA", ci+1, si+1, 100)},
		{"data s2c", "h2", tcpS("h2", s, c, "PA", si+1, ci+101, 50)},
		{"retransmission", "h1", tcpS("h1", c, s, "PA", ci+1, si+1, 100)},
		{"data far beyond the window", "h1", tcpS("h1", c, s, "PA", ci+10_000_000, si+51, 100)},
		{"ack of unsent data", "h2", tcpS("h2", s, c, "A", si+51, ci+500_000, 0)},
		{"fin without ack", "h1", tcpS("h1", c, s, "F", ci+101, 0, 0)},
		{"rst with stale seq", "h1", tcpS("h1", c, s, "R", ci+1, 0, 0)},
		{"rst in window, inexact", "h1", tcpS("h1", c, s, "R", ci+201, 0, 0)},
		{"rst exact", "h1", tcpS("h1", c, s, "R", ci+101, 0, 0)},
		{"syn 2", "h1", tcpS("h1", c2, s, "S", ci2, 0, 0)},
		{"synack 2", "h2", tcpS("h2", s, c2, "SA", si2, ci2+1, 0)},
		{"ack 2", "h1", tcpS("h1", c2, s, "A", ci2+1, si2+1, 0)},
		{"fin c2s", "h1", tcpS("h1", c2, s, "FA", ci2+1, si2+1, 0)},
		{"ack of fin", "h2", tcpS("h2", s, c2, "A", si2+1, ci2+2, 0)},
		{"fin s2c", "h2", tcpS("h2", s, c2, "FA", si2+1, ci2+2, 0)},
		{"last ack", "h1", tcpS("h1", c2, s, "A", ci2+2, si2+2, 0)},
		{"new syn in TIME_WAIT", "h1", tcpS("h1", c2, s, "S", ci2+100000, 0, 0)},
		// A reopened tuple the tracker still holds as ESTABLISHED: SYN ignored, SYN-ACK re-syncs.
		{"syn 3", "h1", tcpS("h1", c3, s, "S", ci, 0, 0)},
		{"synack 3", "h2", tcpS("h2", s, c3, "SA", si, ci+1, 0)},
		{"ack 3", "h1", tcpS("h1", c3, s, "A", ci+1, si+1, 0)},
		{"reopening syn", "h1", tcpS("h1", c3, s, "S", ci3, 0, 0)},
		{"synack for the reopening syn", "h2", tcpS("h2", s, c3, "SA", si3, ci3+1, 0)},
		{"ack of the reopened connection", "h1", tcpS("h1", c3, s, "A", ci3+1, si3+1, 0)},
		{"data of the reopened connection", "h1", tcpS("h1", c3, s, "PA", ci3+1, si3+1, 100)},
		// SACK blocks count in check (III) when SACK was permitted.
		{"syn 4", "h1", sackS("h1", c4, s, "S", ci, 0, 0)},
		{"synack 4", "h2", sackS("h2", s, c4, "SA", si, ci+1, 0)},
		{"ack 4", "h1", tcpS("h1", c4, s, "A", ci+1, si+1, 0)},
		{"data 4", "h1", tcpS("h1", c4, s, "PA", ci+1, si+1, 1000)},
		{"sack within the data", "h2", sackS("h2", s, c4, "A", si+1, ci+1, 0, ci+501, ci+1001)},
		{"sack beyond the data", "h2", sackS("h2", s, c4, "A", si+1, ci+1, 0, ci+501, ci+5001)},
		// nf's RST rules that read the last packet passed (last_index, last_end).
		{"syn 5", "h1", tcpS("h1", c5, s, "S", ci, 0, 0)},
		{"synack 5", "h2", tcpS("h2", s, c5, "SA", si, ci+1, 0)},
		{"ack 5", "h1", tcpS("h1", c5, s, "A", ci+1, si+1, 0)},
		{"data 5", "h1", tcpS("h1", c5, s, "PA", ci+1, si+1, 100)},
		{"server acks 5", "h2", tcpS("h2", s, c5, "A", si+1, ci+101, 0)},
		{"reopening syn 5, ignored", "h1", tcpS("h1", c5, s, "S", ci3, 0, 0)},
		{"rst acking something else", "h2", tcpS("h2", s, c5, "RA", 0, ci+5101, 0)},
		{"reopening syn 5 again", "h1", tcpS("h1", c5, s, "S", ci3, 0, 0)},
		{"rst answering the ignored syn", "h2", tcpS("h2", s, c5, "RA", 0, ci3+1, 0)},
		{"syn 6", "h1", tcpS("h1", c6, s, "S", ci, 0, 0)},
		{"bare ack in SYN_SENT, ignored", "h2", tcpS("h2", s, c6, "A", si, 123456, 0)},
		{"rst answering the ignored ack", "h1", tcpS("h1", c6, s, "RA", 123456, si, 0)},
		{"syn 7", "h1", tcpS("h1", c7, s, "S", ci, 0, 0)},
		{"rst answering syn 7", "h2", tcpS("h2", s, c7, "RA", 0, ci+1, 0)},
		{"ack after the rst", "h1", tcpS("h1", c7, s, "A", ci+1, 1, 0)},
		{"syn 8", "h1", tcpS("h1", c8, s, "S", ci, 0, 0)},
		{"synack 8", "h2", tcpS("h2", s, c8, "SA", si, ci+1, 0)},
		{"ack 8", "h1", tcpS("h1", c8, s, "A", ci+1, si+1, 0)},
		{"data 8", "h1", tcpS("h1", c8, s, "PA", ci+1, si+1, 100)},
		{"rst at the data's end", "h1", tcpS("h1", c8, s, "R", ci+101, 0, 0)},
		{"syn 9", "h1", tcpS("h1", c9, s, "S", ci, 0, 0)},
		{"synack 9", "h2", tcpS("h2", s, c9, "SA", si, ci+1, 0)},
		{"ack 9", "h1", tcpS("h1", c9, s, "A", ci+1, si+1, 0)},
		{"fin 9", "h1", tcpS("h1", c9, s, "FA", ci+1, si+1, 0)},
		{"rst out of window while closing", "h2", tcpS("h2", s, c9, "R", si+100_000_000, 0, 0)},
		// A picked-up connection reopened and re-synced: the SYN-ACK's side stays liberal.
		{"pickup 10", "h1", tcpS("h1", c10, s, "PA", ci, si, 100)},
		{"reply 10", "h2", tcpS("h2", s, c10, "A", si, ci+100, 0)},
		{"reopening syn 10", "h1", tcpS("h1", c10, s, "S", ci3, 0, 0)},
		{"synack 10 re-syncs", "h2", tcpS("h2", s, c10, "SA", si3, ci3+1, 0)},
		{"ack 10", "h1", tcpS("h1", c10, s, "A", ci3+1, si3+1, 0)},
		{"server data far beyond the window", "h2", tcpS("h2", s, c10, "PA", si3+1+50_000_000, ci3+1, 100)},
		{"client data far beyond the window", "h1", tcpS("h1", c10, s, "PA", ci3+1+50_000_000, si3+1, 100)},
		{"udp query", "h1", udpQ},
		{"udp reply", "h2", func(d *diffLab) *packet.Builder {
			return packet.IP(d.h2.String(), d.h1.String()).UDP(53, 5000).Payload([]byte("answer"))
		}},
		{"unsolicited udp", "h2", func(d *diffLab) *packet.Builder {
			return packet.IP(d.h2.String(), d.h1.String()).UDP(53, 5001).Payload([]byte("x"))
		}},
		{"icmp error for the udp flow", "h2", func(d *diffLab) *packet.Builder {
			return packet.IP(d.h2.String(), d.h1.String()).ICMPError(3, 3, udpQ(d).IPBytes())
		}},
		{"icmp error for nothing", "h2", func(d *diffLab) *packet.Builder {
			return packet.IP(d.h2.String(), d.h1.String()).ICMPError(3, 3, packet.IP(d.h1.String(), d.h2.String()).UDP(6000, 53).IPBytes())
		}},
		{"echo request", "h1", func(d *diffLab) *packet.Builder { return packet.IP(d.h1.String(), d.h2.String()).Echo(77, 1, false) }},
		{"echo reply", "h2", func(d *diffLab) *packet.Builder { return packet.IP(d.h2.String(), d.h1.String()).Echo(77, 1, true) }},
		{"echo reply, unknown id", "h2", func(d *diffLab) *packet.Builder { return packet.IP(d.h2.String(), d.h1.String()).Echo(78, 1, true) }},
		{"echo request from outside", "h2", func(d *diffLab) *packet.Builder { return packet.IP(d.h2.String(), d.h1.String()).Echo(79, 1, false) }},
		{"ipv6 unsolicited syn", "h2", func(d *diffLab) *packet.Builder {
			return packet.IP(d.h26.String(), d.h16.String()).TCP(443, 42000, "S").Seq(1)
		}},
		{"ipv6 syn", "h1", func(d *diffLab) *packet.Builder {
			return packet.IP(d.h16.String(), d.h26.String()).TCP(42000, 443, "S").Seq(100).WScale(7)
		}},
		{"ipv6 synack", "h2", func(d *diffLab) *packet.Builder {
			return packet.IP(d.h26.String(), d.h16.String()).TCP(443, 42000, "SA").Seq(900).Ack(101).WScale(7)
		}},
		{"ipv6 ack", "h1", func(d *diffLab) *packet.Builder {
			return packet.IP(d.h16.String(), d.h26.String()).TCP(42000, 443, "A").Seq(101).Ack(901)
		}},
		{"icmpv6 echo", "h1", func(d *diffLab) *packet.Builder { return packet.IP(d.h16.String(), d.h26.String()).Echo(5, 1, false) }},
		{"icmpv6 echo reply", "h2", func(d *diffLab) *packet.Builder { return packet.IP(d.h26.String(), d.h16.String()).Echo(5, 1, true) }},
	}
}

// TestDifferential runs one scripted exchange through r1 twice, once with nftables `ct state`
// rules over nf_conntrack and once with conntrack, and compares which packets each delivered
// and the connections each ends with.
func TestDifferential(t *testing.T) {
	t.Parallel()
	differential(t, diffScript())
}

// TestDifferentialReopen: nf's condition for a SYN to reopen a closed tuple (CLOSE_INIT or a
// RST from the SYN's side); otherwise the SYN passes ignored and the entry stays CLOSE.
func TestDifferentialReopen(t *testing.T) {
	t.Parallel()
	seg := func(name, from string, sport uint16, flags string, seq, ack uint32) dstep {
		return dstep{name, from, func(d *diffLab) *packet.Builder {
			src, dst, sp, dp := d.h1.String(), d.h2.String(), sport, uint16(80)
			if from == "h2" {
				src, dst, sp, dp = dst, src, dp, sp
			}
			b := packet.IP(src, dst).TCP(sp, dp, flags).Seq(seq).Ack(ack)
			if strings.Contains(flags, "S") {
				b = b.WScale(7)
			}
			return b
		}}
	}
	var script []dstep
	hs := func(port uint16) {
		script = append(script, seg("syn", "h1", port, "S", 100, 0), seg("synack", "h2", port, "SA", 900, 101),
			seg("ack", "h1", port, "A", 101, 901))
	}
	// A: the client aborts, the server's ACK passes last, the client's new SYN is ignored.
	hs(44000)
	script = append(script, seg("A: client rst", "h1", 44000, "R", 101, 0), seg("A: server ack", "h2", 44000, "A", 901, 101),
		seg("A: client syn", "h1", 44000, "S", 5000, 0))
	// B: the server aborts; the client's SYN is ignored.
	hs(44001)
	script = append(script, seg("B: server rst", "h2", 44001, "R", 901, 0), seg("B: client syn", "h1", 44001, "S", 5000, 0))
	// C: the client aborts and reopens at once: reopened.
	hs(44002)
	script = append(script, seg("C: client rst", "h1", 44002, "R", 101, 0), seg("C: client syn", "h1", 44002, "S", 5000, 0))
	// D: closed by FINs (CLOSE_INIT), reopened by the client.
	hs(44003)
	script = append(script, seg("D: client fin", "h1", 44003, "FA", 101, 901), seg("D: server fin", "h2", 44003, "FA", 901, 102),
		seg("D: client ack", "h1", 44003, "A", 102, 902), seg("D: client syn", "h1", 44003, "S", 5000, 0))
	differential(t, script)
}

// differential runs script through r1 under nf_conntrack, then under flowplane, and compares
// the deliveries and the final states.
func differential(t *testing.T, script []dstep) {
	d := newDiffLab(t)
	l := d.l

	// nf_conntrack.
	labtest.Run(t, l, "r1", "sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_loose=1")
	nft(t, l, "r1", fmt.Sprintf(nftRules, d.dev["r1:in"]))
	nfDelivered := make([]bool, len(script))
	for i, s := range script {
		nfDelivered[i] = d.send(s)
	}
	nf := nfStates(t, l)
	labtest.Run(t, l, "r1", "nft", "delete", "table", "inet", "fpct")
	_, _ = labtest.Try(l, "r1", "conntrack", "-F")

	// flowplane conntrack.
	c := startFlowplane(t, l, &Config{})
	for i, s := range script {
		if got := d.send(s); got != nfDelivered[i] {
			t.Errorf("%q: flowplane delivered=%v, nf_conntrack delivered=%v", s.name, got, nfDelivered[i])
		}
	}
	fp := fpStates(c.entries())
	if strings.Join(fp, "\n") != strings.Join(nf, "\n") {
		t.Errorf("final state differs\nnf_conntrack:\n  %s\nflowplane:\n  %s", strings.Join(nf, "\n  "), strings.Join(fp, "\n  "))
	}
	t.Logf("%d packets, delivered by both: %v\nfinal states:\n  %s", len(script), nfDelivered, strings.Join(nf, "\n  "))
}

// tcpSeg is a TCP segment between h1:sport and h2:80 (from is "h1" or "h2").
func tcpSeg(name, from string, sport uint16, flags string, seq, ack uint32, payload int) dstep {
	return dstep{name, from, func(d *diffLab) *packet.Builder {
		src, dst, sp, dp := d.h1.String(), d.h2.String(), sport, uint16(80)
		if from == "h2" {
			src, dst, sp, dp = dst, src, dp, sp
		}
		b := packet.IP(src, dst).TCP(sp, dp, flags).Seq(seq).Ack(ack)
		if strings.Contains(flags, "S") {
			b = b.WScale(7)
		}
		if payload > 0 {
			b = b.Payload(make([]byte, payload))
		}
		return b
	}}
}

// handshakeOn is a three-way handshake h1:port → h2:80 (client ISN 100, server 900).
func handshakeOn(port uint16) []dstep {
	return []dstep{tcpSeg("syn", "h1", port, "S", 100, 0, 0), tcpSeg("synack", "h2", port, "SA", 900, 101, 0),
		tcpSeg("ack", "h1", port, "A", 101, 901, 0)}
}

// timeoutsDifferential runs first, waits wait, runs then, under nf_conntrack (with the
// sysctls) and under flowplane (with cfg), and returns each tracker's remaining TCP timeouts
// by h1's port. Every packet must be delivered by both.
func timeoutsDifferential(t *testing.T, first []dstep, wait time.Duration, then []dstep, sysctls []string, cfg *Config) (nf, fp map[uint16]float64) {
	return timeoutsRun(t, first, wait, then, true, sysctls, cfg)
}

// timeoutsDifferentialDelivery is timeoutsDifferential with then's packets expected delivered
// (or not, as thenDelivered says) by both trackers, no wait, default settings.
func timeoutsDifferentialDelivery(t *testing.T, first, then []dstep, thenDelivered bool) (nf, fp map[uint16]float64) {
	return timeoutsRun(t, first, 0, then, thenDelivered, nil, &Config{})
}

func timeoutsRun(t *testing.T, first []dstep, wait time.Duration, then []dstep, thenDelivered bool, sysctls []string, cfg *Config) (nf, fp map[uint16]float64) {
	d := newDiffLab(t)
	l := d.l
	run := func(tracker string, timeouts func() map[uint16]float64) map[uint16]float64 {
		for _, s := range first {
			if !d.send(s) {
				t.Fatalf("%s: %s not delivered", tracker, s.name)
			}
		}
		time.Sleep(wait)
		for _, s := range then {
			if d.send(s) != thenDelivered {
				t.Errorf("%s: %s delivered=%v, want %v", tracker, s.name, !thenDelivered, thenDelivered)
			}
		}
		m := timeouts()
		t.Logf("%s: seconds left by port: %v", tracker, m)
		return m
	}
	for _, sc := range sysctls {
		labtest.Run(t, l, "r1", "sysctl", "-qw", sc)
	}
	nft(t, l, "r1", fmt.Sprintf(nftRules, d.dev["r1:in"]))
	nf = run("nf_conntrack", func() map[uint16]float64 {
		m := map[uint16]float64{}
		for _, line := range strings.Split(labtest.Run(t, l, "r1", "conntrack", "-L", "-p", "tcp"), "\n") {
			f := strings.Fields(line)
			for _, x := range f {
				if v, ok := strings.CutPrefix(x, "sport="); ok && len(f) > 3 {
					var port uint16
					var left float64
					fmt.Sscan(v, &port)
					fmt.Sscan(f[2], &left)
					m[port] = left
					break // the original tuple comes first
				}
			}
		}
		return m
	})
	labtest.Run(t, l, "r1", "nft", "delete", "table", "inet", "fpct")
	_, _ = labtest.Try(l, "r1", "conntrack", "-F")

	c := startFlowplane(t, l, cfg)
	fp = run("flowplane", func() map[uint16]float64 {
		m := map[uint16]float64{}
		for _, e := range c.entries() {
			if e.Proto == "tcp" {
				m[e.Orig.Sport] = e.Timeout
			}
		}
		return m
	})
	return nf, fp
}

// TestDifferentialUnacknowledged: while a side has sent data the other has not acknowledged,
// nf caps the timeout at tcp_timeout_unacknowledged (300 s) instead of ESTABLISHED's 5 days;
// once the data is acknowledged the full timeout is back. Connection A sends data that is
// never acknowledged, B data that is.
func TestDifferentialUnacknowledged(t *testing.T) {
	t.Parallel()
	first := append(handshakeOn(45000), handshakeOn(45001)...)
	first = append(first, tcpSeg("A: data", "h1", 45000, "PA", 101, 901, 100),
		tcpSeg("B: data", "h1", 45001, "PA", 101, 901, 100), tcpSeg("B: server acks", "h2", 45001, "A", 901, 201, 0))
	nf, fp := timeoutsDifferential(t, first, 0, nil, nil, &Config{})
	class := func(m map[uint16]float64) string {
		return fmt.Sprintf("A capped %v, B capped %v", m[45000] <= 300, m[45001] <= 300)
	}
	if len(nf) != 2 || class(nf) != "A capped true, B capped false" {
		t.Errorf("nf_conntrack: %v (%s)", nf, class(nf))
	}
	if class(fp) != class(nf) {
		t.Errorf("flowplane %s, nf_conntrack %s", class(fp), class(nf))
	}
}

// TestDifferentialIgnoredNoRefresh: a packet nf's state table ignores (a SYN on an established
// tuple) passes but refreshes nothing, where a data segment does: both trackers run the same
// two connections with a 60 s established timeout, wait 4 s, send the ignored SYN on one and
// a data segment (acknowledged) on the other, and must agree on which timeout was refreshed.
func TestDifferentialIgnoredNoRefresh(t *testing.T) {
	t.Parallel()
	const timeout = 60
	first := append(handshakeOn(43000), handshakeOn(43001)...)
	then := []dstep{
		tcpSeg("syn on the established tuple (ignored)", "h1", 43000, "S", 7_000_000, 0, 0),
		tcpSeg("data (refreshes)", "h1", 43001, "PA", 101, 901, 100),
		tcpSeg("server acks", "h2", 43001, "A", 901, 201, 0),
	}
	nf, fp := timeoutsDifferential(t, first, 4*time.Second, then,
		[]string{fmt.Sprintf("net.netfilter.nf_conntrack_tcp_timeout_established=%d", timeout)},
		&Config{Timeouts: map[string]string{"tcp_established": fmt.Sprintf("%ds", timeout)}})
	refreshed := func(m map[uint16]float64) map[uint16]bool {
		return map[uint16]bool{43000: m[43000] >= timeout-2, 43001: m[43001] >= timeout-2} // not refreshed: 56 s or less
	}
	if r := refreshed(nf); len(nf) != 2 || r[43000] || !r[43001] {
		t.Errorf("nf_conntrack: refreshed %v (%v), want 43000 (ignored SYN) false, 43001 (data) true", r, nf)
	}
	if fmt.Sprint(refreshed(fp)) != fmt.Sprint(refreshed(nf)) {
		t.Errorf("refreshed: flowplane %v, nf_conntrack %v", refreshed(fp), refreshed(nf))
	}
}

// TestDifferentialRetransmissions: the same ACK segment four times in a row (three
// retransmissions, nf's max_retrans) caps the timeout at tcp_timeout_max_retrans (300 s);
// three times (two) does not.
func TestDifferentialRetransmissions(t *testing.T) {
	t.Parallel()
	first := append(handshakeOn(46000), handshakeOn(46001)...)
	for range 4 {
		first = append(first, tcpSeg("A: the same server ack", "h2", 46000, "A", 901, 101, 0))
	}
	for range 3 {
		first = append(first, tcpSeg("B: the same server ack", "h2", 46001, "A", 901, 101, 0))
	}
	nf, fp := timeoutsDifferential(t, first, 0, nil, nil, &Config{})
	class := func(m map[uint16]float64) string {
		return fmt.Sprintf("A capped %v, B capped %v", m[46000] <= 300, m[46001] <= 300)
	}
	if len(nf) != 2 || class(nf) != "A capped true, B capped false" {
		t.Errorf("nf_conntrack: %v (%s)", nf, class(nf))
	}
	if class(fp) != class(nf) {
		t.Errorf("flowplane %s, nf_conntrack %s", class(fp), class(nf))
	}
}

// TestDifferentialOutOfWindowClose: on an assured connection an out-of-window FIN from one
// side is refused and remembered; an out-of-window RST from the other side answering it is
// refused too and lowers the timeout to tcp_timeout_unacknowledged (300 s): the endpoints and
// the tracker disagree, so the entry is left to age out (nf_tcp_handle_invalid). Connection B
// gets the FIN only: its timeout stays.
func TestDifferentialOutOfWindowClose(t *testing.T) {
	t.Parallel()
	var first []dstep
	for _, port := range []uint16{47000, 47001} {
		first = append(first, handshakeOn(port)...)
		first = append(first, tcpSeg("data", "h1", port, "PA", 101, 901, 100), tcpSeg("server acks", "h2", port, "A", 901, 201, 0))
	}
	then := []dstep{
		tcpSeg("A: fin far out of window", "h1", 47000, "FA", 50_000_000, 901, 0),
		tcpSeg("A: rst far out of window", "h2", 47000, "RA", 60_000_000, 201, 0),
		tcpSeg("B: fin far out of window", "h1", 47001, "FA", 50_000_000, 901, 0),
	}
	nf, fp := timeoutsDifferentialDelivery(t, first, then, false)
	class := func(m map[uint16]float64) string {
		return fmt.Sprintf("A shortened %v, B shortened %v", m[47000] <= 300, m[47001] <= 300)
	}
	if len(nf) != 2 || class(nf) != "A shortened true, B shortened false" {
		t.Errorf("nf_conntrack: %v (%s)", nf, class(nf))
	}
	if class(fp) != class(nf) {
		t.Errorf("flowplane %s, nf_conntrack %s", class(fp), class(nf))
	}
}

// TestDifferentialInexactRST: a RST inside the window but not at the exact sequence number
// leaves an established connection ESTABLISHED (the endpoint answers with a challenge ACK), but
// nf sets the timeout to CLOSE's (10 s) all the same, as for every RST that passes.
func TestDifferentialInexactRST(t *testing.T) {
	t.Parallel()
	var first []dstep
	for _, port := range []uint16{48000, 48001} {
		first = append(first, handshakeOn(port)...)
		first = append(first, tcpSeg("data", "h1", port, "PA", 101, 901, 100), tcpSeg("server acks", "h2", port, "A", 901, 201, 0))
	}
	then := []dstep{tcpSeg("A: rst in window, inexact", "h1", 48000, "R", 301, 0, 0)}
	nf, fp := timeoutsDifferentialDelivery(t, first, then, true)
	class := func(m map[uint16]float64) string {
		return fmt.Sprintf("A at CLOSE's timeout %v, B %v", m[48000] <= 10, m[48001] <= 10)
	}
	if len(nf) != 2 || class(nf) != "A at CLOSE's timeout true, B false" {
		t.Errorf("nf_conntrack: %v (%s)", nf, class(nf))
	}
	if class(fp) != class(nf) {
		t.Errorf("flowplane %s, nf_conntrack %s", class(fp), class(nf))
	}
}

// TestDifferentialChallengeACK: nf's RFC 5961 challenge-ACK rules. A: in LAST_ACK the client's
// new SYN is ignored and flagged; the server's ACK answering it is a challenge ACK, not the ACK
// of the last FIN: the connection stays LAST_ACK. A2: only once — the server's next ACK moves it
// on to TIME_WAIT. B: the tuple is reused after a close (the SYN reopens it), the server, still
// holding the old connection, answers with a challenge ACK (ignored in SYN_SENT, its ack
// remembered), the client resets the old connection at exactly that sequence number — the RST
// passes and closes, though it is out of the new connection's window (the new ISN is below the
// old sequence numbers) — and its SYN again opens the connection.
func TestDifferentialChallengeACK(t *testing.T) {
	t.Parallel()
	var script []dstep
	for _, port := range []uint16{45000, 45001} {
		script = append(script, handshakeOn(port)...)
		script = append(script, tcpSeg("client fin", "h1", port, "FA", 101, 901, 0),
			tcpSeg("server fin", "h2", port, "FA", 901, 102, 0),
			tcpSeg("new syn in LAST_ACK, ignored", "h1", port, "S", 5000, 0, 0),
			tcpSeg("server's challenge ack", "h2", port, "A", 902, 102, 0))
	}
	script = append(script, tcpSeg("A2: server's next ack", "h2", 45001, "A", 902, 102, 0))
	script = append(script, handshakeOn(45002)...)
	script = append(script,
		tcpSeg("B: client fin", "h1", 45002, "FA", 101, 901, 0),
		tcpSeg("B: server acks the fin", "h2", 45002, "A", 901, 102, 0),
		tcpSeg("B: server fin", "h2", 45002, "FA", 901, 102, 0),
		tcpSeg("B: client's last ack", "h1", 45002, "A", 102, 902, 0),
		tcpSeg("B: syn reusing the tuple", "h1", 45002, "S", 50, 0, 0),
		tcpSeg("B: server's challenge ack", "h2", 45002, "A", 902, 102, 0),
		tcpSeg("B: rst at the challenge's ack", "h1", 45002, "R", 102, 0, 0),
		tcpSeg("B: syn again", "h1", 45002, "S", 50, 0, 0),
		tcpSeg("B: synack", "h2", 45002, "SA", 3000, 51, 0),
		tcpSeg("B: ack", "h1", 45002, "A", 51, 3001, 0))
	differential(t, script)
}

// minimizedCase is a disagreement the random differential (TestDifferentialRandom) found,
// minimized and fixed.
type minimizedCase struct {
	name string
	seq  []rpkt
}

func minimizedCases() []minimizedCase {
	var cs []minimizedCase
	// nf's stream_ts: a replied UDP flow keeps udp_unreplied (30 s) and is not assured
	// until a packet comes more than 2 s after the first.
	query := rpkt{from: "h1", proto: "udp", sport: 5000, dport: 53, payload: 10, wscale: -1}
	answer := rpkt{from: "h2", proto: "udp", sport: 53, dport: 5000, payload: 10, wscale: -1}
	late := answer
	late.gap = 2100 * time.Millisecond
	cs = append(cs, minimizedCase{"udp replied within 2 s", []rpkt{query, answer, answer}},
		minimizedCase{"udp stream after 2 s", []rpkt{query, answer, late}})
	// A picked-up connection without a reply is capped at tcp_unacknowledged; so is the
	// first reply (nf's handler sees the status from before the packet).
	pickup := rpkt{from: "h1", proto: "tcp", sport: 41000, dport: 80, flags: "A", seq: 1000, ack: 5000, win: 65535, wscale: -1}
	pickupReply := rpkt{from: "h2", proto: "tcp", sport: 80, dport: 41000, flags: "A", seq: 5000, ack: 1000, win: 65535, wscale: -1}
	cs = append(cs, minimizedCase{"pickup", []rpkt{pickup}},
		minimizedCase{"pickup and its first reply", []rpkt{pickup, pickupReply}},
		minimizedCase{"pickup, reply, ack", []rpkt{pickup, pickupReply, pickup}})
	// An ICMP error must go to the quoted packet's sender: one from the sender itself
	// (to the quoted packet's receiver) is invalid.
	echo := rpkt{from: "h1", proto: "echo", sport: 7, seq: 1, wscale: -1}
	echo6 := echo
	echo6.v6 = true
	cs = append(cs,
		minimizedCase{"icmp error from the quoted packet's sender", []rpkt{echo, {from: "h1", proto: "icmperr", typ: 3, code: 1, quote: &echo, wscale: -1}}},
		minimizedCase{"icmpv6 error from the quoted packet's sender", []rpkt{echo6, {from: "h1", v6: true, proto: "icmperr", typ: 1, code: 1, quote: &echo6, wscale: -1}}},
		minimizedCase{"icmp error to the sender", []rpkt{echo, {from: "h2", proto: "icmperr", typ: 3, code: 1, quote: &echo, wscale: -1}}})
	// nf sets td_end to an overshooting segment's end, even backwards: a second overshooting
	// segment ending earlier makes an ACK of the first's end invalid.
	cs = append(cs, minimizedCase{"overshooting segments set the end", []rpkt{
		{from: "h1", proto: "tcp", sport: 25732, dport: 53, flags: "S", seq: 2745112724, win: 65535, wscale: 7},
		{from: "h2", proto: "tcp", sport: 53, dport: 25732, flags: "SA", seq: 1847984206, ack: 2745112725, win: 502, wscale: -1},
		{from: "h1", proto: "tcp", sport: 25732, dport: 53, flags: "PA", seq: 2745113361, ack: 1847984207, win: 65535, wscale: -1, payload: 100},
		{from: "h1", proto: "tcp", sport: 25732, dport: 53, flags: "PA", seq: 2745113261, ack: 1847984207, win: 65535, wscale: -1, payload: 100},
		{from: "h2", proto: "tcp", sport: 53, dport: 25732, flags: "A", seq: 1847984207, ack: 2745113461, win: 502, wscale: -1},
	}})
	// After a simultaneous open (SYN_SENT2), nf's state table leaves SYN_RECV on the reply's
	// ACK; nf's IP_CT_TCP_SIMULTANEOUS_OPEN establishes it. The second case is the random
	// differential's (seed 27914851860630): an overshooting segment sets the end the ACK
	// acknowledges, and marks its data unacknowledged (the timeout capped at 300 s).
	soSyn := rpkt{from: "h1", proto: "tcp", sport: 30344, dport: 53, flags: "S", seq: 18336919, win: 29200, wscale: 14, sackOK: true}
	soSyn2 := rpkt{from: "h2", proto: "tcp", sport: 53, dport: 30344, flags: "S", seq: 1466516124, win: 64240, wscale: 14}
	soSynAck := rpkt{from: "h1", proto: "tcp", sport: 30344, dport: 53, flags: "SA", seq: 18336919, ack: 1466516125, win: 29200, wscale: 14, sackOK: true}
	soAck := rpkt{from: "h2", proto: "tcp", sport: 53, dport: 30344, flags: "A", seq: 1466516125, ack: 18336920, win: 64240, wscale: -1}
	cs = append(cs, minimizedCase{"simultaneous open, the reply's ACK", []rpkt{soSyn, soSyn2, soSynAck, soAck}})
	so6 := []rpkt{soSyn, soSyn2, soSynAck,
		{from: "h1", proto: "tcp", sport: 30344, dport: 53, flags: "PA", seq: 18340392, ack: 1466516125, win: 29200, wscale: -1, payload: 1, gap: 27 * time.Millisecond},
		{from: "h2", proto: "tcp", sport: 53, dport: 30344, flags: "A", seq: 1466516125, ack: 18337993, win: 64240, wscale: -1}}
	for i := range so6 {
		so6[i].v6 = true
	}
	cs = append(cs, minimizedCase{"simultaneous open, overshooting data, the reply's ACK", so6})
	// No plain ACK segment has passed the window check (a pickup's segments fail it): nf's
	// last_win is still 0, which caps the timeout at tcp_retrans.
	cs = append(cs, minimizedCase{"no window seen caps at tcp_retrans", []rpkt{
		{from: "h1", v6: true, proto: "tcp", sport: 53, dport: 58643, flags: "PA", seq: 968517680, ack: 993, win: 502, wscale: -1, payload: 536},
		{from: "h2", v6: true, proto: "tcp", sport: 58643, dport: 53, flags: "PA", seq: 64049, ack: 968518317, win: 65535, wscale: -1, payload: 1200},
		{from: "h2", v6: true, proto: "tcp", sport: 58643, dport: 53, flags: "PA", seq: 1093, ack: 968518317, win: 65535, wscale: -1, payload: 1200},
	}})
	return cs
}

// TestDifferentialMinimized: the random differential's minimized disagreements as table
// tests: each sequence through nf_conntrack and flowplane must give the same deliveries and
// final states (with the assured flag and the timeout).
func TestDifferentialMinimized(t *testing.T) {
	t.Parallel()
	p := newPairLab(t)
	for _, c := range minimizedCases() {
		if r := p.run(c.seq); !r.ok() {
			t.Errorf("%s: nf_conntrack and flowplane disagree:\n%s", c.name, describe(c.seq, r))
		} else {
			t.Logf("%s: nf_conntrack and flowplane agree:\n%s", c.name, describe(c.seq, r))
		}
	}
}
