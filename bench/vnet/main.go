// Command vnet benchmarks the user-space network: TCP goodput over one loopback UDP link and
// through a router, loss recovery against Linux TCP on a lab link with the same loss,
// a 5 GB byte-exact transfer across sequence wraparound, 1,000 concurrent connections, and RIP
// reconvergence on 10 routers.
// The Linux baseline is iperf3 over a kernel lab (internal/lab) with the same loss (see
// linuxBaseline). It prints a markdown table and writes JSON to bench/results/.
//
//	go run ./bench/vnet [-duration 5s] [-big 5GB] [-skip-linux]
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/topo"
	"github.com/flowplane/flowplane/internal/vnet"
	"github.com/flowplane/flowplane/internal/vnet/tcp"
)

type result struct {
	Name    string         `json:"name"`
	What    string         `json:"what"`
	Value   float64        `json:"value"`
	Unit    string         `json:"unit"`
	Goal    *report.Goal   `json:"goal,omitempty"`
	Note    string         `json:"note,omitempty"`
	Details map[string]any `json:"details,omitempty"`
}

// goal is g, or not met when the run failed (err).
func goal(g report.Goal, err error) *report.Goal {
	if err != nil {
		no := false
		g.Met, g.Value = &no, "error"
	}
	return &g
}

var (
	duration  = flag.Duration("duration", 5*time.Second, "length of each throughput run")
	bigBytes  = flag.Int64("big", 5<<30, "bytes for the wraparound transfer (0 skips it)")
	conns     = flag.Int("conns", 1000, "concurrent connections")
	skipLinux = flag.Bool("skip-linux", false, "skip the Linux TCP baseline (needs root and BPF for a kernel lab, and iperf3)")
	only      = flag.String("only", "", "comma-separated benchmark name prefixes to run (default all)")
)

