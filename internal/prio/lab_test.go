package prio

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/vishvananda/netlink"

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

// TestLabAdvertiseAndClassify: h1's connections to h2 carry the option (seen on the wire by a
// capture on h2, whose plain Linux TCP accepts every segment: the transfer completes), r1's
// classifier reads it and puts the flow into a backlog band, and remove leaves no qdisc,
// program, pin or record.
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
	if err := Host(name, cg, &HostPolicy{File: "test", Advertise: []match.Match{sel}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = RemoveHost(name) })
	dev := device(t, l, "r1", "eth1")
	pol := &RouterPolicy{File: "test", Scheme: Backlog, Leaves: 2, MinRate: 0.05, Limit: 100,
		Thresholds: []uint64{64e3, 1e6}, Trust: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24")}}
	if err := nsrun.Do(l.Netns("r1"), func() error { return Router(dev, 50e6, pol) }); err != nil {
		t.Fatal(err)
	}

	// A capture on h2 of the handshakes and first segments of the transfer.
	pcap := filepath.Join(t.TempDir(), "h2.pcap")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dump, err := l.Command(ctx, "h2", "tcpdump", "-i", "any", "-U", "-c", "300", "-s", "128", "-w", pcap, "tcp port 5301")
	if err != nil {
		t.Fatal(err)
	}
	if err := dump.Start(); err != nil {
		t.Fatal(err)
	}
	srv, err := l.Command(ctx, "h2", "iperf3", "-s", "-1", "-p", "5301")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // iperf3 -s has no readiness signal; a refused connect is retried below
	var out []byte
	for try := 0; try < 20; try++ {
		cli, err := l.Command(ctx, "h1", "iperf3", "-c", h2, "-p", "5301", "-t", "2", "-f", "m")
		if err != nil {
			t.Fatal(err)
		}
		fd, err := cgroup.Into(cli.Cmd, cg)
		if err != nil {
			t.Fatal(err)
		}
		out, err = cli.CombinedOutput()
		fd.Close()
		if err == nil {
			break
		}
		if !strings.Contains(string(out), "refused") {
			t.Fatalf("iperf3 through the classifier failed: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := srv.Wait(); err != nil {
		t.Errorf("iperf3 server: %v", err)
	}
	if err := dump.Wait(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}

	// On the wire: SYNs and data segments from h1 carry kind 253 with our ExID, its value
	// decodes, and pure ACKs carry nothing.
	f, err := os.Open(pcap)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var data, with, syns, synsWith, acksWith int
	var maxBacklog uint32
	src := gopacket.NewPacketSource(r, r.LinkType())
	for p := range src.Packets() {
		tcp, _ := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
		ip, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if tcp == nil || ip == nil || ip.DstIP.String() != h2 {
			continue
		}
		carries := false
		for _, o := range tcp.Options {
			if o.OptionType != 253 {
				continue
			}
			raw := append([]byte{253, o.OptionLength}, o.OptionData...)
			if opt, ok := Decode(raw); ok {
				carries = true
				maxBacklog = max(maxBacklog, opt.Backlog)
			}
		}
		switch {
		case tcp.SYN:
			syns++
			synsWith += b2i(carries)
		case len(tcp.Payload) > 0:
			data++
			with += b2i(carries)
		default:
			acksWith += b2i(carries)
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
	st0, err := ReadStatus()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(st0.Hosts, func(h HostStatus) bool { return h.Name == name })
	if i < 0 {
		t.Fatalf("host %s not in the status", name)
	}
	if c := st0.Hosts[i].Counters; c["matched"] != 2 || c["unmatched"] != 1 {
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
		ns, _ := pin.ThisNetns()
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
