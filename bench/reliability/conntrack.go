package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/conntrack"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/pin"
)

// The conntrack-faults part: conntrack with its default tables on a lab router (h1 — r1 — h2,
// XDP) while a TCP transfer from h1 to h2 runs through it, first under ctFlows new UDP flows
// from h1, each answered by h2 (more than both tables hold: the unconfirmed LRU churns, the
// confirmed table fills and refuses the rest), then across ctRestarts stops and starts of
// `conntrack run`. The transfer is checked byte for byte at the end.
const (
	ctFlows    = 1_000_000
	ctDstPorts = 40 // h2's echo ports; × ctSrcPorts source ports ≥ ctFlows distinct tuples
	ctSrcPorts = 25_000
	ctSrcBase  = 20_000
	ctDstBase  = 5_000
	ctRestarts = 3
	ctSinkPort = 7000
)

// ctFaults is the part's raw figures.
type ctFaults struct {
	Flows         int                `json:"flows"`
	FloodSeconds  float64            `json:"flood_seconds"`
	Confirmed     int                `json:"confirmed_entries"`
	ConfirmedSize int                `json:"confirmed_size"`
	Unconfirmed   int                `json:"unconfirmed_entries"`
	Counters      map[string]int64   `json:"counters"` // over the flood
	Evicted       uint64             `json:"unconfirmed_evicted"`
	KeptThrough   bool               `json:"transfer_entry_kept_through_flood"`
	KeptRestarts  bool               `json:"transfer_entry_kept_through_restarts"`
	Restarts      []float64          `json:"restart_seconds"` // stop to attached again
	FloodMbps     float64            `json:"transfer_mbps_during_flood"`
	RestartMbps   float64            `json:"transfer_mbps_during_restarts"`
	Sent          int64              `json:"transfer_bytes_sent"`
	Received      int64              `json:"transfer_bytes_received"`
	TransferErr   string             `json:"transfer_error,omitempty"`
	CountersAfter conntrack.Counters `json:"counters_after"`
}

func init() {
	register(part{name: "conntrack-faults", title: "conntrack: ", run: runConntrackFaults})
}

type ctBench struct {
	l      *lab.Lab
	h2     netip.Addr
	in     string // r1's interfaces
	out    string
	stopCt func()
}