func want(name string) bool {
	if *only == "" {
		return true
	}
	for _, p := range strings.Split(*only, ",") {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func main() {
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	var rs []result
	add := func(r result, err error) {
		if err != nil {
			r.Note = "error: " + err.Error()
			fmt.Fprintf(os.Stderr, "%s: %v\n", r.Name, err)
		}
		fmt.Fprintf(os.Stderr, "%-22s %10.1f %s %s\n", r.Name, r.Value, r.Unit, r.Note)
		rs = append(rs, r)
	}

	if want("link-1500") {
		r, err := goodput("link-1500", "1 TCP connection, 1 loopback UDP link, MTU 1500", lineTopo(0, 1500, ""), "a", "b", tcp.DefaultConfig(), *duration)
		r.Goal = goal(report.AtLeast("goodput", r.Value, 1000).In("Mbit/s"), err)
		add(r, err)
	}
	if want("link-9000") {
		add(goodput("link-9000", "same, MTU 9000 (informational)", lineTopo(0, 9000, ""), "a", "b", tcp.DefaultConfig(), *duration))
	}
	if want("router-1500") {
		r, err := goodput("router-1500", "1 TCP connection through 1 router, MTU 1500", lineTopo(1, 1500, ""), "a", "b", tcp.DefaultConfig(), *duration)
		r.Goal = goal(report.AtLeast("goodput", r.Value, 600).In("Mbit/s"), err)
		add(r, err)
	}

	for _, cc := range []string{"reno", "cubic"} {
		if !want("loss2-" + cc) {
			continue
		}
		cfg := tcp.DefaultConfig()
		cfg.CC = cc
		r, err := goodput("loss2-"+cc, "vnet "+cc+", one link with 2% loss each way", lineTopo(0, 1500, "loss: 2%"), "a", "b", cfg, 2*(*duration))
		metric := "goodput / Linux " + cc + "'s"
		r.Goal = goal(report.Unjudged(metric, "≥ 0.5", "no baseline (-skip-linux)"), err)
		if !*skipLinux {
			lin, lerr := linuxBaseline(cc, 2*(*duration))
			if lerr != nil {
				r.Note = fmt.Sprintf("linux baseline unavailable: %v", lerr)
				r.Goal = goal(report.Unjudged(metric, "≥ 0.5", "no baseline"), err)
			} else {
				ratio := r.Value / lin
				if r.Details == nil {
					r.Details = map[string]any{}
				}
				r.Details["linux_mbps"], r.Details["ratio"] = lin, ratio
				r.Goal = goal(report.AtLeast(metric, ratio, 0.5), err)
				r.Note = fmt.Sprintf("Linux %s %.1f Mbit/s, ratio %.2f", cc, lin, ratio)
			}
		}
		add(r, err)
	}
	if *bigBytes > 0 && want("wrap-5g") {
		r, err := bigTransfer(*bigBytes)
		r.Goal = goal(report.Check("data", "byte-exact (sha256) across wraparound", err == nil), nil)
		add(r, err)
	}
	if want("conns") {
		r, err := manyConns(*conns)
		r.Goal = goal(report.Check(fmt.Sprintf("data of %d concurrent connections", *conns), "exact", err == nil), nil)
		add(r, err)
	}
	if want("rip") {
		r, err := ripConvergence()
		r.Goal = goal(report.AtMost("every table correct after", r.Value, 1000).In("ms"), err)
		add(r, err)
	}

	if err := report.Save(report.Result{Name: "vnet", Tables: []*report.Table{table(rs)},
		Data: map[string]any{"gomaxprocs": runtime.GOMAXPROCS(0), "results": rs}}); err != nil {
		fmt.Fprintln(os.Stderr, "write results:", err)
		os.Exit(1)
	}
}

// lineTopo is a chain a - r1 - ... - rN - b with the given MTU and extra link properties.
func lineTopo(routers, mtu int, extra string) string {
	names := []string{"a"}
	for i := 1; i <= routers; i++ {
		names = append(names, fmt.Sprintf("r%d", i))
	}
	names = append(names, "b")
	var sb strings.Builder
	sb.WriteString("name: bench\nnodes:\n")
	for _, n := range names {
		kind := "host"
		if n[0] == 'r' {
			kind = "router"
		}
		fmt.Fprintf(&sb, "  %s: {kind: %s}\n", n, kind)
	}
	sb.WriteString("links:\n")
	for i := 0; i+1 < len(names); i++ {
		fmt.Fprintf(&sb, "  - endpoints: [%s, %s]\n    mtu: %d\n", names[i], names[i+1], mtu)
		if extra != "" {
			sb.WriteString("    " + extra + "\n")
		}
	}
	return sb.String()
}

func startNet(yaml string, cfg tcp.Config) (*vnet.Network, error) {
	t, err := topo.Parse("bench.yaml", []byte(yaml))
	if err != nil {
		return nil, err
	}
	nw, err := vnet.Start(t, vnet.Options{BasePort: -1, TCP: cfg})
	if err != nil {
		return nil, err
	}
	if err := nw.WaitConverged(30 * time.Second); err != nil {
		nw.Close()
		return nil, err
	}
	return nw, nil
}

func addrOf(nw *vnet.Network, node string) string {
	return nw.Node(node).Ifaces()[0].Addr.Addr().String()
}

// goodput sends for d and reports what the receiver got, in Mbit/s.
func goodput(name, what, yaml, from, to string, cfg tcp.Config, d time.Duration) (result, error) {
	r := result{Name: name, What: what, Unit: "Mbit/s"}
	nw, err := startNet(yaml, cfg)
	if err != nil {
		return r, err
	}
	defer nw.Close()
	l, err := nw.Node(to).Listen(":5001")
	if err != nil {
		return r, err
	}
	defer l.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- 0
			return
		}
		n, _ := io.Copy(io.Discard, c)
		c.Close()
		got <- n
	}()
	c, err := nw.Node(from).Dial(context.Background(), addrOf(nw, to)+":5001")
	if err != nil {
		return r, err
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	start := time.Now()
	for time.Since(start) < d {
		if _, err := c.Write(buf); err != nil {
			return r, err
		}
	}
	if err := c.CloseWrite(); err != nil {
		return r, err
	}
	n := <-got
	el := time.Since(start)
	r.Value = float64(n) * 8 / el.Seconds() / 1e6
	in := c.TCP().Info()
	r.Details = map[string]any{"bytes": n, "seconds": el.Seconds(), "retransmits": in.Stats.Retransmits,
		"timeouts": in.Stats.Timeouts, "srtt_ms": float64(in.SRTT.Microseconds()) / 1000, "cc": in.CC}
	return r, nil
}

// linuxBaseline measures Linux TCP (iperf3 from a to b) on a kernel lab (namespaces, veth, BPF
// loss) with the same loss as the vnet run: 2% of data segments and 2% of ACKs.
//
// The loss sits on a link behind a router, a - r - b with loss on r - b, because the lab drops
// packets at tcx egress: a drop at the sender's own egress is not a wire loss to Linux TCP but
// a local transmit error (NET_XMIT_DROP), which it answers by cutting cwnd (CWR) and, when
// nothing else is in flight, by waiting for the 200 ms retransmission timer. On r - b the data
// is dropped at r's egress, after forwarding, where a's TCP cannot see it; the ACKs are dropped
// at b's egress, where a failed ACK is simply an ACK not sent, as on a wire. vnet's loss is
// applied in its link writer, invisible to its TCP, on a single link. The lab sets
// gso_max_segs=1 on every interface of a lossy lab, so each segment meets the loss alone, as
// vnet's do; no TSO/GSO/GRO switching is needed. Neither side adds delay (the kernel has no
// netem), and both use a 200 ms RTO floor (Linux's rto_min, vnet's default MinRTO).
func linuxBaseline(cc string, d time.Duration) (float64, error) {
	if os.Geteuid() != 0 {
		return 0, errors.New("needs root")
	}
	name := fmt.Sprintf("vbl%d", os.Getpid()%100000)
	yaml := []byte("name: bench\nnodes:\n  a: {}\n  r: {kind: router}\n  b: {}\nlinks:\n" +
		"  - endpoints: [a, r]\n  - endpoints: [r, b]\n    loss: 2%\n")
	t, err := lab.Parse("bench-loss.yaml", yaml, name)
	if err != nil {
		return 0, err
	}
	l, err := lab.Up("bench-loss.yaml", yaml, t)
	if err != nil {
		return 0, err
	}
	defer lab.Down(name)
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	addr := t.Node("b").Ifaces[0].IPv4.Addr().String()
	r, err := l.Iperf(ctx, "a", "b", addr, "-t", fmt.Sprint(int(d.Seconds())), "-C", cc)
	if err != nil {
		return 0, err
	}
	return r.ReceivedBPS / 1e6, nil
}

// pattern is a cheap deterministic byte stream: the sender and a checker generate the same.
type pattern struct{ state uint64 }

func (p *pattern) Read(b []byte) (int, error) {
	for i := 0; i+8 <= len(b); i += 8 {
		p.state = p.state*6364136223846793005 + 1442695040888963407
		v := p.state
		b[i], b[i+1], b[i+2], b[i+3] = byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	}
	return len(b) &^ 7, nil
}

func bigTransfer(size int64) (result, error) {
	r := result{Name: "wrap-5g", What: fmt.Sprintf("%.1f GB over one link, sha256 both ends", float64(size)/(1<<30)), Unit: "Mbit/s"}
	size &^= 7
	nw, err := startNet(lineTopo(0, 1500, ""), tcp.DefaultConfig())
	if err != nil {
		return r, err
	}
	defer nw.Close()
	l, err := nw.Node("b").Listen(":5002")
	if err != nil {
		return r, err
	}
	defer l.Close()
	type res struct {
		n   int64
		sum []byte
	}
	got := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- res{}
			return
		}
		h := sha256.New()
		n, _ := io.Copy(h, c)
		c.Close()
		got <- res{n, h.Sum(nil)}
	}()
	c, err := nw.Node("a").Dial(context.Background(), addrOf(nw, "b")+":5002")
	if err != nil {
		return r, err
	}
	defer c.Close()
	h := sha256.New()
	start := time.Now()
	if _, err := io.Copy(io.MultiWriter(c, h), io.LimitReader(&pattern{1}, size)); err != nil {
		return r, err
	}
	if err := c.CloseWrite(); err != nil {
		return r, err
	}
	g := <-got
	el := time.Since(start)
	r.Value = float64(g.n) * 8 / el.Seconds() / 1e6
	r.Details = map[string]any{"bytes": g.n, "seconds": el.Seconds(), "sha256": fmt.Sprintf("%x", g.sum)}
	if g.n != size || !bytes.Equal(g.sum, h.Sum(nil)) {
		return r, fmt.Errorf("received %d of %d bytes or sha256 differs", g.n, size)
	}
	r.Note = "sha256 equal"
	return r, nil
}

