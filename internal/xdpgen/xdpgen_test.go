package xdpgen

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/testenv"
)

// pair is a veth pair between two fresh namespaces: the generator sends from a, b receives.
type pair struct {
	a, b testenv.Veth
}

func newPair(t *testing.T) pair {
	t.Helper()
	testenv.Privileged(t)
	na, nb := testenv.Netns(t), testenv.Netns(t)
	a, b := testenv.VethPair(t, na, nb, netip.MustParsePrefix("198.18.0.1/24"), netip.MustParsePrefix("198.18.0.2/24"))
	return pair{a, b}
}

// udpFrame is a 60-byte UDP frame a → b (64 on the wire with the FCS).
func (p pair) udpFrame(sport, dport uint16) []byte {
	return packet.IP(p.a.Addr.Addr().String(), p.b.Addr.Addr().String()).MAC(p.a.MAC, p.b.MAC).
		UDP(sport, dport).Payload(make([]byte, 18)).Bytes()
}

func (p pair) sink(t *testing.T, proto uint8, port uint16, pass bool) *Sink {
	t.Helper()
	s, err := AttachSink(SinkConfig{Netns: p.b.Netns, Ifname: p.b.Name, Proto: proto, Port: port, Pass: pass})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func count(t *testing.T, s *Sink) uint64 {
	t.Helper()
	n, err := s.Count()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A burst arrives exactly: every frame sent is counted at the receiver, and frames for another
// port are not. (Exact only while the receiver's veth ring, 256 frames, never overflows: paced
// runs hand it a tick's worth at a time and the full-speed runs that must arrive are shorter
// than the ring, so even a receiver whose softirq is deferred on a busy machine keeps up.)
func TestBurstArrivesExactly(t *testing.T) {
	p := newPair(t)
	s := p.sink(t, protoUDP, 9, false)
	for _, c := range []struct {
		port uint16
		n    uint64
		rate float64
	}{{9, 20000, 20000}, {10, 5000, 0}, {9, 1, 0}, {9, 200, 0}} {
		sent, err := Send(context.Background(), Config{Netns: p.a.Netns, Ifindex: p.a.Index, Frame: p.udpFrame(5000, c.port), Count: c.n, Rate: c.rate})
		if err != nil {
			t.Fatal(err)
		}
		if sent != c.n {
			t.Errorf("port %d: sent %d, want %d", c.port, sent, c.n)
		}
	}
	// Netns "": the caller's namespace (here a thread nsrun put into a's), without the
	// dispatcher hold, so every kernel call is slow but the count the same.
	if err := nsrun.Do(p.a.Netns, func() error {
		sent, err := Send(context.Background(), Config{Ifindex: p.a.Index, Frame: p.udpFrame(5000, 9), Count: 3000, Rate: 20000, Batch: 16})
		if err == nil && sent != 3000 {
			err = fmt.Errorf("sent %d, want 3000", sent)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := count(t, s), uint64(20000+1+200+3000); got != want {
		t.Errorf("sink counted %d, want %d", got, want)
	}
	// The dispatcher hold's veth pair is gone.
	if err := nsrun.Do(p.a.Netns, func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if n := l.Attrs().Name; n != "lo" && n != p.a.Name {
				t.Errorf("interface %s left behind", n)
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// Rate limiting, judged by counts: a run of Duration at Rate sends exactly Rate × Duration
// frames, never runs ahead of the rate, and cannot finish early. (How closely it keeps up
// with the rate on a busy machine is a wall-clock matter, not a test's.)
func TestRate(t *testing.T) {
	p := newPair(t)
	s := p.sink(t, protoUDP, 9, false)
	const rate, d = 4000, 1500 * time.Millisecond
	type result struct {
		sent uint64
		err  error
	}
	done := make(chan result, 1)
	var progress atomic.Uint64
	start := time.Now()
	go func() {
		sent, err := Send(context.Background(), Config{Netns: p.a.Netns, Ifindex: p.a.Index, Frame: p.udpFrame(5000, 9), Duration: d, Rate: rate, Progress: &progress})
		done <- result{sent, err}
	}()
	time.Sleep(d / 2)
	half, elapsed := count(t, s), time.Since(start)
	r := <-done
	if progress.Load() != r.sent {
		t.Errorf("progress %d at the end, sent %d", progress.Load(), r.sent)
	}
	took := time.Since(start)
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := uint64(rate * d.Seconds())
	if r.sent != want || count(t, s) != want {
		t.Errorf("sent %d, received %d, want %d", r.sent, count(t, s), want)
	}
	// A tick's worth of frames may go out at once; never more than the rate allows by then.
	if ahead := uint64(rate*elapsed.Seconds()) + rate/10; half > ahead || half >= want {
		t.Errorf("%d frames received %v into a %v run at %d/s: ahead of the rate (at most %d)", half, elapsed, d, rate, ahead)
	}
	if took < d*9/10 || took > 30*time.Second {
		t.Errorf("took %v for a %v run", took, d)
	}
	// A count at a rate takes its time too.
	start = time.Now()
	sent, err := Send(context.Background(), Config{Netns: p.a.Netns, Ifindex: p.a.Index, Frame: p.udpFrame(5000, 9), Count: 3000, Rate: 10000})
	if err != nil || sent != 3000 {
		t.Fatalf("sent %d (%v), want 3000", sent, err)
	}
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Errorf("3000 frames at 10000/s took %v", took)
	}
	// A context that ends stops an unbounded run, with its error.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	sent, err = Send(ctx, Config{Netns: p.a.Netns, Ifindex: p.a.Index, Frame: p.udpFrame(5000, 9), Rate: 1000})
	if !errors.Is(err, context.DeadlineExceeded) || sent == 0 || sent > 1000 {
		t.Errorf("unbounded run under a 1 s context: sent %d, err %v", sent, err)
	}
}

// Rewritten fields and checksums, checked on frames captured at the receiver: every frame is
// decoded, its IPv4 header and TCP/UDP checksums recomputed from scratch, and its port, address
// and sequence number matched to its index.
func TestRewrittenFields(t *testing.T) {
	p := newPair(t)
	const ports, addrs = 7, 3
	for _, c := range []struct {
		name     string
		src, dst string
		tcp      bool
		seq      bool
		sport    uint16
		first    uint64
	}{
		{"ipv4 tcp syn", "198.18.0.100", "198.18.0.2", true, true, 40000, 0},
		{"ipv4 udp", "198.18.0.255", "198.18.0.2", false, false, 65535 - ports + 1, 0}, // carries into the third byte
		{"ipv6 tcp", "fd00::1", "fd00::2", true, true, 1024, 1000},                     // continues a run that sent 1000
		{"ipv6 udp", "fd00::fffe", "fd00::2", false, false, 5000, 0},                   // carries across 16-bit words
	} {
		t.Run(c.name, func(t *testing.T) {
			b := packet.IP(c.src, c.dst).MAC(p.a.MAC, p.b.MAC)
			dport := uint16(9)
			if c.tcp {
				dport = 80
				b = b.TCP(c.sport, dport, "S").Seq(0xfffffff0).MSS(1460).WScale(7)
			} else {
				b = b.UDP(c.sport, dport).Payload([]byte("xdpgen payload"))
			}
			frame := b.Bytes()
			proto := uint8(protoUDP)
			if c.tcp {
				proto = protoTCP
			}
			p.sink(t, proto, dport, true) // count and pass: NAPI for the redirected frames
			const n = 3 * ports * addrs
			frames := capture(t, p.b, n, func() {
				sent, err := Send(context.Background(), Config{Netns: p.a.Netns, Ifindex: p.a.Index, Frame: frame,
					Count: n, Rate: 5000, SrcPorts: ports, SrcAddrs: addrs, Seq: c.seq, First: c.first})
				if err != nil || sent != n {
					t.Fatalf("sent %d (%v), want %d", sent, err, n)
				}
			}, func(f []byte) bool { return len(f) == len(frame) && bytes.Equal(f[:6], p.b.MAC) && dstPort(f) == dport })
			base := netip.MustParseAddr(c.src)
			seen := map[int]bool{}
			for _, f := range frames {
				checkSums(t, f)
				pk := packet.Decode(f)
				var sport uint16
				var seq uint32
				var src netip.Addr
				if l, ok := pk.Layer(layers.LayerTypeTCP).(*layers.TCP); ok {
					sport, seq = uint16(l.SrcPort), l.Seq
				} else if l, ok := pk.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
					sport = uint16(l.SrcPort)
				}
				if l, ok := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
					src, _ = netip.AddrFromSlice(l.SrcIP)
				} else if l, ok := pk.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
					src, _ = netip.AddrFromSlice(l.SrcIP)
				}
				i := int(sport - c.sport)
				if i < 0 || i >= ports {
					t.Fatalf("source port %d outside %d + [0, %d)", sport, c.sport, ports)
				}
				ai := int(lastWord(src) - lastWord(base))
				if ai < 0 || ai >= addrs || !sameButLastWord(src, base) {
					t.Fatalf("source address %s is not %s + [0, %d)", src, base, addrs)
				}
				idx := ai*ports + i // the index modulo one full turn
				if c.seq {
					k := int(seq - 0xfffffff0) // wraps past 2^32 on purpose
					if k < int(c.first) || k >= int(c.first)+n || k%(ports*addrs) != idx {
						t.Fatalf("sequence number %#x (frame %d) with port %d and address %s (index %d)", seq, k, sport, src, idx)
					}
					if seen[k] {
						t.Fatalf("frame %d twice", k)
					}
					seen[k] = true
				} else {
					seen[idx] = true
				}
			}
			if want := ports * addrs; c.seq {
				want = n
				if len(seen) != want {
					t.Errorf("%d distinct frames, want %d", len(seen), want)
				}
			} else if len(seen) != want {
				t.Errorf("%d distinct (port, address) pairs, want %d", len(seen), want)
			}
		})
	}
}

// Frame pages are recycled without the template being copied in again, so a receiver's
// rewrites come back: a program on b checks each UDP frame's TTL is the template's, then sets
// it to 1 and drops the frame; any frame arriving with a TTL other than 64 was not restored.
func TestRecycledPagesRestored(t *testing.T) {
	p := newPair(t)
	counts, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer counts.Close()
	// if len ≥ 42 && IPv4 && UDP { counts[ttl != 64]++; ttl = 1; dst MAC[0] ^= 0xff; drop } else pass
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL", Instructions: asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 42),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R4, asm.R2, 12, asm.Half),
		asm.JNE.Imm(asm.R4, 0x0008, "pass"), // 0x0800 read little-endian
		asm.LoadMem(asm.R4, asm.R2, 23, asm.Byte),
		asm.JNE.Imm(asm.R4, protoUDP, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 22, asm.Byte),
		asm.StoreImm(asm.R2, 22, 1, asm.Byte),
		asm.StoreImm(asm.R2, 0, 0xff, asm.Byte),
		asm.Mov.Imm(asm.R0, 0),
		asm.JEq.Imm(asm.R5, 64, "count"),
		asm.Mov.Imm(asm.R0, 1),
		asm.StoreMem(asm.RFP, -4, asm.R0, asm.Word).WithSymbol("count"),
		asm.LoadMapPtr(asm.R1, counts.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "drop"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("drop"), // XDP_DROP
		asm.Return(),
		asm.Mov.Imm(asm.R0, 2).WithSymbol("pass"), // XDP_PASS
		asm.Return(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	var lk link.Link
	if err := nsrun.Do(p.b.Netns, func() error {
		var err error
		lk, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: p.b.Index, Flags: link.XDPDriverMode})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	const n = 20000
	if sent, err := Send(context.Background(), Config{Netns: p.a.Netns, Ifindex: p.a.Index, Frame: p.udpFrame(5000, 9), Count: n, Rate: 30000}); err != nil || sent != n {
		t.Fatalf("sent %d (%v), want %d", sent, err, n)
	}
	var good, bad uint64
	if err := counts.Lookup(uint32(0), &good); err != nil {
		t.Fatal(err)
	}
	if err := counts.Lookup(uint32(1), &bad); err != nil {
		t.Fatal(err)
	}
	if good != n || bad != 0 {
		t.Errorf("%d frames with the template's TTL, %d with a recycled one; want %d and 0", good, bad, n)
	}
}

// TestHeadMaxMatchesProgram: the Go side's template buffer is the program's head[] (its size is
// XDPGEN_HEAD_MAX, read from the compiled object, not from the C source).
func TestHeadMaxMatchesProgram(t *testing.T) {
	spec, err := loadXdpgen()
	if err != nil {
		t.Fatal(err)
	}
	if n := spec.Variables["head"].Size(); n != headMax {
		t.Errorf("the program's head holds %d bytes, Go's headMax is %d", n, headMax)
	}
}

func TestConfigErrors(t *testing.T) {
	udp := packet.IP("198.18.0.1", "198.18.0.2").UDP(65000, 9).Bytes()
	arp := append(make([]byte, 12), 0x08, 0x06, 0, 1)
	long := packet.IP("198.18.0.1", "198.18.0.2").TCP(1, 2, "S").Payload(make([]byte, 200)).Bytes()
	long6 := packet.IP("fd00::1", "fd00::2").IPv6Ext(0, make([]byte, 100)).UDP(1, 2).Bytes()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Ifindex: 1, Frame: udp[:10], Count: 1}, "shorter than an Ethernet header"},
		{Config{Frame: udp, Count: 1}, "Ifindex"},
		{Config{Ifindex: 1, Frame: udp, Count: 1, Rate: -1}, "Rate"},
		{Config{Ifindex: 1, Frame: udp, Count: 1, SrcPorts: 1000}, "run past 65535"},
		{Config{Ifindex: 1, Frame: udp, Count: 1, Seq: true}, "not a TCP frame"},
		{Config{Ifindex: 1, Frame: arp, Count: 1, SrcPorts: 2}, "not an IPv4/IPv6 TCP/UDP frame"},
		{Config{Ifindex: 1, Frame: long6, Count: 1, SrcPorts: 2}, "not an IPv4/IPv6 TCP/UDP frame"}, // extension header
		{Config{Ifindex: 1, Frame: udp, Count: 1, Batch: 257}, "Batch"},
		{Config{Ifindex: 1, Frame: udp}, "never end"},
	} {
		_, err := Send(context.Background(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.cfg, err, c.want)
		}
	}
	if _, err := (&Config{Ifindex: 1, Frame: long, Count: 1, SrcPorts: 2, Seq: true}).validate(); err != nil {
		t.Errorf("a long TCP frame: %v", err)
	}
}

func TestParseFrame(t *testing.T) {
	for _, c := range []struct {
		name  string
		frame []byte
		want  layout
	}{
		{"ipv4 udp", packet.IP("198.18.0.1", "198.18.0.2").UDP(1, 2).Bytes(),
			layout{proto: protoUDP, ipCsum: 24, saddr: 26, l4: 34, l4Csum: 40, headLen: 60}},
		{"ipv4 tcp", packet.IP("198.18.0.1", "198.18.0.2").TCP(1, 2, "S").MSS(1460).Bytes(),
			layout{proto: protoTCP, ipCsum: 24, saddr: 26, l4: 34, l4Csum: 50, seq: 38, headLen: 60}},
		{"ipv6 tcp", packet.IP("fd00::1", "fd00::2").TCP(1, 2, "S").Payload(make([]byte, 100)).Bytes(),
			layout{proto: protoTCP, saddr: 34, l4: 54, l4Csum: 70, seq: 58, headLen: 128}},
		{"ipv4 fragment", packet.IP("198.18.0.1", "198.18.0.2").Fragment(1, false).UDP(1, 2).Bytes(),
			layout{headLen: 60}},
	} {
		got, err := parseFrame(c.frame)
		if err != nil || got != c.want {
			t.Errorf("%s: %+v (%v), want %+v", c.name, got, err, c.want)
		}
	}
	// VLAN-tagged: offsets move by 4.
	f := packet.IP("198.18.0.1", "198.18.0.2").UDP(1, 2).Bytes()
	tagged := append(append(append([]byte(nil), f[:12]...), 0x81, 0, 0, 7), f[12:]...)
	if got, _ := parseFrame(tagged); got.l4 != 38 || got.saddr != 30 {
		t.Errorf("vlan: %+v", got)
	}
}

// capture opens a packet socket on e, runs send, and returns the first n received frames that
// match keep (failing if they do not all come within a few seconds).
func capture(t *testing.T, e testenv.Veth, n int, send func(), keep func([]byte) bool) [][]byte {
	t.Helper()
	var fd int
	if err := nsrun.Do(e.Netns, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: e.Index})
	}); err != nil {
		t.Fatalf("packet socket: %v", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	send()
	var out [][]byte
	buf := make([]byte, 4096)
	for deadline := time.Now().Add(5 * time.Second); len(out) < n && time.Now().Before(deadline); {
		m, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue // timeout: look at the deadline
		}
		if keep(buf[:m]) {
			out = append(out, append([]byte(nil), buf[:m]...))
		}
	}
	if len(out) < n {
		t.Fatalf("captured %d frames, want %d", len(out), n)
	}
	return out
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// dstPort is the TCP/UDP destination port of an untagged IPv4/IPv6 frame, or 0.
func dstPort(f []byte) uint16 {
	l, _ := parseFrame(f)
	if l.l4 == 0 {
		return 0
	}
	return binary.BigEndian.Uint16(f[l.l4+2:])
}

// checkSums recomputes an untagged frame's IPv4 header checksum and TCP/UDP checksum from
// scratch (RFC 1071 over the header, and over the pseudo-header and segment).
func checkSums(t *testing.T, f []byte) {
	t.Helper()
	l, err := parseFrame(f)
	if err != nil || l.l4 == 0 {
		t.Fatalf("not a TCP/UDP frame: %x", f)
	}
	var pseudo []byte
	var segLen int
	if l.ipCsum != 0 {
		ip := f[14:l.l4]
		if s := sum(ip); s != 0xffff {
			t.Errorf("IPv4 header checksum wrong (sum %#x)", s)
		}
		segLen = int(binary.BigEndian.Uint16(ip[2:])) - len(ip)
		pseudo = append(append([]byte(nil), ip[12:20]...), 0, ip[9], byte(segLen>>8), byte(segLen))
	} else {
		ip := f[14:54]
		segLen = int(binary.BigEndian.Uint16(ip[4:]))
		pseudo = append(append([]byte(nil), ip[8:40]...), 0, 0, byte(segLen>>8), byte(segLen), 0, 0, 0, ip[6])
	}
	seg := f[l.l4 : int(l.l4)+segLen]
	if l.proto == protoUDP && binary.BigEndian.Uint16(seg[6:]) == 0 {
		t.Errorf("UDP checksum 0 (none)")
	}
	if s := sum(append(pseudo, seg...)); s != 0xffff {
		t.Errorf("transport checksum wrong (sum %#x) in %x", s, f)
	}
}

// sum is the ones' complement sum of b (0xffff when a checksum inside it is right).
func sum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

func lastWord(a netip.Addr) uint32 {
	s := a.AsSlice()
	return binary.BigEndian.Uint32(s[len(s)-4:])
}

func sameButLastWord(a, b netip.Addr) bool {
	x, y := a.AsSlice(), b.AsSlice()
	return len(x) == len(y) && string(x[:len(x)-4]) == string(y[:len(y)-4])
}
