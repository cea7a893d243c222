package lab_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/impair"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
	"github.com/flowplane/flowplane/internal/topo"
)

// A ping over a link with `delay: 10ms` takes 20 ms: never less, and the median within 1.5 ms of it
// (the relay wakes late by the scheduler's latency, which a loaded shared machine stretches).
// Links without impairments stay plain veths, with no relay.
func TestRelayDelayRTT(t *testing.T) {
	t.Parallel()
	l := labtest.Up(t, `
nodes: {h1: {}, h2: {}, h3: {}}
links:
  - endpoints: [h1, h2]
    delay: 10ms
  - endpoints: [h1, h3]
`)
	labtest.Run(t, l, "h1", "ping", "-c", "1", "-W", "2", labtest.Addr(t, l, "h2", "4")) // ARP
	out := labtest.Run(t, l, "h1", "ping", "-c", "100", "-i", "0.01", "-W", "2", labtest.Addr(t, l, "h2", "4"))
	var rtts []float64
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "time="); ok {
			ms, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("ping output %q", f)
			}
			rtts = append(rtts, ms)
		}
	}
	if len(rtts) < 95 {
		t.Fatalf("%d of 100 replies:\n%s", len(rtts), out)
	}
	sort.Float64s(rtts)
	median := rtts[len(rtts)/2]
	t.Logf("RTT over a 10 ms link: min %.3f, median %.3f, p90 %.3f, max %.3f ms", rtts[0], median, rtts[len(rtts)*9/10], rtts[len(rtts)-1])
	if rtts[0] < 20 {
		t.Errorf("a ping took %.3f ms, less than the 20 ms the link's delay allows", rtts[0])
	}
	if median > 21.5 {
		t.Errorf("median RTT %.3f ms, want 20 ms (+1.5 ms)", median)
	}
	time.Sleep(300 * time.Millisecond) // the relay writes its counters every 0.1 s
	st, err := l.Status()
	if err != nil {
		t.Fatal(err)
	}
	r := st.Links[0].Relay
	if r == nil || !r.Alive || r.AToB.Delayed < 100 || r.BToA.Delayed < 100 {
		t.Errorf("relay status %+v", r)
	}
	if st.Links[1].Relay != nil {
		t.Errorf("a plain link has a relay: %+v", st.Links[1].Relay)
	}
	if _, err := os.Stat(nsrun.Path(lab.Netns(l.Name(), "_link1"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a plain link has a relay namespace (%v)", err)
	}
}

// probe is a UDP flow from a node to an interface's address: each datagram carries its sequence
// number and send time, and the receiver's kernel timestamps its arrival (SO_TIMESTAMPNS), so the
// one-way delay excludes this process's scheduling.
type probe struct {
	conn net.PacketConn
	dst  *net.UDPAddr
	sink *net.UDPConn
}

type arrival struct {
	seq   uint64
	delay time.Duration
}

func newProbe(t *testing.T, l *lab.Lab, from string, to *topo.Iface) *probe {
	t.Helper()
	p := &probe{dst: &net.UDPAddr{IP: to.IPv4.Addr().AsSlice(), Port: 9}}
	if err := nsrun.Do(l.Netns(to.Node.Name), func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: p.dst.IP, Port: 9})
		if err != nil {
			return err
		}
		p.sink = c
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		err = raw.Control(func(fd uintptr) {
			serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1),
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20))
		})
		return errors.Join(err, serr)
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.sink.Close() })
	if err := nsrun.Do(l.Netns(from), func() (err error) {
		p.conn, err = net.ListenPacket("udp4", ":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.conn.Close() })
	return p
}

// run sends n datagrams, one every gap, and returns what arrived, in arrival order, once nothing
// more has come for quiet.
func (p *probe) run(t *testing.T, n int, gap, quiet time.Duration) []arrival {
	t.Helper()
	var got []arrival
	done := make(chan error, 1)
	go func() {
		buf, oob := make([]byte, 2048), make([]byte, 256)
		for {
			_ = p.sink.SetReadDeadline(time.Now().Add(quiet + time.Duration(n)*gap))
			m, oobn, _, _, err := p.sink.ReadMsgUDP(buf, oob)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					err = nil
				}
				done <- err
				return
			}
			if m < 16 {
				continue
			}
			at, ok := rxTime(oob[:oobn])
			if !ok {
				done <- errors.New("no SO_TIMESTAMPNS timestamp")
				return
			}
			sent := int64(binary.LittleEndian.Uint64(buf[8:]))
			got = append(got, arrival{binary.LittleEndian.Uint64(buf), time.Duration(at - sent)})
		}
	}()
	payload := make([]byte, 100)
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
			time.Sleep(d)
		}
		binary.LittleEndian.PutUint64(payload, uint64(i))
		binary.LittleEndian.PutUint64(payload[8:], uint64(time.Now().UnixNano()))
		if _, err := p.conn.WriteTo(payload, p.dst); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return got
}

