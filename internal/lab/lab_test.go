package lab_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/testenv"
)

const threeNodes = `
nodes:
  h1: {env: {GREETING: hello}}
  r1: {kind: router}
  h2: {}
links:
  - endpoints: [h1, r1]
  - endpoints: [r1, h2]
`

func TestThreeNodeLabPingAndIperf(t *testing.T) {
	t.Parallel()
	l := labtest.Up(t, threeNodes)
	for _, fam := range []string{"4", "6"} {
		dst := labtest.Addr(t, l, "h2", fam)
		out := labtest.Run(t, l, "h1", "ping", "-"+fam, "-c", "3", "-i", "0.2", "-W", "2", dst)
		if !strings.Contains(out, " 0% packet loss") {
			t.Errorf("ping -%s %s: %s", fam, dst, out)
		}
		// TTL 63: one router on the way.
		if fam == "4" && !strings.Contains(out, "ttl=63") {
			t.Errorf("ping crossed no router? %s", out)
		}
		r := labtest.Iperf(t, l, "h1", "h2", dst, "-t", "2")
		t.Logf("iperf3 IPv%s h1→h2: %.0f Mbit/s, %d retransmits", fam, r.ReceivedBPS/1e6, r.Retransmits)
		if r.ReceivedBPS <= 0 {
			t.Errorf("iperf3 IPv%s moved no data", fam)
		}
	}
	if out := labtest.Run(t, l, "h1", "sh", "-c", `echo "$GREETING $FP_NODE $FP_LAB"`); out != "hello h1 "+l.Name()+"\n" {
		t.Errorf("node environment: %q", out)
	}
	if out := labtest.Run(t, l, "r1", "cat", "/proc/sys/net/ipv4/ip_forward"); out != "1\n" {
		t.Errorf("r1 does not forward: %q", out)
	}
	if out := labtest.Run(t, l, "h1", "cat", "/proc/sys/net/ipv4/ip_forward"); out != "0\n" {
		t.Errorf("h1 forwards: %q", out)
	}
}

func TestRateIsShapedByHTB(t *testing.T) {
	t.Parallel()
	l := labtest.Up(t, `
nodes: {h1: {}, h2: {}}
links:
  - endpoints: [h1, h2]
    rate: 40mbit
`)
	r := labtest.Iperf(t, l, "h1", "h2", labtest.Addr(t, l, "h2", "4"), "-t", "2", "-O", "1")
	ratio := r.ReceivedBPS / 40e6
	t.Logf("goodput %.2f Mbit/s = %.3f × the 40mbit rate", r.ReceivedBPS/1e6, ratio)
	// HTB never lets more through than the rate; how close a busy machine gets to it is
	// measured by `BENCH=lab make bench`, not asserted here.
	if ratio > 1.1 || ratio <= 0 {
		t.Errorf("goodput %.2f Mbit/s: want above 0 and at most 40 Mbit/s (+10%%)", r.ReceivedBPS/1e6)
	}
}

