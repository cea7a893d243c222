package lab_test

import (
	"strings"
	"testing"

	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
)

// ShapedEgress follows each end's own rate: an endpoint's without the link's, the link's or the
// endpoint's, none on an end without either, none on an xdp node's end (shaped where it arrives).
func TestShapedEgress(t *testing.T) {
	top, err := lab.Parse("shaped.yaml", []byte(`
nodes: {h1: {}, r1: {kind: router}, h2: {}, x: {kind: router, xdp: true}}
links:
  - endpoints: [h1, {node: r1, rate: 8mbit}]
  - endpoints: [r1, {node: h2, rate: 8mbit}]
    rate: 40mbit
  - endpoints: [r1, x]
    rate: 40mbit
`), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		node  string
		iface int
		want  bool
	}{{"h1", 0, false}, {"r1", 0, true}, {"r1", 1, true}, {"h2", 0, true}, {"r1", 2, true}, {"x", 0, false}} {
		if got := lab.ShapedEgress(top.Node(c.node).Ifaces[c.iface]); got != c.want {
			t.Errorf("%s eth%d: ShapedEgress %v, want %v", c.node, c.iface, got, c.want)
		}
	}
}

// An endpoint's rate and loss replace the link's for what that end sends: each end's HTB has its
// direction's rate, the slow direction's goodput stays under its rate, and each end's loss
// program drops with its direction's probability (h2's none, as its `loss: 0` says).
func TestAsymmetricRateAndLoss(t *testing.T) {
	t.Parallel()
	l := labtest.Up(t, `
nodes: {h1: {}, h2: {}}
links:
  - endpoints: [h1, {node: h2, rate: 8mbit, loss: 0}]
    rate: 40mbit
    loss: 5%
`)
	h1, h2 := l.Topology.Node("h1").Ifaces[0], l.Topology.Node("h2").Ifaces[0]
	for _, c := range []struct{ node, dev, rate string }{{"h1", l.IfName(h1), "rate 40Mbit"}, {"h2", l.IfName(h2), "rate 8Mbit"}} {
		if out := labtest.Run(t, l, c.node, "tc", "class", "show", "dev", c.dev); !strings.Contains(out, c.rate+" ") {
			t.Errorf("%s's HTB class: want %s:\n%s", c.node, c.rate, out)
		}
	}
	r := labtest.Iperf(t, l, "h2", "h1", labtest.Addr(t, l, "h1", "4"), "-t", "2", "-O", "1")
	t.Logf("h2 → h1 goodput %.2f Mbit/s (rate 8mbit)", r.ReceivedBPS/1e6)
	if r.ReceivedBPS > 8e6*1.1 || r.ReceivedBPS <= 0 {
		t.Errorf("h2 → h1 goodput %.2f Mbit/s: want above 0 and at most 8 Mbit/s (+10%%)", r.ReceivedBPS/1e6)
	}
	const packets = 5000
	send := udpFlow(t, l)
	for i := range packets {
		if err := send(); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	labtest.Run(t, l, "h2", "ping", "-c", "50", "-i", "0.01", "-W", "1", labtest.Addr(t, l, "h1", "4"))
	c1, ok1, err1 := l.ReadLoss(h1)
	c2, ok2, err2 := l.ReadLoss(h2)
	if !ok1 || !ok2 || err1 != nil || err2 != nil {
		t.Fatalf("loss counters: h1 %v %v, h2 %v %v", ok1, err1, ok2, err2)
	}
	got := 100 * float64(c1.Dropped) / float64(c1.Passed+c1.Dropped)
	t.Logf("h1's loss program: %d of %d dropped (%.2f%%, configured 5%%); h2's: %d of %d", c1.Dropped, c1.Passed+c1.Dropped, got, c2.Dropped, c2.Passed+c2.Dropped)
	// 5 standard deviations of the binomial over 5,000 packets: ±1.5 points.
	if c1.Passed+c1.Dropped < packets || got < 3.5 || got > 6.5 {
		t.Errorf("h1 → h2 loss %.2f%% over %d packets, want 5%% ± 1.5", got, c1.Passed+c1.Dropped)
	}
	if c2.Dropped != 0 || c2.Passed < 50 {
		t.Errorf("h2 → h1: %d of %d dropped, want none of at least 50", c2.Dropped, c2.Passed+c2.Dropped)
	}
}