func runConntrackFaults(ctx context.Context) ([]*report.Table, any, error) {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "cf" + hex.EncodeToString(b)
	top, err := lab.Parse("bench-ctfaults.yaml", []byte(lab.XDPRouter), name)
	if err != nil {
		return nil, nil, err
	}
	l, err := lab.Up("bench-ctfaults.yaml", []byte(lab.XDPRouter), top)
	if err != nil {
		return nil, nil, fmt.Errorf("lab up: %w", err)
	}
	defer func() {
		if err := lab.Down(name); err != nil {
			slog.Warn("lab down", "err", err)
		}
	}()
	cb := &ctBench{l: l}
	r1, err := l.Node("r1")
	if err != nil {
		return nil, nil, err
	}
	h2, err := l.Node("h2")
	if err != nil {
		return nil, nil, err
	}
	cb.in, cb.out, cb.h2 = l.IfName(r1.Ifaces[0]), l.IfName(r1.Ifaces[1]), h2.Ifaces[0].IPv4.Addr()
	if err := cb.start(); err != nil {
		return nil, nil, err
	}
	defer func() {
		cb.stopCt()
		_ = nsrun.Do(l.Netns("r1"), func() error {
			inst, err := conntrack.Instance()
			if err != nil {
				return err
			}
			return pin.Remove("conntrack", inst)
		})
	}()
	stopEcho, err := cb.udpEcho()
	if err != nil {
		return nil, nil, err
	}
	defer stopEcho()

	res := &ctFaults{Flows: ctFlows}
	tr, err := cb.transfer()
	if err != nil {
		return nil, nil, err
	}
	defer tr.close()
	// The transfer's connection: the TCP entry to h2's sink port.
	var entry conntrack.Entry
	for deadline := time.Now().Add(15 * time.Second); entry.Packets[0] < 1000; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			return nil, nil, errors.New("no TCP transfer through r1")
		}
		if entry, err = cb.sinkEntry(); err != nil {
			return nil, nil, err
		}
	}
	before, err := cb.counters()
	if err != nil {
		return nil, nil, err
	}
	t0, b0 := time.Now(), tr.sent.Load()
	if err := cb.flood(); err != nil {
		return nil, nil, err
	}
	res.FloodSeconds = time.Since(t0).Seconds()
	res.FloodMbps = float64(tr.sent.Load()-b0) * 8 / 1e6 / res.FloodSeconds
	time.Sleep(time.Second) // the last replies
	after, err := cb.counters()
	if err != nil {
		return nil, nil, err
	}
	res.Counters = map[string]int64{}
	for k, v := range after {
		if d := int64(v) - int64(before[k]); d != 0 {
			res.Counters[k] = d
		}
	}
	if err := cb.tables(func(tb *conntrack.Tables) error {
		var err error
		res.Confirmed, res.Unconfirmed, err = tb.Count()
		res.ConfirmedSize = int(tb.Main.MaxEntries())
		return err
	}); err != nil {
		return nil, nil, err
	}
	res.Evicted = conntrack.Evicted(after, res.Unconfirmed)
	res.KeptThrough = cb.alive(entry)

	t1, b1 := time.Now(), tr.sent.Load()
	for i := 0; i < ctRestarts; i++ {
		time.Sleep(2 * time.Second)
		t := time.Now()
		cb.stopCt()
		if err := cb.start(); err != nil {
			return nil, nil, err
		}
		res.Restarts = append(res.Restarts, time.Since(t).Seconds())
	}
	time.Sleep(2 * time.Second)
	res.RestartMbps = float64(tr.sent.Load()-b1) * 8 / 1e6 / time.Since(t1).Seconds()
	res.KeptRestarts = cb.alive(entry)
	res.Sent, res.Received, err = tr.finish()
	if err != nil {
		res.TransferErr = err.Error()
	}
	if res.CountersAfter, err = cb.counters(); err != nil {
		return nil, nil, err
	}

	yes := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	t := &report.Table{
		Title:   "conntrack: a million flows and restarts under a TCP transfer",
		Columns: []string{"what", "value"},
		Notes: []string{fmt.Sprintf("Default tables (%d confirmed, 65,536 unconfirmed), XDP on r1 of h1 — r1 — h2. A TCP transfer h1 → h2 (a Go writer and reader, checked byte for byte) through all of it; during it, %d UDP flows from h1 (%d source × %d destination ports, one datagram each, one socket each), each echoed by h2, then %d stops and starts of `conntrack run`, 2 s apart. Counters are over the flood.",
			res.ConfirmedSize, ctFlows, ctSrcPorts, ctDstPorts, ctRestarts)},
	}
	t.Add("UDP flows sent", fmt.Sprint(ctFlows))
	t.Add("flood duration (s)", res.FloodSeconds)
	t.Add("connections created (new)", fmt.Sprint(res.Counters["new"]))
	t.Add("confirmed (established)", fmt.Sprint(res.Counters["established"]))
	t.Add("replies refused, confirmed table full (table_full)", fmt.Sprint(res.Counters["table_full"]))
	t.Add("unconfirmed evicted by the LRU", fmt.Sprint(res.Evicted))
	t.Add("replies refused after their entry's eviction (policy_drop)", fmt.Sprint(res.Counters["policy_drop"]))
	t.Add("confirmed entries after the flood", fmt.Sprintf("%d of %d", res.Confirmed, res.ConfirmedSize))
	t.Add("transfer during the flood (Mbit/s)", res.FloodMbps)
	t.Add("the transfer's entry after the flood", keptText(res.KeptThrough))
	t.Goal(report.AtLeast("kept", yes(res.KeptThrough), 1))
	for i, r := range res.Restarts {
		t.Add(fmt.Sprintf("restart %d: stop to attached again (s)", i+1), r)
	}
	t.Add("transfer during the restarts (Mbit/s)", res.RestartMbps)
	t.Add("the transfer's entry after the restarts", keptText(res.KeptRestarts))
	t.Goal(report.AtLeast("kept", yes(res.KeptRestarts), 1))
	ok := res.TransferErr == "" && res.Sent == res.Received && res.Sent > 0
	t.Add("transfer complete: every byte once, in order, no reset", keptText(ok))
	t.Goal(report.AtLeast("complete", yes(ok), 1))
	t.Add("bytes sent / received", fmt.Sprintf("%d / %d", res.Sent, res.Received))
	return []*report.Table{t}, res, nil
}

