package altmark

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
	"github.com/flowplane/flowplane/internal/topo"
)

// analyticsLab is analytics/tests/data/lab6.yaml (six routers, six hosts, the topology the
// analytics' own tests cluster) with the loss moved from the host link r6–h6, where no probe
// sees it, to three router links in three different wire clusters (both directions each).
const analyticsLab = `
nodes:
  h1: {}
  h2: {}
  h3: {}
  h4: {}
  h5: {}
  h6: {}
  r1: {kind: router}
  r2: {kind: router}
  r3: {kind: router}
  r4: {kind: router}
  r5: {kind: router}
  r6: {kind: router}
links:
  - endpoints: [h1, r1]
  - endpoints: [h2, r1]
  - endpoints: [h3, r2]
  - endpoints: [r1, r3]
    loss: 4%
  - endpoints: [r2, r3]
  - endpoints: [r2, r4]
    loss: 4%
  - endpoints: [r3, r4]
  - endpoints: [r3, r5]
  - endpoints: [r4, r6]
    loss: 4%
  - endpoints: [r5, h4]
  - endpoints: [r6, h5]
  - endpoints: [r6, h6]
`

// analyticsFlows are the host pairs that send; together they cross every lossy link in both
// directions (r1–r3: h1↔h4 and h2↔h6; r2–r4: h3↔h5; r4–r6: h3↔h5 and h2↔h6).
var analyticsFlows = [][2]string{{"h1", "h4"}, {"h4", "h1"}, {"h3", "h5"}, {"h5", "h3"}, {"h2", "h6"}, {"h6", "h2"}}

// analyticsScriptPath is the analytics' console script in this checkout (make setup).
func analyticsScriptPath(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", "analytics", ".venv", "bin", analyticsScript))
	if err != nil {
		t.Fatal(err)
	}
	if !isExecutable(p) {
		t.Fatalf("%s is missing: run `make setup` in the checkout (it creates analytics/.venv)", p)
	}
	return p
}

// wire is one direction of a link between two routers: from's egress to the peer's ingress.
type wire struct{ from *topo.Iface }

func (w wire) in() string  { p := w.from.Peer(); return p.Node.Name + ":" + p.Name + ":in" }
func (w wire) out() string { return w.from.Node.Name + ":" + w.from.Name + ":out" }

