package prio

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/match"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/testenv"
)

// testCgroup makes a cgroup fp<unique> under the v2 root, removed at cleanup.
func testCgroup(t *testing.T) string {
	t.Helper()
	root, err := cgroup.Mount()
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(root, testenv.Name("cg"))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cgroup.Remove(cg); err != nil {
			t.Error(err)
		}
	})
	return cg
}

// device is the lab's name of node's interface ifc (eth0, eth1, …).
func device(t *testing.T, l *lab.Lab, node, ifc string) string {
	t.Helper()
	n, err := l.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range n.Ifaces {
		if i.Name == ifc {
			return l.IfName(i)
		}
	}
	t.Fatalf("%s has no %s", node, ifc)
	return ""
}

// TestLabAdvertiseAndClassify: with refresh 0, h1's connections to h2 carry the option on
// every SYN and data segment (seen on the wire by a capture on h2, whose plain Linux TCP accepts
// every segment: the transfer completes), r1's classifier reads it and puts the flow into a
// backlog band, and remove leaves no qdisc, program, pin or record.
func TestLabAdvertiseAndClassify(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "iperf3", "tcpdump", "python3")
	l := labtest.Up(t, labtest.HostRouterHost)
	h2 := labtest.Addr(t, l, "h2", "4")
	cg := testCgroup(t)
	name := testenv.Name("h")
	sel := match.Any()
	sel.Remote = []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}
	sel.RemotePort = match.PortRange{Lo: 5301, Hi: 5301}
	if err := Host(name, cg, &HostPolicy{File: "test", Advertise: []match.Match{sel}, Refresh: 0}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = RemoveHost(name) })
	dev := device(t, l, "r1", "eth1")
	pol := &RouterPolicy{File: "test", Scheme: Backlog, Leaves: 2, MinRate: 0.05, Limit: 100,
		Thresholds: []uint64{64e3, 1e6}, Trust: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24")}}
	if err := nsrun.Do(l.Netns("r1"), func() error { return Router(dev, 50e6, pol) }); err != nil {
		t.Fatal(err)
	}
	// Before the lab goes: a failed test leaves no record under /run (the test removes it too).
	t.Cleanup(func() { _ = nsrun.Do(l.Netns("r1"), func() error { return RemoveRouter(dev) }) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// On the wire: SYNs and data segments from h1 carry kind 253 with our ExID, its value
	// decodes, and pure ACKs carry nothing.
	var data, with, syns, synsWith, acksWith int
	var maxBacklog uint32
	for _, sg := range iperfCaptured(t, ctx, l, cg, "h2", "any", 5301, "-t", "2") {
		if sg.carries {
			maxBacklog = max(maxBacklog, sg.opt.Backlog)
		}
		switch {
		case sg.syn:
			syns++
			synsWith += b2i(sg.carries)
		case sg.data:
			data++
			with += b2i(sg.carries)
		default:
			acksWith += b2i(sg.carries)
		}
	}
	if data == 0 || with != data {
		t.Errorf("%d of %d data segments from h1 carry the option", with, data)
	}
	if syns == 0 || synsWith != syns || acksWith != 0 {
		t.Errorf("%d of %d SYNs from h1 carry the option (want all), %d pure ACKs do (want 0)", synsWith, syns, acksWith)
	}
	if maxBacklog == 0 {
		t.Error("every advertised backlog was 0 during a bulk transfer")
	}

	// The selector took both of iperf3's connections to :5301 and takes none to another port
	// (a connect to a closed port still opens actively).
	other, err := l.Command(ctx, "h1", "python3", "-c", fmt.Sprintf("import socket; socket.socket().connect_ex((%q, 5302))", h2))
	if err != nil {
		t.Fatal(err)
	}
	ofd, err := cgroup.Into(other.Cmd, cg)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := other.CombinedOutput(); err != nil {
		t.Fatalf("connect to :5302: %v: %s", err, out)
	}
	ofd.Close()
	if c := hostCounters(t, name); c["matched"] != 2 || c["unmatched"] != 1 {
		t.Errorf("host counters %v: want 2 matched (:5301), 1 unmatched (:5302)", c)
	}

	// On r1: the flow was parsed and classified into a backlog band, not the default one.
	st := statusIn(t, l)
	rs := st.Routers[0]
	if rs.Counters["parsed"] == 0 {
		t.Errorf("the classifier parsed no option: %v", rs.Counters)
	}
	var banded uint32
	for _, c := range rs.Classes {
		if c.Band < pol.DefaultBand() {
			banded += c.Packets
		}
	}
	if banded == 0 {
		t.Errorf("no packet went to a backlog band: %+v", rs.Classes)
	}
	found := false
	for _, fl := range rs.Flows {
		if strings.HasSuffix(fl.Dst, ":5301") && fl.InfoFromOption == "tcp-option" {
			found = true
		}
	}
	if !found {
		t.Errorf("no flow to :5301 with advertised information: %+v", rs.Flows)
	}

	// remove leaves nothing behind.
	if err := nsrun.Do(l.Netns("r1"), func() error { return RemoveRouter(dev) }); err != nil {
		t.Fatal(err)
	}
	err = nsrun.Do(l.Netns("r1"), func() error {
		link, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		qs, err := netlink.QdiscList(link)
		if err != nil {
			return err
		}
		for _, q := range qs {
			if q.Attrs().Handle>>16 == Major {
				t.Errorf("qdisc %s %x: left behind", q.Type(), q.Attrs().Handle)
			}
		}
		ns, _ := attach.ThisNetns()
		if _, err := os.Stat(pin.Path(routerPin(ns, dev)...)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("router pins left behind: %v", err)
		}
		if _, err := os.Stat(runstate.Path(subsystem, routerRecordName(ns, dev))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("router record left behind: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := RemoveHost(name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pin.Path(hostPin(name)...)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("host pins left behind: %v", err)
	}
}

// TestLabAdvertiseOnChange: a connection writes the option on its SYN and then only when the
// advertisement moved by a step (backlog by an eighth, occupancy by 5 points), no sooner than
// min_interval after its last write (its first data segment excepted), or when a refresh fell
// due. A capture on h1 (every packet h1 sends, in the order the writer decided) shows it. With
// an hour's refresh every advertisement after a connection's first is a step from the one
// before, and the bulk connection sends data segments with it and without. With a 20-ms
// refresh a paced flow whose backlog stays put (1000 bytes at a time, sent at once) carries it
// again at refreshes that are no step, each a refresh (less a coarse-clock tick) after the
// write before it. With a 20-ms min_interval a paced flow whose every send is a step (iperf3
// writes 128 KB every 2.5 ms, sent as two 64-KB TSO packets: backlog 128 KB, then 64 KB) writes
// no two data segments' advertisements closer than that.
func TestLabAdvertiseOnChange(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "iperf3", "tcpdump")
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	name := testenv.Name("h")
	t.Cleanup(func() { _ = RemoveHost(name) })
	tick, err := coarseTick()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h1dev := device(t, l, "h1", "eth0")
	for _, c := range []struct {
		refresh, minInterval time.Duration
		port                 int
		args                 []string
	}{
		{time.Hour, 0, 5321, []string{"-t", "1"}},
		{20 * time.Millisecond, 0, 5322, []string{"-t", "1", "-b", "1600k", "-l", "1000"}},
		{time.Hour, 20 * time.Millisecond, 5323, []string{"-t", "1", "-b", "400M"}},
	} {
		if err := Host(name, cg, &HostPolicy{File: "test", Advertise: []match.Match{match.Any()}, Refresh: c.refresh, MinInterval: c.minInterval}); err != nil {
			t.Fatal(err)
		}
		conns := map[layers.TCPPort][]segment{}
		var bulk layers.TCPPort // iperf3's data connection: the one with the most packets
		for _, sg := range iperfCaptured(t, ctx, l, cg, "h1", h1dev, c.port, c.args...) {
			conns[sg.sport] = append(conns[sg.sport], sg)
			if sg.data && len(conns[sg.sport]) > len(conns[bulk]) {
				bulk = sg.sport
			}
		}
		var bare, carrying, refreshes int // the data connection's data segments; its writes that were no step
		for sport, segs := range conns {
			var last, lastData *segment // the last write; the last data segment's write
			for i, sg := range segs {
				if sg.syn && !sg.carries {
					t.Errorf("refresh %v, :%d: a SYN without the option", c.refresh, sport)
				}
				if sport == bulk && sg.data && !sg.syn {
					bare += b2i(!sg.carries)
					carrying += b2i(sg.carries)
				}
				if !sg.carries {
					continue
				}
				if i > 0 && segs[i-1].carries && segs[i-1].opt == sg.opt && sg.at.Sub(segs[i-1].at) < time.Millisecond {
					continue // a copy: GSO cut one packet the writer wrote into these segments
				}
				if lastData != nil && sg.data && sg.at.Sub(lastData.at) < c.minInterval-2*time.Millisecond {
					t.Errorf("min_interval %v, :%d segment %d: written %v after the write before it", c.minInterval, sport, i, sg.at.Sub(lastData.at))
				}
				if last != nil && !sg.syn && !isStep(last.opt, sg.opt) {
					gap := sg.at.Sub(last.at)
					switch {
					case c.refresh == time.Hour:
						t.Errorf("refresh 1h, :%d segment %d: advertised %+v after %+v, no step", sport, i, sg.opt, last.opt)
					case gap < c.refresh-tick-2*time.Millisecond:
						t.Errorf("refresh %v, :%d segment %d: no step (%+v after %+v) only %v after the last write", c.refresh, sport, i, sg.opt, last.opt, gap)
					}
					if sport == bulk {
						refreshes++
					}
				}
				last = &segs[i]
				if sg.data {
					lastData = &segs[i]
				}
			}
		}
		ctr := hostCounters(t, name)
		t.Logf("refresh %v, min_interval %v: %d connections; the data connection's data segments: %d with the option, %d without, %d refreshes that were no step; counters %v",
			c.refresh, c.minInterval, len(conns), carrying, bare, refreshes, ctr)
		if ctr["no_room"] != 0 || ctr["unchanged"] == 0 {
			t.Errorf("refresh %v: no_room %d (want 0), unchanged %d (want some)", c.refresh, ctr["no_room"], ctr["unchanged"])
		}
		if held := ctr["held"]; (c.minInterval != 0) != (held != 0) {
			t.Errorf("min_interval %v: %d steps held", c.minInterval, held)
		}
		if bare == 0 || carrying == 0 {
			t.Errorf("refresh %v: %d data segments with the option, %d without; want some of each", c.refresh, carrying, bare)
		}
		if c.refresh != time.Hour && refreshes < 2 {
			t.Errorf("refresh %v: %d refreshes over a 1-s paced flow, want at least 2", c.refresh, refreshes)
		}
	}
}

// TestLabWriterStaysWithinMTU: the writer reserves the option's room only at the kernel's MSS
// sizings around a write, and writes it only into segments sized with that room (or small
// enough), so no segment outgrows the MTU: r1 forwards every packet of a bulk flow, with TSO
// and without, and with the kernel probing the path MTU (which sizes the MSS again while it
// sends), none is refused (no fragmentation needed, no ICMP), and h1 learns no smaller path MTU.
// A 1-ms refresh makes writes fall due all the time, so the MSS changes at most sends.
func TestLabWriterStaysWithinMTU(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "iperf3", "tcpdump", "ethtool")
	l := labtest.Up(t, labtest.HostRouterHost)
	cg := testCgroup(t)
	name := testenv.Name("h")
	t.Cleanup(func() { _ = RemoveHost(name) })
	if err := Host(name, cg, &HostPolicy{File: "test", Advertise: []match.Match{match.Any()}, Refresh: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h1dev := device(t, l, "h1", "eth0")
	for i, c := range []struct{ offload, mtuProbing string }{{"on", "0"}, {"off", "0"}, {"on", "2"}} {
		labtest.Run(t, l, "h1", "ethtool", "-K", h1dev, "tso", c.offload, "gso", c.offload)
		labtest.Run(t, l, "h1", "sysctl", "-qw", "net.ipv4.tcp_mtu_probing="+c.mtuProbing)
		before := hostCounters(t, name)
		iperfCaptured(t, ctx, l, cg, "h1", h1dev, 5331+i, "-t", "2")
		after := hostCounters(t, name)
		written, deferred := after["written"]-before["written"], after["deferred"]-before["deferred"]
		t.Logf("TSO %s, tcp_mtu_probing %s: %d segments written, %d deferred to the next MSS sizing", c.offload, c.mtuProbing, written, deferred)
		if written < 100 {
			t.Errorf("TSO %s, tcp_mtu_probing %s: %d segments carried the option in a 2-s bulk flow with a 1-ms refresh, want hundreds", c.offload, c.mtuProbing, written)
		}
	}
	for _, node := range []string{"h1", "r1", "h2"} {
		ip, icmp := snmp(t, l, node, "Ip"), snmp(t, l, node, "Icmp")
		if ip["FragFails"] != 0 || ip["FragCreates"] != 0 || icmp["OutDestUnreachs"] != 0 {
			t.Errorf("%s: FragFails %d, FragCreates %d, ICMP destination unreachable sent %d: a segment outgrew the MTU",
				node, ip["FragFails"], ip["FragCreates"], icmp["OutDestUnreachs"])
		}
	}
	if route := labtest.Run(t, l, "h1", "ip", "-4", "route", "get", labtest.Addr(t, l, "h2", "4")); strings.Contains(route, "mtu") {
		t.Errorf("h1's route to h2: %s: want no learned path MTU", route)
	}
}

// snmp reads the counters of one protocol's lines in node's /proc/net/snmp.
func snmp(t *testing.T, l *lab.Lab, node, proto string) map[string]uint64 {
	t.Helper()
	var names []string
	got := map[string]uint64{}
	for line := range strings.Lines(labtest.Run(t, l, node, "cat", "/proc/net/snmp")) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != proto+":" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		for i, v := range f[1:] {
			if i < len(names) {
				got[names[i]], _ = strconv.ParseUint(v, 10, 64)
			}
		}
	}
	if len(got) == 0 {
		t.Fatalf("/proc/net/snmp on %s has no %s counters", node, proto)
	}
	return got
}

// isStep mirrors the host program's rule: a change worth writing.
func isStep(last, cur Option) bool {
	lu, cu := last.Backlog/BacklogUnit, cur.Backlog/BacklogUnit
	d := max(lu, cu) - min(lu, cu)
	if d != 0 && d<<3 >= lu {
		return true
	}
	if last.Occupancy == cur.Occupancy {
		return false
	}
	if last.Occupancy > 100 || cur.Occupancy > 100 {
		return true
	}
	return max(last.Occupancy, cur.Occupancy)-min(last.Occupancy, cur.Occupancy) >= 5
}

// segment is one TCP packet towards the iperf3 server, as captured.
type segment struct {
	at        time.Time // captured
	sport     layers.TCPPort
	syn, data bool
	carries   bool // our option, decoded into opt
	opt       Option
}

// iperfCaptured runs iperf3 from h1, in cgroup cg, to h2:port with args, while tcpdump on
// node's interface dev captures the first 300 packets towards port; it returns them in order.
// The iperf3 run must succeed: h2's plain Linux TCP accepted every segment.
func iperfCaptured(t *testing.T, ctx context.Context, l *lab.Lab, cg, node, dev string, port int, args ...string) []segment {
	t.Helper()
	h2 := labtest.Addr(t, l, "h2", "4")
	p := strconv.Itoa(port)
	packets := labtest.Capture(t, l, node, []string{"-i", dev, "-c", "300", "tcp dst port " + p}, func() {
		srv, err := l.Command(ctx, "h2", "iperf3", "-s", "-1", "-p", p)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // iperf3 -s has no readiness signal; a refused connect is retried below
		for try := 0; ; try++ {
			cli, err := l.Command(ctx, "h1", "iperf3", append([]string{"-c", h2, "-p", p, "-f", "m"}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			fd, err := cgroup.Into(cli.Cmd, cg)
			if err != nil {
				t.Fatal(err)
			}
			out, err := cli.CombinedOutput()
			fd.Close()
			if err == nil {
				break
			}
			if !strings.Contains(string(out), "refused") || try == 20 {
				t.Fatalf("iperf3 to :%d failed: %v\n%s", port, err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := srv.Wait(); err != nil {
			t.Errorf("iperf3 server: %v", err)
		}
	})
	var out []segment
	for _, pk := range packets {
		tcp, _ := pk.Layer(layers.LayerTypeTCP).(*layers.TCP)
		ip, _ := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if tcp == nil || ip == nil || ip.DstIP.String() != h2 {
			continue
		}
		sg := segment{at: pk.Metadata().Timestamp, sport: tcp.SrcPort, syn: tcp.SYN, data: len(tcp.Payload) > 0}
		for _, o := range tcp.Options {
			if o.OptionType != 253 {
				continue
			}
			if opt, ok := Decode(append([]byte{253, o.OptionLength}, o.OptionData...)); ok {
				sg.carries, sg.opt = true, opt
			}
		}
		out = append(out, sg)
	}
	return out
}

// hostCounters reads the counters of host attachment name.
func hostCounters(t *testing.T, name string) map[string]uint64 {
	t.Helper()
	st, err := ReadStatus()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(st.Hosts, func(h HostStatus) bool { return h.Name == name })
	if i < 0 {
		t.Fatalf("host %s not in the status", name)
	}
	return st.Hosts[i].Counters
}

func statusIn(t *testing.T, l *lab.Lab) *Status {
	t.Helper()
	var st *Status
	err := nsrun.Do(l.Netns("r1"), func() error {
		var err error
		st, err = ReadStatus()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Routers) != 1 {
		t.Fatalf("%d routers in r1's status, want 1", len(st.Routers))
	}
	return st
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