func keptText(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// start runs conntrack on r1 (XDP, default tables) as `flowplane conntrack run` does.
func (cb *ctBench) start() error {
	cfg := &conntrack.Config{Hook: conntrack.HookXDP, Inside: []string{cb.in}, Outside: []string{cb.out}}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- nsrun.Do(cb.l.Netns("r1"), func() error { return conntrack.Serve(ctx, cfg, "", func() { close(ready) }) })
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		return fmt.Errorf("conntrack run: %w", err)
	}
	cb.stopCt = func() {
		cancel()
		if err := <-done; err != nil {
			slog.Warn("conntrack run", "err", err)
		}
	}
	return nil
}

func (cb *ctBench) tables(fn func(*conntrack.Tables) error) error {
	return nsrun.Do(cb.l.Netns("r1"), func() error {
		tb, err := conntrack.OpenPinned()
		if err != nil {
			return err
		}
		defer tb.Close()
		return fn(tb)
	})
}

func (cb *ctBench) counters() (conntrack.Counters, error) {
	var c conntrack.Counters
	err := cb.tables(func(tb *conntrack.Tables) error {
		var err error
		c, err = tb.ReadCounters()
		return err
	})
	return c, err
}

// sinkEntry is the confirmed TCP entry towards h2's sink port.
func (cb *ctBench) sinkEntry() (conntrack.Entry, error) {
	var found conntrack.Entry
	err := cb.tables(func(tb *conntrack.Tables) error {
		es, err := tb.List()
		for _, e := range es {
			if e.Proto == "tcp" && e.Confirmed && e.Orig.Dst == cb.h2 && e.Orig.Dport == ctSinkPort {
				found = e
			}
		}
		return err
	})
	return found, err
}

// alive: e's connection still has its entry, ESTABLISHED, and counted packets since e.
func (cb *ctBench) alive(e conntrack.Entry) bool {
	ok := false
	_ = cb.tables(func(tb *conntrack.Tables) error {
		es, err := tb.List()
		for _, x := range es {
			if x.Proto == "tcp" && x.Orig == e.Orig && x.State == "ESTABLISHED" && x.Packets[0] > e.Packets[0] {
				ok = true
			}
		}
		return err
	})
	return ok
}

// udpEcho answers datagrams on h2's ctDstPorts echo ports.
func (cb *ctBench) udpEcho() (func(), error) {
	var conns []net.PacketConn
	stop := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	err := nsrun.Do(cb.l.Netns("h2"), func() error {
		for p := ctDstBase; p < ctDstBase+ctDstPorts; p++ {
			pc, err := net.ListenPacket("udp4", fmt.Sprintf(":%d", p))
			if err != nil {
				return err
			}
			conns = append(conns, pc)
		}
		return nil
	})
	if err != nil {
		stop()
		return nil, err
	}
	for _, pc := range conns {
		go func() {
			buf := make([]byte, 64)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(buf[:n], from)
			}
		}()
	}
	return stop, nil
}