func manyConns(n int) (result, error) {
	r := result{Name: "conns-1000", What: fmt.Sprintf("%d concurrent connections x 64 KiB, one link", n), Unit: "s"}
	cfg := tcp.DefaultConfig()
	cfg.Backlog = n // default 4 MiB buffers: the rings grow only as data needs them
	nw, err := startNet(lineTopo(0, 1500, ""), cfg)
	if err != nil {
		return r, err
	}
	defer nw.Close()
	l, err := nw.Node("b").Listen(":5003")
	if err != nil {
		return r, err
	}
	defer l.Close()
	const per = 64 << 10
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	accepted := make(chan struct{}) // closed once every wg.Add has happened
	go func() {
		defer close(accepted)
		for i := 0; i < n; i++ {
			c, err := l.Accept()
			if err != nil {
				errs <- err
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				b, err := io.ReadAll(c)
				if err != nil || len(b) != per || !bytes.Equal(b, payload(per, b[:min(len(b), 1)])) {
					errs <- fmt.Errorf("server got %d bytes, err %v", len(b), err)
				}
			}()
		}
	}()
	start := time.Now()
	open := make([]*vnet.Conn, n)
	for i := range open {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := nw.Node("a").Dial(ctx, addrOf(nw, "b")+":5003")
		cancel()
		if err != nil {
			return r, fmt.Errorf("dial %d: %w", i, err)
		}
		open[i] = c
	}
	var cw sync.WaitGroup
	for i, c := range open {
		cw.Add(1)
		go func() {
			defer cw.Done()
			first := []byte{byte(i)}
			if _, err := c.Write(payload(per, first)); err != nil {
				errs <- err
			}
			_ = c.CloseWrite()
		}()
	}
	cw.Wait()
	<-accepted
	wg.Wait()
	r.Value = time.Since(start).Seconds()
	for _, c := range open {
		c.Close()
	}
	select {
	case err := <-errs:
		return r, err
	default:
	}
	r.Note = fmt.Sprintf("%d connections open at once, %d MiB exact", n, n*per>>20)
	return r, nil
}

