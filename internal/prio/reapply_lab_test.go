package prio

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// TestLabRouterReappliedAndRemovedUnderTraffic: four TCP streams from h1 fill r1's bottleneck
// (20 Mbit/s, so its leaves hold a queue) while `prio router apply` is run again six times,
// with other rates and queue limits each time. Every class's packets and bytes and the
// classifier's packets only grow; the transfer completes; once it has, the queues are empty and,
// since the first apply, the classifier saw exactly the packets the classes sent or dropped, as
// `tc -s class` shows them too. Then the router is removed while a second transfer keeps its
// queues full: the transfer completes, and no flowplane qdisc, program or queued packet is left
// on the device.
// h1 sends without TSO and GSO, so the classifier and the classes count the same packets.
func TestLabRouterReappliedAndRemovedUnderTraffic(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "iperf3", "tc", "ethtool")
	l := labtest.Up(t, labtest.HostRouterHost)
	dev, h2 := device(t, l, "r1", "eth1"), labtest.Addr(t, l, "h2", "4")
	labtest.Run(t, l, "h1", "ethtool", "-K", device(t, l, "h1", "eth0"), "tso", "off", "gso", "off")
	apply := func(rate uint64, limit int) {
		t.Helper()
		p, err := ParseRouterPolicy("test", fmt.Appendf(nil, "scheme: fair\nleaves: 4\nlimit: %d\n", limit))
		if err != nil {
			t.Fatal(err)
		}
		if err := nsrun.Do(l.Netns("r1"), func() error { return Router(dev, rate, p) }); err != nil {
			t.Fatal(err)
		}
	}
	remove := func() error { return nsrun.Do(l.Netns("r1"), func() error { return RemoveRouter(dev) }) }
	apply(20e6, 100)
	t.Cleanup(func() { _ = remove() })
	// The classifier is attached before the HTB tree is built: what r1 sent in between (its own
	// neighbour and MLD packets) was classified and counted by no class. That offset, read
	// before the transfer, must not change. (r1's own packets may pass between the two reads
	// of a status: read until two agree.)
	offset := func() (int64, RouterStatus) {
		t.Helper()
		for try := 0; ; try++ {
			rs := statusIn(t, l).Routers[0]
			if n := unclassed(rs); n == unclassed(statusIn(t, l).Routers[0]) || try == 50 {
				return n, rs
			}
		}
	}
	before, _ := offset()

	done := iperfBackground(t, l, h2, "-t", "5", "-P", "4")
	prev := statusIn(t, l).Routers[0]
	queued := uint32(0)
	for i := range 6 {
		time.Sleep(500 * time.Millisecond)
		apply([]uint64{30e6, 20e6}[i%2], []int{200, 100}[i%2])
		rs := statusIn(t, l).Routers[0]
		if rs.Counters["packets"] < prev.Counters["packets"] {
			t.Errorf("re-apply %d: the classifier's packets went from %d to %d", i, prev.Counters["packets"], rs.Counters["packets"])
		}
		if len(rs.Classes) != len(prev.Classes) {
			t.Fatalf("re-apply %d: %d classes, were %d", i, len(rs.Classes), len(prev.Classes))
		}
		for j, c := range rs.Classes {
			p := prev.Classes[j]
			if c.Class != p.Class || c.Packets < p.Packets || c.Bytes < p.Bytes || c.Drops < p.Drops {
				t.Errorf("re-apply %d: class %s went from %+v to %+v", i, c.Class, p, c)
			}
			queued = max(queued, c.Backlog)
		}
		prev = rs
	}
	if err := <-done; err != nil {
		t.Fatalf("the transfer through the re-applied router: %v", err)
	}
	if queued == 0 {
		t.Error("no class held a queue at any re-apply: the bottleneck was not loaded")
	}
	// Quiet: the queues drain, and every packet the classifier saw since was sent or dropped by
	// a class.
	var rs RouterStatus
	for try := 0; ; try++ {
		var off int64
		off, rs = offset()
		backlog := uint32(0)
		for _, c := range rs.Classes {
			backlog += c.Backlog
		}
		if backlog == 0 && off == before {
			break
		}
		if try == 50 {
			t.Fatalf("after the transfer: %d packets queued; the classifier saw %d packets more than the classes sent, dropped or queued, %d before the transfer", backlog, off, before)
		}
		time.Sleep(100 * time.Millisecond)
	}
	tc := tcClassPackets(t, l, dev)
	for _, c := range rs.Classes {
		if got, ok := tc[c.Class]; !ok || got != c.Packets {
			t.Errorf("class %s: status says %d packets, tc -s class %d (listed: %v)", c.Class, c.Packets, got, ok)
		}
	}
	var sent, drops uint64
	for _, c := range rs.Classes {
		sent += uint64(c.Packets)
		drops += uint64(c.Drops)
	}
	t.Logf("6 re-applies under 4 streams: up to %d packets queued in a leaf; %d packets classified, %d sent and %d dropped by the classes, %d classified before the tree was built", queued, rs.Counters["packets"], sent, drops, before)

	// Removed with full queues: what was queued goes with the qdisc, TCP sends it again.
	done = iperfBackground(t, l, h2, "-t", "3", "-P", "4")
	time.Sleep(time.Second)
	if err := remove(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the transfer through the router removed under it: %v", err)
	}
	qd := labtest.Run(t, l, "r1", "tc", "-s", "qdisc", "show", "dev", dev)
	if strings.Contains(qd, "htb") || !regexp.MustCompile(`backlog 0b 0p`).MatchString(qd) {
		t.Errorf("after remove, %s's qdiscs:\n%s", dev, qd)
	}
	if err := nsrun.Do(l.Netns("r1"), func() error {
		d, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		r, err := link.QueryPrograms(link.QueryOptions{Target: d.Attrs().Index, Attach: ebpf.AttachTCXEgress})
		if err == nil && len(r.Programs) != 0 {
			t.Errorf("after remove, %d programs on %s's tcx egress", len(r.Programs), dev)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// iperfBackground runs iperf3 from h1 to addr with args; its error (nil: the transfer
// completed) comes on the channel.
func iperfBackground(t *testing.T, l *lab.Lab, addr string, args ...string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	go func() {
		res, err := l.Iperf(ctx, "h1", "h2", addr, args...)
		if err == nil && res.ReceivedBPS == 0 {
			err = fmt.Errorf("nothing received: %+v", res)
		}
		done <- err
	}()
	return done
}

var tcClassRE = regexp.MustCompile(`(?m)^class htb (\S+) .*\n\s*Sent \d+ bytes (\d+) pkt`)

// tcClassPackets is `tc -s class show dev` on r1: packets sent per class.
func tcClassPackets(t *testing.T, l *lab.Lab, dev string) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	for _, m := range tcClassRE.FindAllStringSubmatch(labtest.Run(t, l, "r1", "tc", "-s", "class", "show", "dev", dev), -1) {
		n, _ := strconv.ParseUint(m[2], 10, 32)
		out[m[1]] = uint32(n)
	}
	return out
}

// unclassed is how many packets the classifier counted that no class sent, dropped or holds.
func unclassed(rs RouterStatus) int64 {
	n := int64(rs.Counters["packets"])
	for _, c := range rs.Classes {
		n -= int64(c.Packets) + int64(c.Drops) + int64(c.Backlog)
	}
	return n
}
