package conntrack

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/nsrun"
)

// stream is a TCP transfer from h1 to h2's echo listener through r1: a writer sending a
// pattern until stopped, a reader checking the echo. written and read count bytes; done gets
// the writer's and the reader's end, nil or their error (a RST shows as ECONNRESET).
type stream struct {
	conn    net.Conn
	stop    chan struct{}
	written atomic.Int64
	read    atomic.Int64
	done    chan error
}

// pattern is what the stream sends, over and over: a missing or repeated byte shows in the echo.
var pattern = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}()

func (c *ctLab) startStream(t *testing.T, port string) *stream {
	t.Helper()
	conn, err := c.dial("h1", "tcp", net.JoinHostPort(c.h2, port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s := &stream{conn: conn, stop: make(chan struct{}), done: make(chan error, 2)}
	go func() {
		for {
			select {
			case <-s.stop:
				s.done <- conn.(*net.TCPConn).CloseWrite()
				return
			default:
			}
			_ = conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
			n, err := conn.Write(pattern)
			s.written.Add(int64(n))
			if err != nil {
				s.done <- err
				return
			}
		}
	}()
	go func() {
		buf := make([]byte, len(pattern))
		var off int64
		for {
			_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
			n, err := conn.Read(buf)
			for i := 0; i < n; i++ {
				if buf[i] != pattern[(off+int64(i))%int64(len(pattern))] {
					s.done <- errors.New("the echo differs from what was sent")
					return
				}
			}
			off += int64(n)
			s.read.Store(off)
			if errors.Is(err, io.EOF) {
				s.done <- nil
				return
			}
			if err != nil {
				s.done <- err
				return
			}
		}
	}()
	return s
}

// moving waits until the stream's echo grows by at least n bytes.
func (s *stream) moving(t *testing.T, n int64) {
	t.Helper()
	from := s.read.Load()
	eventually(t, "the transfer moves", func() bool { return s.read.Load() >= from+n })
}

// finish stops the writer and waits for the echo of everything written.
func (s *stream) finish(t *testing.T) {
	t.Helper()
	close(s.stop)
	for i := 0; i < 2; i++ {
		if err := <-s.done; err != nil {
			t.Fatalf("transfer: %v (written %d, echoed %d)", err, s.written.Load(), s.read.Load())
		}
	}
	if w, r := s.written.Load(), s.read.Load(); w != r || w == 0 {
		t.Fatalf("written %d bytes, echoed %d", w, r)
	}
}

// TestLabRestartUnderTraffic: `conntrack run` stopped and started again while a TCP transfer
// goes through r1 (the kernel forwards it meanwhile) keeps the connection: every byte arrives
// once, in order, no RST, and the restarted run forwards it again on its old entry.
func TestLabRestartUnderTraffic(t *testing.T) {
	t.Parallel()
	for _, hook := range []string{HookXDP, HookTC} {
		t.Run(hook, func(t *testing.T) {
			t.Parallel()
			c := newCtLab(t, &Config{Hook: hook})
			c.listen("h2", 8080)
			s := c.startStream(t, "8080")
			s.moving(t, 1<<20)
			sport := uint16(s.conn.LocalAddr().(*net.TCPAddr).Port)
			before := find(c.entries(), "tcp", c.h1, sport, 8080)
			if before == nil || before.State != "ESTABLISHED" {
				t.Fatalf("entry before the restart: %+v", before)
			}
			// A second run beside this one is refused before it writes into the shared tables
			// (a restart's resync would make the live connection liberal).
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := c.run(ctx, nil)
			cancel()
			if cli.ExitCode(err) != 2 {
				t.Fatalf("a second run while one runs: %v (exit %d), want a usage error", err, cli.ExitCode(err))
			}
			if e := find(c.entries(), "tcp", c.h1, sport, 8080); e == nil || e.raw.Tcp[0].Flags&uint8(ctCtTcpFlagCT_TCP_F_BE_LIBERAL) != 0 {
				t.Fatalf("the refused run changed the running one's entry: %+v", e)
			}
			for i := 0; i < 3; i++ {
				c.stop()
				s.moving(t, 1<<20) // the kernel forwards, untracked
				c.start()
				cs := c.counters()
				s.moving(t, 4<<20)
				if d := diff(cs, c.counters()); d["forwarded"] < 100 {
					t.Fatalf("restart %d: conntrack forwarded %d packets of the transfer after it: %v", i, d["forwarded"], d)
				}
			}
			s.finish(t)
			after := find(c.entries(), "tcp", c.h1, sport, 8080)
			// The same entry, counting on (a new one, picked up, would start from 1).
			if after == nil || after.Packets[0] <= before.Packets[0] || after.Packets[1] <= before.Packets[1] {
				t.Errorf("entry after the restarts: %+v, before: %+v", after, before)
			}
		})
	}
}

// udpFlows sends one datagram from each of n new sockets of node to addr (a new flow each:
// its own source port) and closes them.
func (c *ctLab) udpFlows(t *testing.T, node, addr string, n int) {
	t.Helper()
	err := nsrun.Do(c.l.Netns(node), func() error {
		for i := 0; i < n; i++ {
			conn, err := net.Dial("udp", addr)
			if err != nil {
				return err
			}
			_, _ = conn.Write([]byte("q"))
			conn.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLabTableFull: more flows than the tables hold, while a TCP transfer runs. A flood of
// unanswered UDP flows churns the unconfirmed LRU (its evictions counted); answered ones fill
// the confirmed table, after which new connections are refused (table_full) as nf_conntrack
// refuses them when full, and none of it touches the established transfer: its entry stays
// and every byte arrives. When the flood's entries expire, new connections open again.
func TestLabTableFull(t *testing.T) {
	t.Parallel()
	const confirmed, unconfirmed, flows = 512, 256, 2000
	cfg := &Config{Timeouts: map[string]string{"udp_unreplied": "10s", "udp_stream": "10s"}}
	cfg.Table.Confirmed, cfg.Table.Unconfirmed = confirmed, unconfirmed
	c := newCtLab(t, cfg)
	c.listen("h2", 8080)
	c.udpEcho("h2", 5353)
	s := c.startStream(t, "8080")
	s.moving(t, 1<<20)
	sport := uint16(s.conn.LocalAddr().(*net.TCPAddr).Port)
	before := c.counters()

	c.udpFlows(t, "h1", net.JoinHostPort(c.h2, "9"), flows)    // unanswered: the LRU churns
	c.udpFlows(t, "h1", net.JoinHostPort(c.h2, "5353"), flows) // answered: ct_main fills
	// On a loaded machine the echo server can drop part of the burst (its socket's buffer
	// fills) and the first entries time out after 10 s: answered flows go on in rounds until
	// the table holds all it can.
	eventuallyWithin(t, time.Minute, "the confirmed table full", func() bool {
		if n, _, err := c.tables().Count(); err == nil && n == confirmed {
			return true
		}
		c.udpFlows(t, "h1", net.JoinHostPort(c.h2, "5353"), confirmed/4)
		return false
	})
	if conn, err := c.dial("h1", "tcp", net.JoinHostPort(c.h2, "8080"), time.Second); err == nil {
		conn.Close()
		t.Error("a new connection opened through a full table")
	}
	s.moving(t, 1<<20)
	_, unconf, err := c.tables().Count()
	if err != nil {
		t.Fatal(err)
	}
	after := c.counters()
	d := diff(before, after)
	t.Logf("after %d unanswered and %d answered flows: counters %v, evicted %d", flows, flows, d, Evicted(after, unconf))
	if d["table_full"] == 0 || Evicted(after, unconf) < flows-unconfirmed {
		t.Errorf("table_full %d, evicted %d: want the refusals and the LRU's evictions counted", d["table_full"], Evicted(after, unconf))
	}
	if e := find(c.entries(), "tcp", c.h1, sport, 8080); e == nil || e.State != "ESTABLISHED" {
		t.Errorf("the transfer's entry after the flood: %+v", e)
	}
	// The flood's entries time out 10 s after its last packet, on a machine other tests load.
	eventuallyWithin(t, time.Minute, "a new connection once the flood's entries expired", func() bool {
		conn, err := c.dial("h1", "tcp", net.JoinHostPort(c.h2, "8080"), time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	s.finish(t)
}