// payload is per bytes whose first byte is first[0] and the rest a function of it.
func payload(per int, first []byte) []byte {
	b := make([]byte, per)
	if len(first) == 0 {
		return b
	}
	for i := range b {
		b[i] = first[0] + byte(i*7)
	}
	return b
}

func ripConvergence() (result, error) {
	r := result{Name: "rip-10-routers", What: "ring of 10 routers: link down until every table is correct", Unit: "ms"}
	var sb strings.Builder
	sb.WriteString("name: ring\nnodes:\n")
	for i := 0; i < 10; i++ {
		fmt.Fprintf(&sb, "  r%d: {kind: router}\n", i)
	}
	sb.WriteString("links:\n")
	for i := 0; i < 10; i++ {
		fmt.Fprintf(&sb, "  - endpoints: [r%d, r%d]\n", i, (i+1)%10)
	}
	t, err := topo.Parse("ring.yaml", []byte(sb.String()))
	if err != nil {
		return r, err
	}
	nw, err := vnet.Start(t, vnet.Options{BasePort: -1})
	if err != nil {
		return r, err
	}
	defer nw.Close()
	if err := nw.WaitConverged(30 * time.Second); err != nil {
		return r, err
	}
	time.Sleep(time.Second)
	down := t.Links[4]
	start := time.Now()
	nw.SetLinkUp(down, false)
	for {
		if correctRing(nw, t, down) {
			break
		}
		if time.Since(start) > 30*time.Second {
			return r, errors.New("tables not correct after 30 s")
		}
		time.Sleep(time.Millisecond)
	}
	r.Value = float64(time.Since(start).Microseconds()) / 1000
	return r, nil
}

// correctRing checks every router's metric to every subnet against the ring with one link cut.
func correctRing(nw *vnet.Network, t *topo.Topology, down *topo.Link) bool {
	n := len(t.Nodes)
	cut := down.Index // link i joins r_i and r_(i+1)
	dist := func(a, b int) int {
		// On a line broken between cut and cut+1, go the only way round.
		pa, pb := (a-cut-1+n)%n, (b-cut-1+n)%n
		if pa > pb {
			return pa - pb
		}
		return pb - pa
	}
	for i, node := range nw.Nodes() {
		routes := node.Routes()
		want := 0
		for _, l := range t.Links {
			if l == down {
				continue
			}
			want++
			a, b := l.Index, (l.Index+1)%n
			m := min(dist(i, a), dist(i, b))
			ok := false
			for _, rt := range routes {
				if rt.Prefix == l.A.IPv4.Masked() && rt.Metric == m {
					ok = true
				}
			}
			if !ok {
				return false
			}
		}
		if len(routes) != want {
			return false
		}
	}
	return true
}

// table is the results with their goals.
func table(rs []result) *report.Table {
	t := &report.Table{
		Title:   "vnet: the user-space network",
		Columns: []string{"benchmark", "what", "result", "notes"},
		Notes:   []string{fmt.Sprintf("GOMAXPROCS=%d. One run each; the Linux baseline is iperf3 on a kernel lab with the same loss (docs/vnet.md).", runtime.GOMAXPROCS(0))},
	}
	for _, r := range rs {
		t.Add(r.Name, r.What, fmt.Sprintf("%.1f %s", r.Value, r.Unit), r.Note)
		if r.Goal != nil {
			t.Goal(*r.Goal)
		}
	}
	return t
}