// flood sends ctFlows one-datagram UDP flows from h1 to h2's echo ports, each from its own
// socket bound to its own (source port, destination port) pair.
func (cb *ctBench) flood() error {
	dst := cb.h2.As4()
	return nsrun.Do(cb.l.Netns("h1"), func() error {
		for i := 0; i < ctFlows; i++ {
			sport, dport := ctSrcBase+i%ctSrcPorts, ctDstBase+i/ctSrcPorts%ctDstPorts
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("socket: %w", err)
			}
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			if err := unix.Bind(fd, &unix.SockaddrInet4{Port: sport}); err != nil {
				unix.Close(fd)
				return fmt.Errorf("bind port %d: %w", sport, err)
			}
			err = unix.Sendto(fd, []byte("q"), 0, &unix.SockaddrInet4{Port: dport, Addr: dst})
			unix.Close(fd)
			if err != nil && !errors.Is(err, unix.ECONNREFUSED) && !errors.Is(err, unix.ENOBUFS) {
				return fmt.Errorf("send: %w", err)
			}
		}
		return nil
	})
}

// ctTransfer is a TCP stream from h1 to h2's sink: the writer sends a pattern until finish, the
// sink checks it and counts.
type ctTransfer struct {
	ln       net.Listener
	conn     net.Conn
	sent     atomic.Int64
	stop     chan struct{}
	wrote    chan error
	received chan ctReceived
}

type ctReceived struct {
	n   int64
	err error
}

var ctPattern = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}()

func (cb *ctBench) transfer() (*ctTransfer, error) {
	tr := &ctTransfer{stop: make(chan struct{}), wrote: make(chan error, 1), received: make(chan ctReceived, 1)}
	if err := nsrun.Do(cb.l.Netns("h2"), func() error {
		var err error
		tr.ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", ctSinkPort))
		return err
	}); err != nil {
		return nil, err
	}
	go func() {
		c, err := tr.ln.Accept()
		if err != nil {
			tr.received <- ctReceived{err: err}
			return
		}
		defer c.Close()
		buf := make([]byte, len(ctPattern))
		var n int64
		for {
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			k, err := c.Read(buf)
			for i := 0; i < k; i++ {
				if buf[i] != ctPattern[(n+int64(i))%int64(len(ctPattern))] {
					tr.received <- ctReceived{n: n, err: fmt.Errorf("byte %d differs from what was sent", n+int64(i))}
					return
				}
			}
			n += int64(k)
			if errors.Is(err, io.EOF) {
				tr.received <- ctReceived{n: n}
				return
			}
			if err != nil {
				tr.received <- ctReceived{n: n, err: err}
				return
			}
		}
	}()
	if err := nsrun.Do(cb.l.Netns("h1"), func() error {
		var err error
		tr.conn, err = net.DialTimeout("tcp4", net.JoinHostPort(cb.h2.String(), fmt.Sprint(ctSinkPort)), 5*time.Second)
		return err
	}); err != nil {
		tr.ln.Close()
		return nil, err
	}
	go func() {
		for {
			select {
			case <-tr.stop:
				tr.wrote <- tr.conn.(*net.TCPConn).CloseWrite()
				return
			default:
			}
			_ = tr.conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
			k, err := tr.conn.Write(ctPattern)
			tr.sent.Add(int64(k))
			if err != nil {
				tr.wrote <- err
				return
			}
		}
	}()
	return tr, nil
}

// finish stops the writer and returns what was sent and received, and the first error.
func (tr *ctTransfer) finish() (sent, received int64, err error) {
	close(tr.stop)
	werr := <-tr.wrote
	r := <-tr.received
	return tr.sent.Load(), r.n, errors.Join(werr, r.err)
}

func (tr *ctTransfer) close() {
	tr.conn.Close()
	tr.ln.Close()
}