// TestLabAnalyticsLossPerCluster: probes (the Go period loop with the kernel probe) on every
// interface of the six routers, both directions, one dataset; UDP between six host pairs,
// colored by the senders (DSCP) per period; the lab's loss program on three router links. The
// analytics' loss per RFC 9342 cluster and period equals, exactly, what was dropped inside the
// cluster in that period: the loss programs' drops on the wire (plus the veth's own drops,
// counted the same way), 0 in every router cluster; end to end equals the total.
func TestLabAnalyticsLossPerCluster(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	script := analyticsScriptPath(t)
	l := labtest.Up(t, analyticsLab)

	var routers []*topo.Node
	var wires []wire
	for _, n := range l.Topology.Nodes {
		if n.Kind != topo.Router {
			continue
		}
		routers = append(routers, n)
		for _, i := range n.Ifaces {
			if i.Peer().Node.Kind == topo.Router {
				wires = append(wires, wire{i})
			}
		}
	}
	quietLab(t, l, routers)
	listenUDP(t, l)

	// The probes: one period loop per router, all interfaces both ways, one data directory.
	const periods, common = 16, 5
	L := int64(labPeriod)
	data := t.TempDir()
	runners := make([]*Runner, len(routers))
	var starting sync.WaitGroup
	for k, n := range routers {
		starting.Add(1)
		go func() {
			defer starting.Done()
			var ifs []string
			for _, i := range n.Ifaces {
				ifs = append(ifs, fmt.Sprintf("{name: %s, direction: both}", l.IfName(i)))
			}
			cfg, err := ParseConfig("lab.yaml", []byte(fmt.Sprintf(
				"probe_id: %s\ninterfaces: [%s]\nperiod: %s\nperiods: %d\ncarrier: dscp\nprotocols: [udp]\nhash_bits: 4\ndata_dir: %s\n",
				n.Name, strings.Join(ifs, ", "), labPeriod, periods, data)))
			if err != nil {
				t.Error(err)
				return
			}
			r := NewRunner(cfg, OpenProbe)
			r.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
			if err := nsrun.Do(l.Netns(n.Name), r.Start); err != nil {
				t.Errorf("start the probe on %s: %v", n.Name, err)
				return
			}
			t.Cleanup(func() { _ = r.Stop() })
			runners[k] = r
		}()
	}

	// Traffic, and the drops of every wire read in the quiet gap around every period boundary.
	// On any exit the senders and the reader stop before the lab goes down.
	quiet := 40 * time.Millisecond
	drops := newDropReader(t, l, routers, wires)
	stop := make(chan struct{})
	sampler := make(chan struct{})
	var senders sync.WaitGroup
	stopTraffic := sync.OnceFunc(func() {
		close(stop)
		senders.Wait()
		<-sampler
	})
	t.Cleanup(stopTraffic)
	type reading struct {
		drops      map[wire]uint64
		ok         bool          // read within the quiet gap
		start, end time.Duration // relative to the boundary
	}
	readings := map[int64]reading{} // n -> drops before period n
	go func() {
		defer close(sampler)
		for n := tai()/L + 1; ; n++ {
			// Period n-1's last datagrams left quiet before n*L, n's first leave quiet after.
			(taiClock{}).Until(n*L-int64(quiet)*3/4, nil)
			select {
			case <-stop:
				return
			default:
			}
			start := tai()
			d := drops.read(t)
			end := tai()
			readings[n] = reading{d, start > n*L-int64(quiet)+int64(5*time.Millisecond) && end < n*L+int64(quiet),
				time.Duration(start - n*L), time.Duration(end - n*L)}
		}
	}()
	for _, f := range analyticsFlows {
		sendFlow(t, l, f[0], f[1], quiet, stop, &senders)
	}
	starting.Wait()
	if slices.Contains(runners, nil) {
		t.FailNow()
	}
	for _, r := range runners {
		r.Wait()
	}
	stopTraffic()

	// The analytics: the clusters of the lab topology (named as the lab is, so the kernel
	// interface names resolve), and the loss per period and cluster.
	topoFile := filepath.Join(t.TempDir(), "lab.yaml")
	if err := os.WriteFile(topoFile, []byte("name: "+l.Name()+"\n"+analyticsLab), 0o644); err != nil {
		t.Fatal(err)
	}
	var clusters []amCluster
	runAnalyticsJSON(t, script, &clusters, "clusters", "--topology", topoFile, "--format", "json")
	var rows []struct {
		Period  int64
		Cluster string
		In      jsonInt `json:"in_packets"`
		Loss    jsonInt
		Missing int64
		Alarm   string
	}
	runAnalyticsJSON(t, script, &rows, "loss", "--data", data, "--topology", topoFile, "--format", "json")

	// Each cluster's expected loss: a wire's cluster has that wire's drops, a router's none.
	wireOf := map[string]wire{} // cluster -> wire
	nRouter := 0
	for _, c := range clusters {
		if c.Cluster == "e2e" {
			continue
		}
		var found bool
		for _, w := range wires {
			if c.Inputs == w.out() && c.Outputs == w.in() {
				wireOf[c.Cluster], found = w, true
			}
		}
		if !found {
			if !strings.HasPrefix(c.Label, "node r") {
				t.Errorf("cluster %s (%s: %s -> %s) is neither a wire direction nor a router", c.Cluster, c.Label, c.Inputs, c.Outputs)
			}
			nRouter++
		}
	}
	if len(wireOf) != len(wires) {
		t.Fatalf("%d clusters are wire directions, the lab has %d: %+v", len(wireOf), len(wires), clusters)
	}

	byPeriod := map[int64][]int{}
	for i, r := range rows {
		byPeriod[r.Period] = append(byPeriod[r.Period], i)
	}
	var checked []int64
	var lossy []wire
	for _, w := range wires {
		if w.from.Link.Loss > 0 {
			lossy = append(lossy, w)
		}
	}
	totals := map[wire]int64{}
	shifted := map[wire]int64{} // analytics minus wire drops, summed over the checked periods
	var table strings.Builder
	fmt.Fprintf(&table, "%-8s", "period")
	for _, w := range lossy {
		fmt.Fprintf(&table, " %15s", w.from.Node.Name+"→"+w.from.Peer().Node.Name)
	}
	fmt.Fprintf(&table, " %9s %9s %7s %7s\n", "others", "routers", "e2e", "e2e in")
	for _, n := range slices.Sorted(maps.Keys(byPeriod)) {
		complete := true
		for _, i := range byPeriod[n] {
			if rows[i].Missing > 0 {
				complete = false
			}
		}
		if !complete {
			continue // not recorded by every probe (before the last one started, after the first one ended)
		}
		r0, ok0 := readings[n]
		r1, ok1 := readings[n+1]
		if !ok0 || !ok1 || !r0.ok || !r1.ok {
			t.Logf("period %d: the drop counters were not read in the quiet gaps around it (%v to %v and %v to %v from its boundaries); not checked",
				n, r0.start, r0.end, r1.start, r1.end)
			continue
		}
		checked = append(checked, n)
		if len(byPeriod[n]) != len(clusters) {
			t.Errorf("period %d: %d rows from loss, want one per cluster and e2e (%d)", n, len(byPeriod[n]), len(clusters))
		}
		drops := func(w wire) int64 { return int64(r1.drops[w] - r0.drops[w]) }
		var total, others, routerLoss, e2e, e2eIn, e2eDiff, wireDiff int64
		got := map[wire]int64{}
		for _, w := range wires {
			total += drops(w)
		}
		for _, i := range byPeriod[n] {
			r := rows[i]
			if r.Loss.null {
				t.Errorf("period %d cluster %s: loss NULL (%s)", n, r.Cluster, r.Alarm)
				continue
			}
			switch w, isWire := wireOf[r.Cluster]; {
			case r.Cluster == "e2e":
				e2e, e2eIn = r.Loss.v, r.In.v
				e2eDiff = r.Loss.v - total
			case isWire:
				got[w] = r.Loss.v
				if w.from.Link.Loss == 0 {
					others += r.Loss.v
				}
				// The drop counters are read in a quiet gap near each boundary; a packet
				// dropped in that gap counts in the neighbouring period: a difference of 1
				// that the next period gives back (checked after the loop).
				if d := r.Loss.v - drops(w); d != 0 {
					shifted[w] += d
					wireDiff += abs(d)
					if abs(d) > 1 || abs(shifted[w]) > 1 {
						t.Errorf("period %d cluster %s (%s → %s): loss %d, dropped on the wire %d", n, r.Cluster, w.out(), w.in(), r.Loss.v, drops(w))
					}
				}
			default:
				routerLoss += r.Loss.v
				if r.Loss.v != 0 {
					t.Errorf("period %d cluster %s (a router): loss %d, want 0", n, r.Cluster, r.Loss.v)
				}
			}
		}
		if abs(e2eDiff) > wireDiff {
			t.Errorf("period %d: end-to-end loss %d, the wires dropped %d", n, e2e, total)
		}
		fmt.Fprintf(&table, "%-8d", n)
		for _, w := range lossy {
			fmt.Fprintf(&table, " %15s", fmt.Sprintf("%d/%d", got[w], drops(w)))
			totals[w] += drops(w)
		}
		fmt.Fprintf(&table, " %9d %9d %7d %7d\n", others, routerLoss, e2e, e2eIn)
		if e2eIn < 100 {
			t.Errorf("period %d: only %d packets entered the network", n, e2eIn)
		}
	}
	t.Logf("loss per period, analytics/dropped (lossy wires), the other %d wire clusters and %d router clusters (analytics), end to end and packets in:\n%s",
		len(wires)-len(lossy), nRouter, table.String())
	if len(checked) < common {
		t.Fatalf("only %d periods recorded by all %d probes and checked (%v): want %d", len(checked), len(routers), checked, common)
	}
	for w, d := range shifted {
		if abs(d) > 1 {
			t.Errorf("%s → %s: the analytics' loss over the checked periods differs from the wire's drops by %d", w.out(), w.in(), d)
		}
	}
	for _, w := range lossy {
		if totals[w] == 0 {
			t.Errorf("%s → %s: the loss program dropped nothing in %d periods", w.out(), w.in(), len(checked))
		}
	}
	t.Logf("checked %d periods × %d clusters (+ e2e)", len(checked), len(clusters)-1)
	checkDelay(t, l, routers, data, topoFile, script, clusters, checked)
}

