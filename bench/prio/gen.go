package main

// The load generator, run by the bench inside the lab's namespaces (and the senders inside the
// prio host cgroup) as `prio gen sink|long|fct`: it reuses tune's RPC framing (a request of N
// bytes answered by a 1-byte reply; a stream of bytes discarded).

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/tune/rpc"
)

// LongResult is what `gen long` prints: each flow's goodput over the measured window.
type LongResult struct {
	Seconds  float64   `json:"seconds"`
	Bps      []float64 `json:"bps"`       // per flow: bytes acknowledged in the window × 8 / seconds
	Retrans  uint64    `json:"retrans"`   // segments retransmitted in the window, all flows
	DataSegs uint64    `json:"data_segs"` // data segments sent in the window, all flows
	Dups     uint64    `json:"dups"`      // segments the receivers got twice (DSACK): capacity wasted
	Failed   int       `json:"failed"`
}

// Flow is one FCT flow, one JSON line of `gen fct`'s output.
type Flow struct {
	Size    int     `json:"size"`
	StartMs float64 `json:"start_ms"` // since the generator started
	FCTMs   float64 `json:"fct_ms"`   // 0 if it did not finish
	Dst     string  `json:"dst"`
	Done    bool    `json:"done"`
}

func genMain(args []string) error {
	if len(args) == 0 {
		return errors.New("gen: want sink, long or fct")
	}
	fs := flag.NewFlagSet("gen "+args[0], flag.ContinueOnError)
	dsts := fs.String("dst", "", "receivers host:port, comma-separated")
	listen := fs.String("listen", ":5500", "sink: address")
	n := fs.Int("n", 20, "long: flows")
	at := fs.Int64("at", 0, "long: the window's start, Unix ms (the same on every sender, so their windows align)")
	d := fs.Duration("d", 60*time.Second, "long: measured window; fct: arrival period")
	cdfFile := fs.String("cdf", "", "fct: flow-size CDF file")
	limit := fs.Float64("cap", 0, "fct: largest flow size, bytes")
	load := fs.Float64("load", 0.5, "fct: offered load, share of -rate")
	rate := fs.Float64("rate", 100e6, "fct: link rate, bit/s")
	bg := fs.Int("bg", 0, "fct: long-lived background flows")
	drain := fs.Duration("drain", 30*time.Second, "fct: how long flows may run after arrivals stop")
	seed := fs.Uint64("seed", 1, "fct: random seed")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	addrs := strings.Split(*dsts, ",")
	switch args[0] {
	case "sink":
		return rpc.Main([]string{"server", "-addr", *listen})
	case "long":
		return json.NewEncoder(os.Stdout).Encode(longFlows(addrs, *n, time.UnixMilli(*at), *d))
	case "fct":
		c, err := LoadCDF(*cdfFile, *cdfFile, *limit)
		if err != nil {
			return err
		}
		return fctFlows(addrs, c, *load, *rate, *d, *drain, *bg, *seed)
	}
	return fmt.Errorf("gen: unknown mode %q", args[0])
}

// tcpInfo is c's TCP_INFO (zero if it cannot be read): bytes acknowledged are the goodput
// counter, segments retransmitted against data segments sent what losses and reordering cost.
func tcpInfo(c net.Conn) unix.TCPInfo {
	var info unix.TCPInfo
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return info
	}
	_ = raw.Control(func(fd uintptr) {
		if i, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			info = *i
		}
	})
	return info
}

// longFlows runs n streams spread over the receivers, each writing as fast as TCP takes it,
// and reports each one's goodput between at and at+d.
func longFlows(addrs []string, n int, at time.Time, d time.Duration) LongResult {
	res := LongResult{Seconds: d.Seconds(), Bps: make([]float64, 0, n)}
	conns := make([]net.Conn, 0, n)
	for i := range n {
		c, err := openRetry(addrs[i%len(addrs)])
		if err != nil {
			res.Failed++
			continue
		}
		conns = append(conns, c)
	}
	buf := make([]byte, 64<<10)
	for _, c := range conns {
		go func() {
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(time.Until(at))
	before := make([]unix.TCPInfo, len(conns))
	for i, c := range conns {
		before[i] = tcpInfo(c)
	}
	time.Sleep(time.Until(at.Add(d)))
	for i, c := range conns {
		a := tcpInfo(c)
		res.Bps = append(res.Bps, float64(a.Bytes_acked-before[i].Bytes_acked)*8/d.Seconds())
		res.Retrans += uint64(a.Total_retrans - before[i].Total_retrans)
		res.DataSegs += uint64(a.Data_segs_out - before[i].Data_segs_out)
		res.Dups += uint64(a.Dsack_dups - before[i].Dsack_dups)
	}
	for _, c := range conns {
		abort(c)
	}
	return res
}

// abort closes c and discards what it has not sent: a plain close would leave the kernel
// sending megabytes of orphaned buffers through the next run's bottleneck.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// openRetry opens a stream, retrying while the accept queue of a 1000-flow start overflows.
func openRetry(addr string) (net.Conn, error) {
	var err error
	for try := 0; try < 10; try++ {
		var c net.Conn
		if c, err = rpc.OpenStream(addr, 5*time.Second); err == nil {
			return c, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, err
}

// fctFlows starts flows with sizes from c at Poisson arrivals that offer load × rate, each on
// an idle persistent connection to a random receiver (a new one when none is idle), for d;
// waits up to drain for the last ones; prints one Flow per line.
func fctFlows(addrs []string, c *CDF, load, rate float64, d, drain time.Duration, bg int, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	meanGap := c.Mean() * 8 / (load * rate) // seconds between arrivals
	idle := map[string]chan net.Conn{}
	for _, a := range addrs {
		idle[a] = make(chan net.Conn, 4096)
	}
	for i := range bg {
		s, err := openRetry(addrs[i%len(addrs)])
		if err != nil {
			return fmt.Errorf("background flow: %w", err)
		}
		defer abort(s)
		go func() {
			buf := make([]byte, 64<<10)
			for {
				if _, err := s.Write(buf); err != nil {
					return
				}
			}
		}()
	}
	var mu sync.Mutex
	var flows []*Flow
	var wg sync.WaitGroup
	start := time.Now()
	next := start
	for time.Since(start) < d {
		next = next.Add(time.Duration(r.ExpFloat64() * meanGap * float64(time.Second)))
		time.Sleep(time.Until(next))
		f := &Flow{Size: c.Sample(r), Dst: addrs[r.IntN(len(addrs))], StartMs: ms(time.Since(start))}
		mu.Lock()
		flows = append(flows, f)
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			var conn net.Conn
			select {
			case conn = <-idle[f.Dst]:
			default:
				var err error
				if conn, err = net.DialTimeout("tcp", f.Dst, 5*time.Second); err != nil {
					return
				}
			}
			_ = conn.SetDeadline(start.Add(d + drain))
			if err := rpc.Exchange(conn, f.Size, 1); err != nil {
				abort(conn)
				return
			}
			mu.Lock()
			f.FCTMs, f.Done = ms(time.Since(t0)), true
			mu.Unlock()
			select {
			case idle[f.Dst] <- conn:
			default:
				conn.Close()
			}
		}()
	}
	wg.Wait()
	for _, pool := range idle {
		close(pool)
		for c := range pool {
			abort(c)
		}
	}
	enc := json.NewEncoder(os.Stdout)
	mu.Lock()
	defer mu.Unlock()
	for _, f := range flows {
		if err := enc.Encode(f); err != nil {
			return err
		}
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
