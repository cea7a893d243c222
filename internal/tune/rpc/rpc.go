// Package rpc is a small RPC load generator for the tune benchmark and tests: a server that
// answers framed requests (or sinks a stream), clients that run back-to-back RPCs on new
// connections and a streaming flow, and a connection setup loop, reporting JSON. It runs as a
// child process (Main) so it can be started inside a lab namespace and a tuned cgroup.
package rpc

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// sink as the response size turns a connection into a discard stream.
const sink = 0xFFFFFFFF

// header precedes each request: request bytes that follow, response bytes wanted.
type header struct{ Req, Resp uint32 }

// Serve answers requests on ln until it fails.
func Serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go serveConn(c)
	}
}

func serveConn(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 256<<10)
	var hb [8]byte
	for {
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			return
		}
		h := header{binary.BigEndian.Uint32(hb[:4]), binary.BigEndian.Uint32(hb[4:])}
		if h.Resp == sink {
			_, _ = io.CopyBuffer(io.Discard, c, buf)
			return
		}
		if _, err := io.CopyBuffer(io.Discard, io.LimitReader(c, int64(h.Req)), buf); err != nil {
			return
		}
		for left := int(h.Resp); left > 0; {
			n, err := c.Write(buf[:min(left, len(buf))])
			if err != nil {
				return
			}
			left -= n
		}
	}
}

