package altmark

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/testenv"
)

// Two hosts on one link: the marker on h1's egress, h2 a plain Linux receiver.
const hostHost = `
nodes:
  h1: {}
  h2: {}
links:
  - endpoints: [h1, h2]
`

func labDev(t *testing.T, l *lab.Lab, node string) string {
	t.Helper()
	n, err := l.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	return l.IfName(n.Ifaces[0])
}

// taiOffset is CLOCK_TAI − CLOCK_REALTIME (pcap timestamps are realtime).
func taiOffset() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_REALTIME, &ts)
	return time.Duration(tai() - ts.Nano())
}

func markIn(t *testing.T, l *lab.Lab, node, dev, cfg string) *MarkConfig {
	t.Helper()
	c, err := ParseMarkConfig("lab.yaml", []byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if err := nsrun.Do(l.Netns(node), func() error { return Mark(dev, c) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nsrun.Do(l.Netns(node), func() error { return RemoveMark(dev) }) })
	return c
}

func markStatusIn(t *testing.T, l *lab.Lab, node string) MarkStatus {
	t.Helper()
	var st []MarkStatus
	if err := nsrun.Do(l.Netns(node), func() (err error) { st, err = ReadMarkStatus(); return err }); err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 {
		t.Fatalf("%d markers in %s's status, want 1", len(st), node)
	}
	return st[0]
}

// guard is how far from a color change a capture timestamp must be for the test to know the
// period the packet was marked in: marking on h1 and the timestamp on h2 are µs apart, more on a
// busy machine.
const guard = 15 * time.Millisecond

// colorAt is the color a packet seen at realtime ts has, and whether ts is more than guard
// away from a color change (else the packet may have been marked in the period before).
func colorAt(ts time.Time, off time.Duration, c *MarkConfig, guard time.Duration) (color int, period int64, pos time.Duration, sure bool) {
	l := int64(c.Period)
	n := ts.UnixNano() + int64(off)
	period = n / l
	pos = time.Duration(n % l)
	return int((period + int64(c.StartColor)) % 2), period, pos, pos > guard && pos < time.Duration(l)-guard
}

// altmarkData is the AltMark option's 4 data bytes in the packet's only Destination Options
// (or Hop-by-Hop) header, which must hold that option only.
func altmarkData(p gopacket.Packet, hbh bool) ([]byte, bool) {
	type tlv struct {
		typ  uint8
		data []byte
	}
	var opts []tlv
	if hbh {
		h, _ := p.Layer(layers.LayerTypeIPv6HopByHop).(*layers.IPv6HopByHop)
		if h == nil {
			return nil, false
		}
		for _, o := range h.Options {
			opts = append(opts, tlv{o.OptionType, o.OptionData})
		}
	} else {
		d, _ := p.Layer(layers.LayerTypeIPv6Destination).(*layers.IPv6Destination)
		if d == nil {
			return nil, false
		}
		for _, o := range d.Options {
			opts = append(opts, tlv{o.OptionType, o.OptionData})
		}
	}
	if len(opts) != 1 || opts[0].typ != 0x12 || len(opts[0].data) != 4 {
		return nil, false
	}
	return opts[0].data, true
}

// TestLabMarkAltMark: h1 marks its IPv6 TCP with the AltMark option in a Destination Options
// (or Hop-by-Hop) header; h2's Linux skips the option (type 0x12: its two high bits are 00) and
// the transfer completes; the capture on h2 shows every data packet with the option, the colors
// of their periods (alternating), one FlowMonID per flow, at most 2 delay marks per flow and
// period in the central half; a second marker on the device is refused; remove leaves no link,
// pin or record.
func TestLabMarkAltMark(t *testing.T) {
	t.Parallel()
	for _, header := range []string{headerDest, headerHBH} {
		t.Run(header, func(t *testing.T) {
			t.Parallel()
			labMarkAltMark(t, header)
		})
	}
}

func labMarkAltMark(t *testing.T, header string) {
	testenv.Need(t, "iperf3", "tcpdump")
	l := labtest.Up(t, hostHost)
	dev := labDev(t, l, "h1")
	c := markIn(t, l, "h1", dev, "carrier: ipv6-altmark\nperiod: 100ms\nflowmon_range: 1000-1999\ndouble: {packets: 2}\nheader: "+header+"\n")
	h2 := labtest.Addr(t, l, "h2", "6")
	// The inserted header takes 8 bytes: the route to h2 gets an MTU 8 bytes below the link's,
	// so TCP's full-size segments still fit (else the marker passes them unmarked: too_big).
	labtest.Run(t, l, "h1", "ip", "-6", "route", "replace", h2+"/128", "dev", dev, "mtu", "1492")
	off := taiOffset()
	var res labtest.IperfResult
	ps := labtest.Capture(t, l, "h2", []string{"-i", labDev(t, l, "h2"), "ip6 and src host " + labtest.Addr(t, l, "h1", "6")}, func() {
		res = labtest.Iperf(t, l, "h1", "h2", h2, "-t", "2", "-b", "50M")
	})
	if res.ReceivedBPS == 0 {
		t.Fatalf("iperf3 over marked IPv6: %+v", res)
	}
	type key struct {
		id     uint32
		period int64
	}
	var data, marked, sure, delayed int
	colors, flows := map[int]int{}, map[uint16]map[uint32]bool{}
	dPerPeriod := map[key]int{}
	changes, last := 0, -1
	for _, p := range ps {
		tcp, _ := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if tcp == nil {
			continue
		}
		data++
		opt, ok := altmarkData(p, header == headerHBH)
		if !ok {
			t.Logf("without the option: %v", p)
			continue
		}
		marked++
		w := binary.BigEndian.Uint32(opt)
		id, lflag, dflag := w>>12, int(w>>11&1), w>>10&1 == 1
		if flows[uint16(tcp.SrcPort)] == nil {
			flows[uint16(tcp.SrcPort)] = map[uint32]bool{}
		}
		flows[uint16(tcp.SrcPort)][id] = true
		colors[lflag]++
		if last >= 0 && lflag != last {
			changes++
		}
		last = lflag
		color, period, pos, ok := colorAt(p.Metadata().Timestamp, off, c, guard)
		if ok {
			sure++
			if color != lflag {
				t.Errorf("packet at %v (period %d + %v) has color %d, want %d", p.Metadata().Timestamp, period, pos, lflag, color)
			}
		}
		if dflag {
			delayed++
			dPerPeriod[key{id, period}]++
			if ok && (pos < 25*time.Millisecond-guard || pos > 75*time.Millisecond+guard) {
				t.Errorf("delay mark at %v into the period, outside its central half", pos)
			}
		}
	}
	t.Logf("%d TCP packets from h1, %d with the option (%d checked against the clock), colors %v, %d changes, %d delay marks, flows %v", data, marked, sure, colors, changes, delayed, flows)
	if data == 0 || marked != data {
		t.Errorf("%d of %d TCP packets from h1 carry the AltMark option", marked, data)
	}
	if colors[0] == 0 || colors[1] == 0 || changes < 4 || sure == 0 {
		t.Errorf("colors %v with %d changes over 2 s of 100 ms periods (%d checked)", colors, changes, sure)
	}
	if len(flows) < 2 { // iperf3's control and data connections
		t.Errorf("flows %v", flows)
	}
	ids := map[uint32]bool{}
	for port, fl := range flows {
		for id := range fl {
			if len(fl) != 1 || id < 1000 || id > 1999 || ids[id] {
				t.Errorf("flow from port %d: FlowMonIDs %v (one per flow, 1000-1999, not shared)", port, fl)
			}
			ids[id] = true
		}
	}
	if delayed == 0 {
		t.Error("no delay mark")
	}
	for k, n := range dPerPeriod {
		if n > 2 {
			t.Errorf("FlowMonID %d has %d delay marks in period %d, want at most 2", k.id, n, k.period)
		}
	}

	st := markStatusIn(t, l, "h1")
	if st.Counters["too_big"] != 0 || st.Counters["inserted"] == 0 || st.Counters["marked"] == 0 || st.Counters["color0"] == 0 || st.Counters["color1"] == 0 || st.Flows < 2 {
		t.Errorf("status %+v", st)
	}

	// remove leaves nothing behind.
	if err := nsrun.Do(l.Netns("h1"), func() error { return RemoveMark(dev) }); err != nil {
		t.Fatal(err)
	}
	err := nsrun.Do(l.Netns("h1"), func() error {
		ns, _ := attach.ThisNetns()
		if _, err := os.Stat(pin.Path(markPin(ns, dev)...)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("marker pins left behind: %v", err)
		}
		if _, err := os.Stat(runstate.Path(markSubsystem, markRecordName(ns, dev))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("marker record left behind: %v", err)
		}
		if err := RemoveMark(dev); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a second remove: %v, want ErrNotExist", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := tcxEgressPrograms(t, l, "h1", dev); n != 0 {
		t.Errorf("%d tcx egress programs left on %s", n, dev)
	}
}

// tcxEgressPrograms counts the programs attached at dev's tcx egress in node.
func tcxEgressPrograms(t *testing.T, l *lab.Lab, node, dev string) int {
	t.Helper()
	var n int
	err := nsrun.Do(l.Netns(node), func() error {
		idx, err := CheckMarkDevice(dev)
		if err != nil {
			return err
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: ebpf.AttachTCXEgress})
		if err != nil {
			return err
		}
		n = len(res.Programs)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLabMarkDSCP: h1 marks IPv4 TCP in DSCP bits 0 (color) and 1 (delay); the capture on h2
// shows both colors at the right times, the other DSCP bits and ECN as the sender set them,
// valid IPv4 header checksums, and the transfer completes.
func TestLabMarkDSCP(t *testing.T) {
	t.Parallel()
	testenv.Need(t, "iperf3", "tcpdump")
	l := labtest.Up(t, hostHost)
	dev := labDev(t, l, "h1")
	c := markIn(t, l, "h1", dev, "carrier: dscp\nperiod: 100ms\ndscp_bits: [0, 1]\n")
	off := taiOffset()
	var res labtest.IperfResult
	ps := labtest.Capture(t, l, "h2", []string{"-i", labDev(t, l, "h2"), "ip and src host " + labtest.Addr(t, l, "h1", "4")}, func() {
		res = labtest.Iperf(t, l, "h1", "h2", labtest.Addr(t, l, "h2", "4"), "-t", "2", "-b", "50M")
	})
	if res.ReceivedBPS == 0 {
		t.Fatalf("iperf3: %+v", res)
	}
	colors := map[int]int{}
	var n int
	for _, p := range ps {
		ip, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if ip == nil || p.Layer(layers.LayerTypeTCP) == nil {
			continue
		}
		n++
		if err, r := ip.VerifyChecksum(); err != nil || !r.Valid {
			t.Fatalf("IPv4 header checksum on the wire: %v %+v", err, r)
		}
		lflag := int(ip.TOS>>2) & 1
		colors[lflag]++
		if color, _, _, ok := colorAt(p.Metadata().Timestamp, off, c, guard); ok && color != lflag {
			t.Errorf("TOS %#x at %v: color %d, want %d", ip.TOS, p.Metadata().Timestamp, lflag, color)
		}
		if ip.TOS&^0x0c != 0 {
			t.Errorf("TOS %#x: only DSCP bits 0 and 1 may differ from the sender's 0", ip.TOS)
		}
	}
	if n == 0 || colors[0] == 0 || colors[1] == 0 {
		t.Errorf("%d TCP packets, colors %v", n, colors)
	}
}

// openProbeIn opens the probe on node's interface in direction dir (attached at the tail of
// the tcx chain).
func openProbeIn(t *testing.T, l *lab.Lab, node, dir string, c *MarkConfig) Datapath {
	t.Helper()
	s := ProbeSpec{Points: []Point{{Ifname: labDev(t, l, node), Direction: dir}}, PeriodNs: int64(c.Period),
		StartColor: c.StartColor, Carrier: c.Carrier, HashBits: 8, NMax: 1000}
	var dp Datapath
	if err := nsrun.Do(l.Netns(node), func() (err error) { dp, err = OpenProbe(s); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nsrun.Do(l.Netns(node), dp.Close) })
	return dp
}

// TestLabMarkerAndProbe: the probe counts exactly what the marker colored, per color: a probe
// on h1's egress attached before the marker (the marker goes to the head of the chain, so the
// probe still sees colored packets) and one on h2's ingress; UDP from h1 to h2 over IPv6 with
// the AltMark option.
func TestLabMarkerAndProbe(t *testing.T) {
	t.Parallel()
	testenv.Need(t, "iperf3")
	l := labtest.Up(t, hostHost)
	dev := labDev(t, l, "h1")
	cfg, err := ParseMarkConfig("lab.yaml", []byte("carrier: ipv6-altmark\nperiod: 200ms\nstart_color: 1\nflowmon_range: 50-59\n"))
	if err != nil {
		t.Fatal(err)
	}
	out := openProbeIn(t, l, "h1", "out", cfg)
	in := openProbeIn(t, l, "h2", "in", cfg)
	markIn(t, l, "h1", dev, "carrier: ipv6-altmark\nperiod: 200ms\nstart_color: 1\nflowmon_range: 50-59\n")
	res := labtest.Iperf(t, l, "h1", "h2", labtest.Addr(t, l, "h2", "6"), "-u", "-b", "4M", "-t", "1", "-l", "400")
	if res.Packets == 0 {
		t.Fatalf("iperf3 -u: %+v", res)
	}
	// Stop marking (keeping the counters map open, so that they are read after the last
	// packet), let the last period end and L/2 pass, then read both colors: with no read in
	// between, each color's counters hold every period of that color.
	var counters map[string]uint64
	err = nsrun.Do(l.Netns("h1"), func() error {
		ns, err := attach.ThisNetns()
		if err != nil {
			return err
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(pin.Path(markPin(ns, dev)...), "stats"), nil)
		if err != nil {
			return err
		}
		defer m.Close()
		if err := RemoveMark(dev); err != nil {
			return err
		}
		counters, err = markCounters(m)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Duration(cfg.Period))
	n := tai() / int64(cfg.Period)
	for _, p := range []struct {
		name string
		dp   Datapath
		ns   string
	}{{"h1 out", out, l.Netns("h1")}, {"h2 in", in, l.Netns("h2")}} {
		var got [2]int64
		ids := map[int64]bool{}
		for _, period := range []int64{n - 1, n - 2} {
			color := (period + int64(cfg.StartColor)) % 2
			var rows []Counter
			if err := nsrun.Do(p.ns, func() (err error) { rows, _, err = p.dp.Read(period); return err }); err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				got[color] += r.Packets
				if r.Packets > 0 {
					ids[r.FlowMonID] = true
				}
			}
		}
		// The marker counts skbs, the probe segments: UDP without GSO, one each.
		want := [2]int64{int64(counters["color0"]), int64(counters["color1"])}
		if got != want || want[0] == 0 || want[1] == 0 {
			t.Errorf("%s counted %v per color, the marker colored %v (counters %v)", p.name, got, want, counters)
		}
		for id := range ids {
			if id < 50 || id > 59 {
				t.Errorf("%s: FlowMonID %d outside the marker's range 50-59", p.name, id)
			}
		}
		t.Logf("%s: %v packets per color, FlowMonIDs %v", p.name, got, ids)
	}
}

// TestLabMarkCommand: the command itself in h1's namespace: mark, a second mark replacing the
// first in place, status --json, remove, a second remove refused with exit 2.
func TestLabMarkCommand(t *testing.T) {
	t.Parallel()
	l := labtest.Up(t, hostHost)
	dev := labDev(t, l, "h1")
	cfg := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(cfg, []byte("carrier: ipv6-altmark\nperiod: 1s\nflowmon_id: 12\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := nsrun.Do(l.Netns("h1"), func() error {
			s, err := runCLI(append([]string{"mark"}, args...)...)
			out.WriteString(s)
			return err
		})
		return out.String(), err
	}
	t.Cleanup(func() { _, _ = run("remove", "--dev", dev) })
	if out, err := run("apply", "--dev", dev, "--config", cfg); err != nil || !strings.HasPrefix(out, "altmark mark: applied on "+dev+" egress") || !strings.Contains(out, "FlowMonID 12") || strings.Count(out, "\n") != 1 {
		t.Fatalf("mark: %v %q", err, out)
	}
	if out, err := run("apply", "--dev", dev, "--config", cfg); err != nil || !strings.HasPrefix(out, "altmark mark: replaced on "+dev+" egress") {
		t.Errorf("second mark: %v %q, want it replaced", err, out)
	}
	if n := tcxEgressPrograms(t, l, "h1", dev); n != 1 {
		t.Errorf("%d tcx egress programs after the second mark, want 1", n)
	}
	labtest.Run(t, l, "h1", "ping", "-6", "-c", "2", "-i", "0.2", labtest.Addr(t, l, "h2", "6"))
	out, err := run("status", "--json")
	var st []MarkStatus
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || len(st) != 1 || st[0].Dev != dev ||
		st[0].Config.Carrier != carrierIPv6AltMrk || st[0].Config.PeriodMs != 1000 || st[0].Counters["inserted"] < 2 {
		t.Errorf("status --json: %v %s", err, out)
	}
	if out, err := run("status"); err != nil || !strings.Contains(out, dev+": ipv6-altmark") {
		t.Errorf("status: %v %q", err, out)
	}
	if out, err := run("remove", "--dev", dev); err != nil || out != "altmark mark: removed from "+dev+"\n" {
		t.Errorf("remove: %v %q", err, out)
	}
	if _, err := run("remove", "--dev", dev); cli.ExitCode(err) != 2 {
		t.Errorf("second remove: %v, want exit 2", err)
	}
	if n := tcxEgressPrograms(t, l, "h1", dev); n != 0 {
		t.Errorf("%d tcx egress programs left", n)
	}
}