func rxTime(oob []byte) (int64, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= 16 {
			sec := int64(binary.LittleEndian.Uint64(m.Data))
			nsec := int64(binary.LittleEndian.Uint64(m.Data[8:]))
			return sec*1e9 + nsec, true
		}
	}
	return 0, false
}

// The one-way delays over a jittered link follow the configured distribution: a
// Kolmogorov–Smirnov statistic against its CDF (internal/impair.CDF) stays under a stated bound,
// and is far larger against the other distributions, so the comparison can tell them apart.
// Only h1's direction is impaired (the endpoint's keys).
func TestRelayJitterDistribution(t *testing.T) {
	t.Parallel()
	l := labtest.Up(t, `
nodes: {h1: {}, h2: {}, h3: {}, h4: {}}
links:
  - endpoints: [{node: h1, delay: 10ms, jitter: 4ms, distribution: uniform}, h2]
  - endpoints: [{node: h1, delay: 10ms, jitter: 3ms, distribution: normal}, h3]
  - endpoints: [{node: h1, delay: 10ms, jitter: 4ms, distribution: pareto}, h4]
`)
	const n = 600
	var wg sync.WaitGroup
	results := make([][]arrival, len(l.Topology.Links))
	for i, link := range l.Topology.Links {
		p := newProbe(t, l, "h1", link.B)
		wg.Go(func() { results[i] = p.run(t, n, 2*time.Millisecond, time.Second) })
	}
	wg.Wait()
	// The stated bound: 1.5 × the 0.1 % critical value, for the relay's own latency (its wake-up
	// and send take tens of µs).
	bound := 1.5 * impair.KSCritical(n, 0.001)
	for i, link := range l.Topology.Links {
		e := link.A.Egress
		got := results[i]
		if len(got) < n*99/100 {
			t.Errorf("%s: %d of %d datagrams arrived", e.Distribution, len(got), n)
			continue
		}
		delays := make([]time.Duration, len(got))
		for k, a := range got {
			delays[k] = a.delay
		}
		ks := func(d impair.Distribution) float64 {
			return impair.KS(delays, func(x time.Duration) float64 { return impair.CDF(d, e.Delay, e.Jitter, x) })
		}
		d := ks(e.Distribution)
		t.Logf("%s (delay %v, jitter %v): median %v, KS %.4f (bound %.4f)", e.Distribution, e.Delay, e.Jitter, delays[len(delays)/2], d, bound)
		if d > bound {
			t.Errorf("%s: KS statistic %.4f against the configured distribution, above %.4f", e.Distribution, d, bound)
		}
		for _, other := range impair.Distributions {
			if other != e.Distribution {
				if d2 := ks(other); d2 < bound {
					t.Errorf("%s delays pass as %s too (KS %.4f): the test cannot tell them apart", e.Distribution, other, d2)
				}
			}
		}
	}
}

// binomialOK says whether k events in n trials of probability p are within 5 standard deviations.
func binomialOK(k uint64, n int, p float64) bool {
	mean := float64(n) * p
	return math.Abs(float64(k)-mean) <= 5*math.Sqrt(mean*(1-p))+1
}