// Call runs one RPC on a new connection: connect, send req bytes, read resp bytes, close.
// The latency includes the handshake.
func Call(addr string, req, resp int, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(start.Add(timeout))
	if err := send(c, req, uint32(resp)); err != nil {
		return 0, err
	}
	if _, err := io.CopyN(io.Discard, c, int64(resp)); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

var zeros = make([]byte, 256<<10)

// Exchange runs one RPC on an open connection c (persistent connections): send req bytes,
// read resp bytes.
func Exchange(c net.Conn, req, resp int) error {
	if err := send(c, req, uint32(resp)); err != nil {
		return err
	}
	_, err := io.CopyN(io.Discard, c, int64(resp))
	return err
}

// OpenStream connects to a server and turns the connection into a discard stream: whatever is
// written to it is read and dropped until it closes.
func OpenStream(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	var hb [8]byte
	binary.BigEndian.PutUint32(hb[4:], sink)
	if _, err := c.Write(hb[:]); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func send(c net.Conn, req int, resp uint32) error {
	var hb [8]byte
	binary.BigEndian.PutUint32(hb[:4], uint32(req))
	binary.BigEndian.PutUint32(hb[4:], resp)
	if _, err := c.Write(hb[:]); err != nil {
		return err
	}
	for left := req; left > 0; {
		n, err := c.Write(zeros[:min(left, len(zeros))])
		if err != nil {
			return err
		}
		left -= n
	}
	return nil
}

// Class is what one kind of flow achieved.
type Class struct {
	Calls     int       `json:"calls"`
	Errors    int       `json:"errors"`
	Bytes     int64     `json:"bytes"`
	Latencies []float64 `json:"latencies_ms,omitempty"`
}

// Result is one client process's report.
type Result struct {
	Seconds float64 `json:"seconds"`
	Large   Class   `json:"large"`            // back-to-back large RPCs
	Small   Class   `json:"small"`            // back-to-back small RPCs
	Stream  Class   `json:"stream"`           // the streaming flow
	Connect Class   `json:"connect"`          // connections set up (SetupLoop)
	CPUNs   int64   `json:"cpu_ns,omitempty"` // SetupLoop: the loop thread's user+system time
}

// Percentile returns the p-th percentile (0-100) of sorted latencies, nearest rank.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p/100*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Mix runs x back-to-back large RPC loops, one streaming flow and small RPC loops for d. A
// small loop starts an RPC every smallGap (at once when the previous one took longer; 0 means
// back-to-back), so its offered load does not depend on how fast its RPCs complete.
func Mix(addr string, x, smallLoops, large, small int, stream bool, smallGap, d time.Duration) Result {
	var mu sync.Mutex
	var res Result
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	loop := func(cl *Class, size int, keep bool, gap time.Duration) {
		defer wg.Done()
		next := time.Now()
		for time.Now().Before(deadline) {
			if gap > 0 {
				time.Sleep(time.Until(next))
				next = next.Add(gap)
				if now := time.Now(); next.Before(now) {
					next = now
				}
			}
			lat, err := Call(addr, size, 64, 10*time.Second)
			mu.Lock()
			if err != nil {
				cl.Errors++
			} else {
				cl.Calls++
				cl.Bytes += int64(size)
				if keep {
					cl.Latencies = append(cl.Latencies, float64(lat.Microseconds())/1000)
				}
			}
			mu.Unlock()
		}
	}
	for i := 0; i < x; i++ {
		wg.Add(1)
		go loop(&res.Large, large, false, 0)
	}
	for i := 0; i < smallLoops; i++ {
		wg.Add(1)
		go loop(&res.Small, small, true, smallGap)
	}
	if stream {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := OpenStream(addr, 5*time.Second)
			if err != nil {
				mu.Lock()
				res.Stream.Errors++
				mu.Unlock()
				return
			}
			defer c.Close()
			_ = c.SetDeadline(deadline)
			var n int64
			for time.Now().Before(deadline) {
				k, err := c.Write(zeros[:64<<10])
				n += int64(k)
				if err != nil {
					break
				}
			}
			mu.Lock()
			res.Stream.Bytes, res.Stream.Calls = n, 1
			mu.Unlock()
		}()
	}
	start := time.Now()
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	sort.Float64s(res.Small.Latencies)
	return res
}

// SetupLoop measures connection setup alone, as the kernel does it: for d, one thread opens a
// connection to a listener of its own on 127.0.0.1, accepts it, and closes both ends (with
// SO_LINGER 0, so nothing piles up in TIME_WAIT). Nothing else runs per connection: no
// scheduler wake-ups (on loopback the handshake completes inside connect), no runtime poller.
// It reports the connections, the wall time and the thread's CPU time (softirq work the loop
// causes runs on, and is charged to, this thread; steal is not).
func SetupLoop(d time.Duration) (Result, error) {
	var res Result
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return res, fmt.Errorf("listen socket: %w", err)
	}
	defer unix.Close(ln)
	sa := &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
	if err := unix.Bind(ln, sa); err != nil {
		return res, fmt.Errorf("bind 127.0.0.1: %w", err)
	}
	if err := unix.Listen(ln, 128); err != nil {
		return res, fmt.Errorf("listen: %w", err)
	}
	name, err := unix.Getsockname(ln)
	if err != nil {
		return res, err
	}
	sa.Port = name.(*unix.SockaddrInet4).Port
	one := func() error {
		c, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(c)
		if err := unix.SetsockoptLinger(c, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1}); err != nil {
			return err
		}
		if err := unix.Connect(c, sa); err != nil {
			return err
		}
		a, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
		if err != nil {
			return err
		}
		return unix.Close(a)
	}
	var before, after unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &before); err != nil {
		return res, err
	}
	start := time.Now()
	for time.Since(start) < d {
		if err := one(); err != nil {
			return res, fmt.Errorf("connection %d: %w", res.Connect.Calls+1, err)
		}
		res.Connect.Calls++
	}
	res.Seconds = time.Since(start).Seconds()
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &after); err != nil {
		return res, err
	}
	res.CPUNs = after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano()
	return res, nil
}

// Main runs the load generator as a command: rpc server ADDR | rpc mix … | rpc setup -d D.
// It prints a Result as JSON for the client modes.
func Main(args []string) error {
	if len(args) == 0 {
		return errors.New("rpc: want server, mix or setup")
	}
	fs := flag.NewFlagSet("rpc "+args[0], flag.ContinueOnError)
	addr := fs.String("addr", "", "server address host:port")
	x := fs.Int("x", 1, "back-to-back large RPC loops")
	smallLoops := fs.Int("small-loops", 2, "back-to-back small RPC loops")
	large := fs.Int("large", 1<<20, "large RPC request bytes")
	small := fs.Int("small", 10<<10, "small RPC request bytes")
	stream := fs.Bool("stream", true, "run one streaming flow")
	dur := fs.Duration("d", 5*time.Second, "duration")
	smallGap := fs.Duration("small-gap", 0, "interval between small RPC starts per loop (0: back-to-back)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "server":
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			return err
		}
		fmt.Println("listening")
		return Serve(ln)
	case "mix":
		return json.NewEncoder(os.Stdout).Encode(Mix(*addr, *x, *smallLoops, *large, *small, *stream, *smallGap, *dur))
	case "setup":
		res, err := SetupLoop(*dur)
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	return fmt.Errorf("rpc: unknown mode %q", args[0])
}