func TestLossProbability(t *testing.T) {
	t.Parallel()
	const percent, packets = 10.0, 120000
	l := labtest.Up(t, `
nodes: {h1: {}, h2: {}}
links:
  - endpoints: [h1, h2]
    loss: 10%
`)
	send := udpFlow(t, l)
	for i := range packets {
		if err := send(); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	h1 := l.Topology.Node("h1").Ifaces[0]
	c, ok, err := l.ReadLoss(h1)
	if err != nil || !ok {
		t.Fatalf("read loss counters: ok=%v err=%v", ok, err)
	}
	total := c.Passed + c.Dropped
	got := 100 * float64(c.Dropped) / float64(total)
	t.Logf("loss program: %d of %d packets dropped = %.3f%% (configured %g%%)", c.Dropped, total, got, percent)
	if total < packets {
		t.Fatalf("only %d packets crossed the loss program, want ≥ %d", total, packets)
	}
	if got < percent*0.85 || got > percent*1.15 {
		t.Errorf("measured loss %.3f%% is not within ±15%% of %g%%", got, percent)
	}
	// What the program passed is what h2 received.
	st, err := l.Status()
	if err != nil {
		t.Fatal(err)
	}
	rx := st.Nodes[1].Ifaces[0].RxPackets
	if rx > c.Passed || float64(rx) < 0.98*float64(c.Passed) {
		t.Errorf("h2 received %d packets, the loss program passed %d", rx, c.Passed)
	}
}

// An XDP forwarder's neighbours get what they need to exchange redirected frames with it, as
// `ethtool -k` sees it; nodes not next to one keep the defaults.
func TestXDPNodePreparesItsPeers(t *testing.T) {
	t.Parallel()
	l := labtest.Up(t, `
nodes:
  h1: {}
  r1: {kind: router, xdp: true}
  h2: {}
  r2: {kind: router}
  h3: {}
links:
  - endpoints: [h1, r1]
  - endpoints: [r1, h2]
    rate: 500mbit
  - endpoints: [h2, r2]
  - endpoints: [r2, h3]
`)
	for _, c := range []struct {
		node  string
		iface int
		want  map[string]string
		qdisc string // root qdisc
	}{
		{"h1", 0, map[string]string{"tx-checksumming": "off", "generic-receive-offload": "on"}, "pfifo_fast"},
		{"h2", 0, map[string]string{"tx-checksumming": "off", "generic-receive-offload": "on"}, "htb"}, // shaped link
		{"h2", 1, map[string]string{"tx-checksumming": "on", "generic-receive-offload": "off"}, "noqueue"},
		{"r1", 0, map[string]string{"tx-checksumming": "on", "generic-receive-offload": "off"}, "pfifo_fast"},
		// r1 → h2 is shaped where it arrives, on h2 (XDP redirects skip r1's qdisc): r1 keeps a queue.
		{"r1", 1, map[string]string{"tx-checksumming": "on", "generic-receive-offload": "off"}, "pfifo_fast"},
		{"h3", 0, map[string]string{"tx-checksumming": "on", "generic-receive-offload": "off"}, "noqueue"},
	} {
		n, err := l.Node(c.node)
		if err != nil {
			t.Fatal(err)
		}
		dev := l.IfName(n.Ifaces[c.iface])
		out := labtest.Run(t, l, c.node, "ethtool", "-k", dev)
		for feature, want := range c.want {
			if !strings.Contains(out, "\n"+feature+": "+want) {
				t.Errorf("%s %s: want %s: %s in:\n%s", c.node, dev, feature, want, out)
			}
		}
		// Both ends of an XDP node's links get a queue that holds a burst while a ring is full.
		if qd := labtest.Run(t, l, c.node, "tc", "qdisc", "show", "dev", dev, "root"); !strings.HasPrefix(qd, "qdisc "+c.qdisc+" ") {
			t.Errorf("%s %s: root qdisc %q, want %s", c.node, dev, qd, c.qdisc)
		}
	}
	// What r1 sends to h2 is shaped on h2: its ingress goes through an ifb with the link's HTB.
	h2 := l.Topology.Node("h2").Ifaces[0]
	ifb := "fpi" + strings.TrimPrefix(l.IfName(h2), "fp")
	if qd := labtest.Run(t, l, "h2", "tc", "class", "show", "dev", ifb); !strings.Contains(qd, "rate 500Mbit") {
		t.Errorf("h2 %s: classes %q, want the link's rate", ifb, qd)
	}
	if f := labtest.Run(t, l, "h2", "tc", "filter", "show", "dev", l.IfName(h2), "ingress"); !strings.Contains(f, "Redirect to device "+ifb) {
		t.Errorf("h2 %s ingress: %q, want a redirect to %s", l.IfName(h2), f, ifb)
	}
}

// A link between two xdp nodes cannot be impaired (nothing on it runs after both XDP hooks).
func TestXDPLinkImpairmentRefused(t *testing.T) {
	t.Parallel()
	_, err := lab.Parse("x.yaml", []byte(`
nodes:
  r1: {kind: router, xdp: true}
  r2: {kind: router, xdp: true}
links:
  - endpoints: [r1, r2]
    loss: 1%
`), "fpxx")
	if err == nil || !strings.Contains(err.Error(), "x.yaml:6: links[0]: a link between two xdp nodes") {
		t.Fatalf("Parse: %v", err)
	}
	// Nor can one direction of it, through an endpoint's own rate.
	_, err = lab.Parse("x.yaml", []byte(`
nodes:
  r1: {kind: router, xdp: true}
  r2: {kind: router, xdp: true}
links:
  - endpoints: [r1, {node: r2, rate: 10mbit}]
`), "fpxx")
	if err == nil || !strings.Contains(err.Error(), "x.yaml:6: links[0]: a link between two xdp nodes") {
		t.Fatalf("Parse with an endpoint's rate: %v", err)
	}
}

func TestUpRefusesNameInUse(t *testing.T) {
	t.Parallel()
	l := labtest.Up(t, threeNodes)
	top, err := lab.Parse("again.yaml", []byte(threeNodes), l.Name())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lab.Up("again.yaml", []byte(threeNodes), top); !errors.Is(err, lab.ErrExists) {
		t.Fatalf("second up of %s: %v, want ErrExists", l.Name(), err)
	}
}

func TestDownLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	name := "d" + testenv.Name("")[2:]
	yaml := threeNodes + "    loss: 1%\n    rate: 100mbit\n"
	top, err := lab.Parse("down.yaml", []byte(yaml), name)
	if err != nil {
		t.Fatal(err)
	}
	l, err := lab.Up("down.yaml", []byte(yaml), top)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pin.Path("lab", name)); err != nil {
		t.Fatalf("lab pinned nothing: %v", err)
	}
	// A process left running on a node would keep its namespace, and the veths, alive.
	sleeper, err := l.Command(context.Background(), "h1", "sleep", "600")
	if err != nil {
		t.Fatal(err)
	}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	// A per-namespace instance pinned on r1 (as conntrack pins its table) goes with the lab.
	var st unix.Stat_t
	if err := unix.Stat(nsrun.Path(l.Netns("r1")), &st); err != nil {
		t.Fatal(err)
	}
	sub := testenv.Name("sub")
	t.Cleanup(func() { _ = pin.Remove(sub) })
	dir, err := pin.Dir(sub, pin.Netns(st.Ino))
	if err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(filepath.Join(dir, "table")); err != nil {
		t.Fatal(err)
	}
	if err := lab.Down(name); err != nil {
		t.Fatal(err)
	}
	if err := sleeper.Wait(); err == nil {
		t.Error("the process on h1 survived lab down")
	}
	assertGone(t, name)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("r1's instance pin %s survived lab down (%v)", dir, err)
	}
	if err := lab.Down(name); !errors.Is(err, lab.ErrNotFound) {
		t.Errorf("second down: %v, want ErrNotFound", err)
	}
}