// Reordering, duplication, corruption and burst loss, each on a link of its own, happen at the
// configured rates (within binomial bounds), the relay's counters say what happened, and the
// receiver sees exactly that: every duplicate, every corrupted frame dropped by a checksum,
// every lost one missing, the reordered ones ahead of their predecessors.
func TestRelayImpairmentRates(t *testing.T) {
	t.Parallel()
	l := labtest.Up(t, `
nodes: {h1: {}, h2: {}, h3: {}, h4: {}, h5: {}}
links:
  - endpoints: [h1, h2]
    delay: 5ms
    reorder: 10%
  - endpoints: [h1, h3]
    duplicate: 5%
  - endpoints: [h1, h4]
    corrupt: 5%
  - endpoints: [h1, h5]
    loss: gemodel 2% 25%
`)
	const n = 4000
	var wg sync.WaitGroup
	results := make([][]arrival, len(l.Topology.Links))
	for i, link := range l.Topology.Links {
		p := newProbe(t, l, "h1", link.B)
		wg.Go(func() { results[i] = p.run(t, n, 250*time.Microsecond, time.Second) })
	}
	wg.Wait()
	st, err := l.Status()
	if err != nil {
		t.Fatal(err)
	}
	for i, got := range results {
		c := st.Links[i].Relay.AToB
		seen := map[uint64]int{}
		for _, a := range got {
			seen[a.seq]++
		}
		dups := uint64(len(got) - len(seen))
		missing := uint64(n - len(seen))
		// An arrival is early when a datagram sent before it arrives after it.
		early, low := uint64(0), uint64(math.MaxUint64)
		for k := len(got) - 1; k >= 0; k-- {
			if low < got[k].seq {
				early++
			}
			low = min(low, got[k].seq)
		}
		t.Logf("link %d: %d received, %d duplicates, %d missing, %d early; relay: rx %d, reordered %d, duplicated %d, corrupted %d, lost %d, overflow %d",
			i, len(got), dups, missing, early, c.RxPackets, c.Reordered, c.Duplicated, c.Corrupted, c.Lost, c.Overflow)
		if c.RxPackets < n || c.Overflow != 0 || c.TxErrors != 0 {
			t.Errorf("link %d: relay received %d of %d, overflow %d, tx errors %d", i, c.RxPackets, n, c.Overflow, c.TxErrors)
			continue
		}
		// The relay also carried a few frames that are not the probe's (ARP): what it did to those
		// does not show at the receiver.
		other := c.RxPackets - n
		near := func(seen, relay uint64) bool { return seen <= relay && seen+other >= relay }
		// A veth hands each frame to the backlog of the CPU that sent it: when a sender's thread
		// (the probe's, the relay's) moves to the other CPU between two frames, the second can
		// overtake the first. A few such arrivals are early without the relay's doing.
		const pathReordered = n / 1000
		switch i {
		case 0:
			if !binomialOK(c.Reordered, n, 0.10) || early > c.Reordered+pathReordered || early < (c.Reordered-other)*9/10 || missing != 0 {
				t.Errorf("reorder 10%%: %d reordered by the relay, %d arrived early, %d missing", c.Reordered, early, missing)
			}
		case 1:
			if !binomialOK(c.Duplicated, n, 0.05) || !near(dups, c.Duplicated) || missing != 0 {
				t.Errorf("duplicate 5%%: %d duplicated by the relay, %d received twice, %d missing", c.Duplicated, dups, missing)
			}
		case 2:
			if !binomialOK(c.Corrupted, n, 0.05) || !near(missing, c.Corrupted) {
				t.Errorf("corrupt 5%%: %d corrupted by the relay, %d missing (each should fail a checksum)", c.Corrupted, missing)
			}
		case 3:
			// Bursts make the count vary more than a binomial's: within ±50 % of the mean.
			mean := float64(n) * l.Topology.Links[3].LossGE.MeanLoss()
			if float64(c.Lost) < 0.5*mean || float64(c.Lost) > 1.5*mean || !near(missing, c.Lost) {
				t.Errorf("gemodel loss (mean %.0f): %d lost by the relay, %d missing", mean, c.Lost, missing)
			}
		}
	}
}