// amCluster is a row of the analytics' clusters command.
type amCluster struct{ Cluster, Label, Inputs, Outputs string }

// pointRecord is what one measurement point recorded in one period.
type pointRecord struct {
	packets, meanTAI int64
	bits             int32
	ref              int64
	samples          []Sample
}

// delayTolerance bounds |sampled mean - all-packets mean| per cluster over the whole run: the
// sampled mean (1/16 of the packets, by hash) estimates the all-packets mean; on this shared
// machine a hop's delay is tens of microseconds with a tail of scheduling stalls.
const delayTolerance = 100 * time.Microsecond

// checkDelay compares the analytics' delay per cluster and period with two computations in
// Go from the same records: (1) the same matching redone from the samples (valid at the
// cluster's largest hash length, hashes unique per side, same 5-tuple): matched, min and max
// equal, mean within 1 ns; (2) an independent measure from the counters, not the samples: in a
// period where the cluster lost nothing every packet crossed it, so
// (Σ_out packets·mean_tai − Σ_in packets·mean_tai) / packets is the exact mean delay of all
// its packets. Pooled over the periods, the sampled mean must be within delayTolerance of it.
func checkDelay(t *testing.T, l *lab.Lab, routers []*topo.Node, data, topoFile, script string, clusters []amCluster, checked []int64) {
	t.Helper()
	var rows []struct {
		Period   int64
		Cluster  string
		Matched  jsonInt
		MeanNs   jsonFloat `json:"mean_ns"`
		MinNs    jsonInt   `json:"min_ns"`
		MaxNs    jsonInt   `json:"max_ns"`
		Collided jsonInt   `json:"collisions"`
	}
	runAnalyticsJSON(t, script, &rows, "delay", "--data", data, "--topology", topoFile, "--format", "json")
	type key struct {
		period  int64
		cluster string
	}
	got := map[key]int{}
	for i, r := range rows {
		got[key{r.Period, r.Cluster}] = i
	}
	local := map[string]string{} // kernel name -> eth0, …
	for _, n := range routers {
		for _, i := range n.Ifaces {
			local[l.IfName(i)] = i.Name
		}
	}
	type pool struct {
		matched           int64
		sampledSum        float64 // Σ mean·matched
		packets, allSum   int64   // over the periods without loss: packets, Σ delays
		periods, lossless int
	}
	pools := map[string]*pool{}
	for _, n := range checked {
		recs := map[string]*pointRecord{} // probe:eth:dir
		for _, r := range routers {
			p, err := (Store{Dir: data, Probe: r.Name}).Read(n)
			if err != nil {
				t.Fatal(err)
			}
			at := func(ifname, dir string) *pointRecord {
				id := r.Name + ":" + local[ifname] + ":" + dir
				if recs[id] == nil {
					recs[id] = &pointRecord{}
				}
				return recs[id]
			}
			for _, c := range p.Counters {
				pr := at(c.Ifname, c.Direction)
				if c.Packets > 0 {
					pr.meanTAI = (pr.meanTAI*pr.packets + (c.MeanTAINs-n*int64(labPeriod))*c.Packets) / (pr.packets + c.Packets)
				}
				pr.packets += c.Packets
				pr.bits = max(pr.bits, c.HashBits)
				pr.ref = c.HashRef
			}
			for _, s := range p.Samples {
				pr := at(s.Ifname, s.Direction)
				pr.samples = append(pr.samples, s)
			}
		}
		for _, c := range clusters {
			ins, outs := strings.Fields(c.Inputs), strings.Fields(c.Outputs)
			// (1) the matching, redone.
			var bits int32
			for _, pt := range append(slices.Clone(ins), outs...) {
				bits = max(bits, recs[pt].bits)
			}
			mask := int64(1)<<bits - 1
			side := func(pts []string) map[int64]Sample {
				m, dup := map[int64]Sample{}, map[int64]bool{}
				for _, pt := range pts {
					for _, s := range recs[pt].samples {
						if s.Hash&mask != recs[pt].ref&mask {
							continue
						}
						if _, ok := m[s.Hash]; ok {
							dup[s.Hash] = true
						}
						m[s.Hash] = s
					}
				}
				for h := range dup {
					delete(m, h)
				}
				return m
			}
			in, out := side(ins), side(outs)
			var matched, collisions, sum int64
			minD, maxD := int64(1)<<62, int64(-1)<<62
			for h, a := range in {
				b, ok := out[h]
				if !ok {
					continue
				}
				if a.SrcAddr != b.SrcAddr || a.DstAddr != b.DstAddr || a.Proto != b.Proto || a.SrcPort != b.SrcPort || a.DstPort != b.DstPort {
					collisions++
					continue
				}
				d := b.TAINs - a.TAINs
				matched++
				sum += d
				minD, maxD = min(minD, d), max(maxD, d)
			}
			i, ok := got[key{n, c.Cluster}]
			if !ok {
				if matched > 0 {
					t.Errorf("period %d cluster %s: no delay row from the analytics, %d matched samples in Go", n, c.Cluster, matched)
				}
				continue
			}
			r := rows[i]
			if r.Matched.v != matched || r.Collided.v != collisions {
				t.Errorf("period %d cluster %s: analytics matched %d (%d collisions), Go %d (%d)", n, c.Cluster, r.Matched.v, r.Collided.v, matched, collisions)
				continue
			}
			if matched == 0 {
				continue
			}
			mean := float64(sum) / float64(matched)
			if r.MinNs.v != minD || r.MaxNs.v != maxD || math.Abs(r.MeanNs.v-mean) > 1 {
				t.Errorf("period %d cluster %s: analytics mean/min/max %.1f/%d/%d ns, Go %.1f/%d/%d", n, c.Cluster, r.MeanNs.v, r.MinNs.v, r.MaxNs.v, mean, minD, maxD)
			}
			if minD < 0 {
				t.Errorf("period %d cluster %s: a negative delay (%d ns) on one clock", n, c.Cluster, minD)
			}
			p := pools[c.Cluster]
			if p == nil {
				p = &pool{}
				pools[c.Cluster] = p
			}
			p.periods++
			p.matched += matched
			p.sampledSum += r.MeanNs.v * float64(matched)
			// (2) all packets, from the counters, when the cluster lost none.
			var pin, pout, tin, tout int64
			for _, pt := range ins {
				pin += recs[pt].packets
				tin += recs[pt].packets * recs[pt].meanTAI
			}
			for _, pt := range outs {
				pout += recs[pt].packets
				tout += recs[pt].packets * recs[pt].meanTAI
			}
			if pin == pout && pin > 0 {
				p.lossless++
				p.packets += pin
				p.allSum += tout - tin
			}
		}
	}
	var table strings.Builder
	fmt.Fprintf(&table, "%-8s %-32s %8s %8s %12s %12s %10s\n", "cluster", "", "periods", "matched", "sampled µs", "all pkts µs", "packets")
	compared := 0
	for _, c := range clusters {
		p := pools[c.Cluster]
		if p == nil || p.matched == 0 {
			continue
		}
		sampled := p.sampledSum / float64(p.matched) / 1e3
		all := "-"
		if p.packets > 0 {
			a := float64(p.allSum) / float64(p.packets) / 1e3
			all = fmt.Sprintf("%.1f", a)
			// Only where the same periods feed both: every period with samples lost nothing.
			if p.lossless == p.periods && p.matched >= 20 {
				compared++
				if math.Abs(sampled-a)*1e3 > float64(delayTolerance) {
					t.Errorf("cluster %s (%s): sampled mean delay %.1f µs over %d samples, all packets %.1f µs: more than %v apart",
						c.Cluster, c.Label, sampled, p.matched, a, delayTolerance)
				}
			}
		}
		label := c.Label
		if len(label) > 32 {
			label = label[:32]
		}
		fmt.Fprintf(&table, "%-8s %-32s %8d %8d %12.1f %12s %10d\n", c.Cluster, label, p.periods, p.matched, sampled, all, p.packets)
	}
	t.Logf("mean delay per cluster over the checked periods: the analytics' (sampled, equal to Go's matching) and all packets' from the counters (lossless periods):\n%s", table.String())
	if compared == 0 {
		t.Errorf("no cluster had enough samples to compare its sampled mean delay with all packets'")
	}
}

