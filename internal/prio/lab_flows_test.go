package prio

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/match"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// A receiver that reads everything, and a sender that trickles 1000 bytes every 50 ms for
// SLOW seconds, prints "bulk" and 0.3 s later queues BULK bytes at once (sndbuf SNDBUF), prints
// "queued" when the socket took it all, and keeps the connection open HOLD seconds.
const (
	receiverPy = `import socket,sys
s=socket.create_server(("::",int(sys.argv[1])),family=socket.AF_INET6,dualstack_ipv6=True)
print("ready",flush=True)
c,_=s.accept()
while c.recv(1<<16): pass
`
	senderPy = `import socket,sys,time
host,port,slow,bulk,sndbuf,hold=sys.argv[1],int(sys.argv[2]),float(sys.argv[3]),int(sys.argv[4]),int(sys.argv[5]),float(sys.argv[6])
s=socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET,socket.SO_SNDBUF,sndbuf); s.connect((host,port))
end=time.time()+slow
while time.time()<end:
    s.send(b"x"*1000); time.sleep(0.05)
print("bulk",flush=True)
time.sleep(0.3)
s.sendall(b"x"*bulk)
print("queued",flush=True)
time.sleep(hold)
`
)

// flowLab is h1 — r1 — h2 with the host writer on a cgroup of h1's senders.
type flowLab struct {
	l        *lab.Lab
	cg       string
	host     string // the writer's attachment
	h2, h2v6 string
	dev      string // r1's interface towards h2
}

func newFlowLab(t *testing.T) *flowLab {
	t.Helper()
	testenv.Privileged(t)
	testenv.Need(t, "python3", "ss")
	l := labtest.Up(t, labtest.HostRouterHost)
	fl := &flowLab{l: l, cg: testCgroup(t), host: testenv.Name("h"), h2: labtest.Addr(t, l, "h2", "4"), h2v6: labtest.Addr(t, l, "h2", "6"), dev: device(t, l, "r1", "eth1")}
	t.Cleanup(func() { _ = RemoveHost(fl.host) })
	fl.writer(t, DefaultRefresh)
	return fl
}

// writer (re)attaches the host writer, every connection selected, with refresh (and the
// default min_interval unless refresh is 0).
func (fl *flowLab) writer(t *testing.T, refresh time.Duration) {
	t.Helper()
	p := &HostPolicy{File: "test", Advertise: []match.Match{match.Any()}, Refresh: refresh}
	if refresh != 0 {
		p.MinInterval = DefaultMinInterval
	}
	if err := Host(fl.host, fl.cg, p); err != nil {
		t.Fatal(err)
	}
}