// TCP's byte stream arrives exact through delay, jitter, reordering, duplication, corruption
// and loss at once: corrupted segments are caught by checksums, as on a real wire.
func TestRelayTCPStreamExact(t *testing.T) {
	t.Parallel()
	l := labtest.Up(t, `
nodes: {h1: {}, h2: {}}
links:
  - endpoints: [h1, h2]
    delay: 2ms
    jitter: 500us
    reorder: 2%
    duplicate: 2%
    corrupt: 1%
    loss: 1%
`)
	data := make([]byte, 4<<20)
	_, _ = rand.Read(data)
	want := sha256.Sum256(data)
	dst := labtest.Addr(t, l, "h2", "4")
	var ln net.Listener
	if err := nsrun.Do(l.Netns("h2"), func() (err error) { ln, err = net.Listen("tcp4", dst+":5001"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan [32]byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- [32]byte{}
			return
		}
		defer c.Close()
		h := sha256.New()
		_, _ = io.Copy(h, c)
		got <- [32]byte(h.Sum(nil))
	}()
	var conn net.Conn
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := nsrun.Do(l.Netns("h1"), func() (err error) {
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp4", dst+":5001")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	start := time.Now()
	if _, err := io.Copy(conn, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	sum := <-got
	t.Logf("%d MiB in %v", len(data)>>20, time.Since(start).Round(time.Millisecond))
	if sum != want {
		t.Fatal("the byte stream that arrived differs from the one sent")
	}
	st, err := l.Status()
	if err != nil {
		t.Fatal(err)
	}
	r := st.Links[0].Relay
	t.Logf("relay h1→h2: %+v", r.AToB)
	for what, v := range map[string]uint64{"corrupted": r.AToB.Corrupted, "duplicated": r.AToB.Duplicated,
		"reordered": r.AToB.Reordered, "lost": r.AToB.Lost} {
		if v == 0 {
			t.Errorf("the relay %s no segment: the test exercised nothing", what)
		}
	}
}

// lab down stops the relays and their supervisors and removes their namespaces, interfaces,
// counters and logs.
func TestRelayDownLeavesNothing(t *testing.T) {
	t.Parallel()
	l := upSupervised(t)
	r, err := l.Relay(l.Topology.Links[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.Down(l.Name()); err != nil {
		t.Fatal(err)
	}
	// The relay and its supervisor have left the namespace once lab down returns, but may still be
	// exiting, and the supervisor stays a zombie until this process, its parent, reaps it.
	gone(t, r.PID, "relay")
	gone(t, r.SupervisorPID, "relay supervisor")
	assertGone(t, l.Name())
	entries, _ := os.ReadDir("/run/flowplane/lab")
	if i := slices.IndexFunc(entries, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), l.Name()+".") }); i >= 0 {
		t.Errorf("%s is left", entries[i].Name())
	}
}

// A link of an xdp node cannot be impaired: XDP-redirected frames would skip the relay.
func TestRelayRefusedOnXDPLink(t *testing.T) {
	t.Parallel()
	_, err := lab.Parse("x.yaml", []byte(`
nodes:
  r1: {kind: router, xdp: true}
  h1: {}
links:
  - endpoints: [r1, {node: h1, delay: 5ms}]
`), "fpxx")
	if err == nil || !strings.Contains(err.Error(), "x.yaml:6: links[0]: a link of an xdp node cannot have delay") {
		t.Fatalf("Parse: %v", err)
	}
}

// A relay that cannot start fails lab up, which then removes everything it made: namespaces
// (the relay's too), interfaces, processes and files.
func TestRelayFailureRollsBack(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	name := testenv.Name("f")
	yaml := "nodes: {h1: {}, h2: {}}\nlinks:\n  - endpoints: [h1, h2]\n    delay: 1ms\n"
	top, err := lab.Parse("fail.yaml", []byte(yaml), name)
	if err != nil {
		t.Fatal(err)
	}
	// The relay's counters file cannot be created where a directory stands.
	blocker := filepath.Join("/run/flowplane/lab", name+".relay", "link0.stats")
	if err := os.MkdirAll(blocker, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(blocker)); _ = lab.Down(name) })
	_, err = lab.Up("fail.yaml", []byte(yaml), top)
	if err == nil || !strings.Contains(err.Error(), "relay exited") || !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("lab up: %v, want the relay's failure, rolled back", err)
	}
	assertGone(t, name)
	if _, err := os.Stat(filepath.Dir(blocker)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the relay directory is left (%v)", err)
	}
}