// TestFailedUpRollsBack makes the last step of Up fail (a pin is already where the last loss
// program wants to pin its counters) and checks Up removed everything it had made.
func TestFailedUpRollsBack(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	name := "r" + testenv.Name("")[2:]
	yaml := threeNodes + "    loss: 1%\n"
	top, err := lab.Parse("rollback.yaml", []byte(yaml), name)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := pin.Dir("lab", name, "h2", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pin.Remove("lab", name) })
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(filepath.Join(dir, "stats")); err != nil {
		t.Fatal(err)
	}
	_, err = lab.Up("rollback.yaml", []byte(yaml), top)
	if err == nil {
		_ = lab.Down(name)
		t.Fatal("up succeeded despite the blocked pin")
	}
	t.Logf("up failed as arranged: %v", err)
	if !strings.Contains(err.Error(), "rolled back") {
		t.Errorf("error does not say it rolled back: %v", err)
	}
	assertGone(t, name)
}

func assertGone(t *testing.T, name string) {
	t.Helper()
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), lab.Netns(name, "")) {
			t.Errorf("namespace %s is left", e.Name())
		}
	}
	if _, err := os.Stat(pin.Path("lab", name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pins under %s are left (%v)", pin.Path("lab", name), err)
	}
	if names, _ := lab.Names(); slices.Contains(names, name) {
		t.Errorf("lab %s is still listed", name)
	}
	// The veths lived only in the lab's namespaces; none may have leaked into the host's.
	data, err := os.ReadFile("/proc/net/dev") // the test process runs in the host's namespace
	if err != nil {
		t.Fatal(err)
	}
	out := string(data)
	if strings.Contains(out, lab.IfName(name, "")) {
		t.Errorf("host namespace has lab interfaces:\n%s", out)
	}
}

// TestLossIsHiddenFromTheSender: a packet lost on the link must look sent to the sender, as on a
// wire (and as netem does). A send error would make TCP treat loss as local congestion.
func TestLossIsHiddenFromTheSender(t *testing.T) {
	t.Parallel()
	l := labtest.Up(t, `
nodes: {h1: {}, h2: {}}
links:
  - endpoints: [h1, h2]
    loss: 50%
`)
	send := udpFlow(t, l)
	for i := range 1000 {
		if err := send(); err != nil {
			t.Fatalf("send %d failed: %v", i, err)
		}
	}
	c, _, err := l.ReadLoss(l.Topology.Node("h1").Ifaces[0])
	if err != nil || c.Dropped == 0 {
		t.Fatalf("the loss program dropped nothing (%+v, %v)", c, err)
	}
}

// udpFlow returns a function sending one UDP datagram from h1 to a socket listening on h2 over
// their link. The socket has IP_RECVERR, so a local send failure shows as an error (without it
// the kernel hides ENOBUFS from UDP). h1 knows h2's MAC for good: heavy loss could otherwise
// starve ARP and fail sends with EHOSTUNREACH.
func udpFlow(t *testing.T, l *lab.Lab) func() error {
	t.Helper()
	var sink, conn net.PacketConn
	var mac net.HardwareAddr
	h1, h2 := l.Topology.Node("h1").Ifaces[0], l.Topology.Node("h2").Ifaces[0]
	if err := nsrun.Do(l.Netns("h2"), func() (err error) {
		dev, err := netlink.LinkByName(l.IfName(h2))
		if err != nil {
			return err
		}
		mac = dev.Attrs().HardwareAddr
		sink, err = net.ListenPacket("udp4", ":9")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	recverr := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVERR, 1) }); err != nil {
			return err
		}
		return serr
	}}
	if err := nsrun.Do(l.Netns("h1"), func() error {
		dev, err := netlink.LinkByName(l.IfName(h1))
		if err != nil {
			return err
		}
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: dev.Attrs().Index, IP: h2.IPv4.Addr().AsSlice(), HardwareAddr: mac, State: netlink.NUD_PERMANENT}); err != nil {
			return err
		}
		conn, err = recverr.ListenPacket(context.Background(), "udp4", ":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	dst := &net.UDPAddr{IP: h2.IPv4.Addr().AsSlice(), Port: 9}
	payload := []byte("x")
	return func() error {
		_, err := conn.WriteTo(payload, dst)
		return err
	}
}