// router puts p on r1's interface towards h2 at rate until the test ends or the returned
// function is called.
func (fl *flowLab) router(t *testing.T, rate uint64, p *RouterPolicy) func() {
	t.Helper()
	p.Trust = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24"), netip.MustParsePrefix("fd00::/64")}
	if err := nsrun.Do(fl.l.Netns("r1"), func() error { return Router(fl.dev, rate, p) }); err != nil {
		t.Fatal(err)
	}
	removed := false
	remove := func() {
		if !removed {
			removed = true
			if err := nsrun.Do(fl.l.Netns("r1"), func() error { return RemoveRouter(fl.dev) }); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(remove)
	return remove
}

// transfer starts the receiver on h2 and the sender on h1 (in the cgroup); it returns the
// sender's output lines as they come.
func (fl *flowLab) transfer(t *testing.T, ctx context.Context, dst string, port int, slow float64, bulk, sndbuf int, hold float64) <-chan string {
	t.Helper()
	rcv, err := fl.l.Command(ctx, "h2", "python3", "-c", receiverPy, strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	rout, err := rcv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := rcv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rcv.Process.Kill(); _ = rcv.Wait() })
	if line, _ := bufio.NewReader(rout).ReadString('\n'); strings.TrimSpace(line) != "ready" {
		t.Fatalf("receiver on h2: %q", line)
	}
	snd, err := fl.l.Command(ctx, "h1", "python3", "-c", senderPy, dst, strconv.Itoa(port),
		fmt.Sprint(slow), strconv.Itoa(bulk), strconv.Itoa(sndbuf), fmt.Sprint(hold))
	if err != nil {
		t.Fatal(err)
	}
	fd, err := cgroup.Into(snd.Cmd, fl.cg)
	if err != nil {
		t.Fatal(err)
	}
	sout, err := snd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := snd.Start(); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	t.Cleanup(func() { _ = snd.Process.Kill(); _ = snd.Wait() })
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(sout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return lines
}

// flow is the router's entry for the flow to h2:port, if it has one.
func (fl *flowLab) flow(t *testing.T, port int) (FlowStatus, RouterStatus, bool) {
	t.Helper()
	rs := statusIn(t, fl.l).Routers[0]
	for _, f := range rs.Flows {
		if strings.HasSuffix(f.Dst, fmt.Sprintf(":%d", port)) {
			return f, rs, true
		}
	}
	return FlowStatus{}, rs, false
}

func (fl *flowLab) cmd(t *testing.T, node, name string, args ...string) ([]byte, error) {
	t.Helper()
	c, err := fl.l.Command(context.Background(), node, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return c.CombinedOutput()
}

func waitLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	select {
	case l := <-lines:
		if l != want {
			t.Fatalf("sender said %q, want %q", l, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("sender did not say %q", want)
	}
}

var notsentRE = regexp.MustCompile(`notsent:(\d+)`)

// TestLabBacklogAgreesWithSS: the backlog h1 advertises, as r1's classifier recorded it, agrees
// with what `ss -ti` reports as notsent for the same socket. The sender queues 1 MB behind a
// 2 Mbit/s bottleneck, so its unsent bytes fall by 250 KB/s; each sample reads r1, then ss on h1,
// then r1 again, once the transfer is under way (r1 heard of the whole write and saw 100 KB of it
// leave: before that the sender's first burst and the stall behind r1's queue leave r1 with what
// the first segments said). An advertisement counts the packet that carries it and is rounded up
// to 64 bytes, and segments that h1's TCP has sent may still be on their way to r1's hook (h1's
// stack, the veth, r1's forwarding) when r1 is read — as many as one ACK released at once,
// which under a loaded CI run was 8 (an ACK that came late acknowledges several segments, and
// the sender answers it with as many): so with the option on every data segment (refresh 0)
// notsent must lie in [after − 12 segments, before]. By default the writer
// skips changes below a step (an eighth of what it last wrote), so r1's value may be that much
// older, and min_interval may hold a step for up to two segments at this rate (1 ms and two
// coarse-clock ticks): [after − after/8 − 14 segments, before]. Over IPv4 and IPv6, in both
// modes. h1's TSO and GSO are off for this: with them the kernel writes the option once per
// super-packet of up to 64 KB, and the advertisement includes the whole of it (docs/prio.md).
func TestLabBacklogAgreesWithSS(t *testing.T) {
	t.Parallel()
	fl := newFlowLab(t)
	testenv.Need(t, "ethtool")
	if out, err := fl.cmd(t, "h1", "ethtool", "-K", device(t, fl.l, "h1", "eth0"), "tso", "off", "gso", "off"); err != nil {
		t.Fatalf("ethtool: %v: %s", err, out)
	}
	fl.router(t, 2e6, &RouterPolicy{File: "test", Scheme: Backlog, Leaves: 1, MinRate: 0.05, Limit: 100,
		Thresholds: []uint64{64e3, 1e6}, ChangeInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const inTransit, heldSegments = 12 * (1448 + 64), 2 * (1448 + 64)
	port := 5410
	for _, refresh := range []time.Duration{0, DefaultRefresh} {
		fl.writer(t, refresh)
		for _, dst := range []string{fl.h2, fl.h2v6} {
			port++
			lines := fl.transfer(t, ctx, dst, port, 0, 1_000_000, 2<<20, 10)
			waitLine(t, lines, "bulk")
			waitLine(t, lines, "queued")
			// The first segments go out while the sender is still copying the 1 MB in;
			// until r1's queue drains and the ACKs let h1 send again, r1 knows only their
			// backlog, and then h1 sends a burst. Sample once r1 has heard of the whole
			// write and seen 100 KB of it leave: the ACK clock runs.
			var heard uint32
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				f, _, ok := fl.flow(t, port)
				if ok && heard == 0 && f.Backlog > 512<<10 {
					heard = f.Backlog
				}
				if ok && heard != 0 && f.Backlog+100<<10 < heard {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("refresh %v, %s: r1 did not see the 1-MB backlog drain (%d, now %d)", refresh, dst, heard, f.Backlog)
				}
			}
			for n := 0; n < 8; n++ {
				before, _, ok1 := fl.flow(t, port)
				ss, err := fl.l.Command(ctx, "h1", "ss", "-tinH", "dport", "=", strconv.Itoa(port))
				if err != nil {
					t.Fatal(err)
				}
				out, err := ss.Output()
				if err != nil {
					t.Fatalf("ss: %v", err)
				}
				after, _, ok2 := fl.flow(t, port)
				m := notsentRE.FindSubmatch(out)
				if !ok1 || !ok2 || m == nil {
					t.Fatalf("%s sample %d: flow on r1 %v/%v, ss notsent in %q", dst, n, ok1, ok2, out)
				}
				notsent, _ := strconv.Atoi(string(m[1]))
				lo := int(after.Backlog) - inTransit
				if refresh != 0 {
					lo -= int(after.Backlog)/8 + heldSegments
				}
				t.Logf("refresh %v, %s sample %d: advertised %d, ss notsent %d, advertised %d", refresh, dst, n, before.Backlog, notsent, after.Backlog)
				if notsent > int(before.Backlog) || notsent < lo {
					t.Errorf("refresh %v, %s sample %d: ss notsent %d outside [%d, %d] from the advertisements around it", refresh, dst, n, notsent, lo, before.Backlog)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

// TestLabStarvedFlowMovesUp: under occupancy, a flow that trickles (its send buffer nearly
// empty: the last band with information) and then queues 2 MB behind the 2 Mbit/s bottleneck
// (a short router queue keeps its window small: its buffer is full of data the network does not
// take — starved) moves up at least five bands. With a band-change interval
// of an hour it stays where its first information put it, and the refused moves are counted.
func TestLabStarvedFlowMovesUp(t *testing.T) {
	t.Parallel()
	fl := newFlowLab(t)
	for _, c := range []struct {
		name     string
		interval time.Duration
		port     int
	}{{"moves", 10 * time.Millisecond, 5412}, {"held", time.Hour, 5413}} {
		remove := fl.router(t, 2e6, &RouterPolicy{File: "test", Scheme: Occupancy, Leaves: 1, MinRate: 0.05, Limit: 10, ChangeInterval: c.interval})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		lines := fl.transfer(t, ctx, fl.h2, c.port, 1, 2_000_000, 1<<20, 0)
		waitLine(t, lines, "bulk")
		trickle, _, ok := fl.flow(t, c.port)
		if !ok || trickle.InfoFromOption != "tcp-option" {
			t.Fatalf("%s: after the trickle r1 has %+v (found %v), want a flow with information", c.name, trickle, ok)
		}
		time.Sleep(1500 * time.Millisecond) // the bulk fills the buffer: starved
		starved, rs, _ := fl.flow(t, c.port)
		t.Logf("%s: trickle band %d (occupancy %d%%), then band %d (occupancy %d%%), %d changes, counters %v",
			c.name, trickle.Band, trickle.Occupancy, starved.Band, starved.Occupancy, starved.BandChanges, rs.Counters)
		if trickle.Band < 7 {
			t.Errorf("%s: trickling flow in band %d (occupancy %d%%), want 7-9", c.name, trickle.Band, trickle.Occupancy)
		}
		switch c.name {
		case "moves":
			if starved.Band+5 > trickle.Band || starved.BandChanges == 0 {
				t.Errorf("starved flow in band %d (occupancy %d%%) after %d changes; want at least 5 bands above %d", starved.Band, starved.Occupancy, starved.BandChanges, trickle.Band)
			}
		case "held":
			// No change: the SYN's information placed the flow, and every later move is held.
			if starved.Band != trickle.Band || starved.BandChanges != 0 || rs.Counters["change_held"] == 0 {
				t.Errorf("with an hour between changes: band %d → %d, %d changes, %d held; want it kept, 0 changes, held > 0",
					trickle.Band, starved.Band, starved.BandChanges, rs.Counters["change_held"])
			}
		}
		cancel()
		remove()
	}
}