// jsonFloat is a float column of the analytics' JSON output (null, a number or a string).
type jsonFloat struct {
	v    float64
	null bool
}

func (j *jsonFloat) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		j.null = true
		return nil
	}
	v, err := strconv.ParseFloat(strings.Trim(string(b), `"`), 64)
	j.v = v
	return err
}

// quietLab makes the links between routers carry only the test's UDP: IPv6 off on the routers
// (no MLD or ND), and permanent IPv4 neighbour entries for every router peer (no ARP). The
// loss program drops whatever crosses, the probes count UDP only, so anything else on a lossy
// wire would make them disagree.
func quietLab(t *testing.T, l *lab.Lab, routers []*topo.Node) {
	t.Helper()
	for _, n := range routers {
		labtest.Run(t, l, n.Name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	}
	for _, n := range routers {
		for _, i := range n.Ifaces {
			p := i.Peer()
			if p.Node.Kind != topo.Router {
				continue
			}
			var mac net.HardwareAddr
			if err := nsrun.Do(l.Netns(p.Node.Name), func() error {
				dev, err := netlink.LinkByName(l.IfName(p))
				if err == nil {
					mac = dev.Attrs().HardwareAddr
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			labtest.Run(t, l, n.Name, "ip", "neigh", "replace", p.IPv4.Addr().String(), "lladdr", mac.String(), "dev", l.IfName(i), "nud", "permanent")
		}
	}
}

// listenUDP opens the discard port on every host, so the flows raise no ICMP port unreachable
// (which would cross the lossy wires and be dropped there, uncounted by the UDP-only probes).
func listenUDP(t *testing.T, l *lab.Lab) {
	t.Helper()
	for _, n := range l.Topology.Nodes {
		if n.Kind == topo.Router {
			continue
		}
		var c net.PacketConn
		if err := nsrun.Do(l.Netns(n.Name), func() (err error) {
			c, err = net.ListenPacket("udp4", ":9")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		go func() {
			buf := make([]byte, 2048)
			for {
				if _, _, err := c.ReadFrom(buf); err != nil {
					return
				}
			}
		}()
		t.Cleanup(func() { c.Close() })
	}
}

// dropReader reads what every wire has dropped so far between its egress probe and its
// ingress probe: the loss program on the egress (when the link is lossy), the egress veth's
// tx_dropped and the ingress veth's rx_dropped. One netlink handle per router namespace, one
// link dump per router, so a reading fits in the quiet gap at a period boundary.
type dropReader struct {
	l       *lab.Lab
	wires   []wire
	handles map[string]*netlink.Handle
}

func newDropReader(t *testing.T, l *lab.Lab, routers []*topo.Node, wires []wire) *dropReader {
	t.Helper()
	d := &dropReader{l: l, wires: wires, handles: map[string]*netlink.Handle{}}
	for _, n := range routers {
		ns, err := netns.GetFromPath(nsrun.Path(l.Netns(n.Name)))
		if err != nil {
			t.Fatal(err)
		}
		h, err := netlink.NewHandleAt(ns)
		ns.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		d.handles[n.Name] = h
	}
	return d
}

func (d *dropReader) read(t *testing.T) map[wire]uint64 {
	stats := map[string]*netlink.LinkStatistics{} // kernel name -> statistics (names are unique in the lab)
	for node, h := range d.handles {
		links, err := h.LinkList()
		if err != nil {
			t.Errorf("list the links of %s: %v", node, err)
			continue
		}
		for _, k := range links {
			stats[k.Attrs().Name] = k.Attrs().Statistics
		}
	}
	out := map[wire]uint64{}
	for _, w := range d.wires {
		var n uint64
		if w.from.Link.Loss > 0 {
			c, ok, err := d.l.ReadLoss(w.from)
			if err != nil || !ok {
				t.Errorf("read the loss counters of %s: ok %v, %v", w.out(), ok, err)
			}
			n += c.Dropped
		}
		if st := stats[d.l.IfName(w.from)]; st != nil {
			n += st.TxDropped
		}
		if st := stats[d.l.IfName(w.from.Peer())]; st != nil {
			n += st.RxDropped
		}
		out[w] = n
	}
	return out
}

// sendFlow sends UDP from src to dst's discard port at up to 1,000 datagrams a second until
// stop, colored per period with the dscp carrier (IP_TOS) as sendColored does, none within
// quiet of a period boundary.
func sendFlow(t *testing.T, l *lab.Lab, src, dst string, quiet time.Duration, stop <-chan struct{}, wg *sync.WaitGroup) {
	d, err := l.Node(dst)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(d.Ifaces[0].IPv4.Addr().String(), "9")
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := nsrun.Do(l.Netns(src), func() error {
			c, err := net.Dial("udp4", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			return sendLoop(c, src, time.Millisecond, quiet, stop, nil, func(fd, color int) error {
				if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TOS, color<<2); err != nil {
					return fmt.Errorf("color the socket: %w", err)
				}
				return nil
			})
		})
		if err != nil {
			t.Errorf("sender %s -> %s: %v", src, dst, err)
		}
	}()
}

// jsonInt is an integer column of the analytics' JSON output: a number, null, or (when the
// column holds a null anywhere, as pandas writes it then) a number in a string.
type jsonInt struct {
	v    int64
	null bool
}

func (j *jsonInt) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		j.null = true
		return nil
	}
	v, err := strconv.ParseInt(strings.Trim(string(b), `"`), 10, 64)
	j.v = v
	return err
}

// runAnalyticsJSON runs the analytics' command and decodes its JSON Lines output into rows.
func runAnalyticsJSON[T any](t *testing.T, script string, rows *[]T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, script, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("flowplane-analytics %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	t.Logf("flowplane-analytics %s: %v", args[0], time.Since(start).Round(time.Millisecond))
	if s := strings.TrimSpace(stderr.String()); s != "" {
		// The periods some probe did not record raise missing-point alarms; the first lines say
		// how many.
		lines := strings.Split(s, "\n")
		t.Logf("flowplane-analytics %s stderr (%d lines):\n%s", args[0], len(lines), strings.Join(lines[:min(3, len(lines))], "\n"))
	}
	dec := json.NewDecoder(&stdout)
	for {
		var r T
		if err := dec.Decode(&r); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("flowplane-analytics %s: decode its JSON: %v", args[0], err)
		}
		*rows = append(*rows, r)
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
