package tcp

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/vnet/clock"
	"github.com/flowplane/flowplane/internal/vnet/ipv4"
)

// testNet is a deterministic network of hosts on a virtual clock. Every packet goes through
// filter, which a test scripts to drop, duplicate, delay or corrupt specific segments.
type testNet struct {
	t      *testing.T
	clk    *clock.Virtual
	hosts  map[netip.Addr]*testHost
	delay  time.Duration
	rng    *rand.Rand
	loss   float64 // probability, applied to every packet
	dup    float64
	reord  float64 // probability a packet gets an extra delay
	filter func(from netip.Addr, s *Segment) action
	sent   []Segment // every segment handed to the network, for assertions
	keep   bool
	rate   float64 // bytes per second, 0: unlimited
	busy   time.Duration
}

type action int

const (
	pass action = iota
	drop
	duplicate
)

type testHost struct {
	n    *testNet
	addr netip.Addr
	mtu  int
	mux  *Mux
}

func (h *testHost) Clock() clock.Clock { return h.n.clk }
func (h *testHost) MTU(netip.Addr) int { return h.mtu }
func (h *testHost) Output(pkt []byte) {
	n := h.n
	p := append([]byte(nil), pkt...)
	ih, payload, err := ipv4.Parse(p)
	if err != nil {
		n.t.Fatalf("host %v sent a bad IP packet: %v", h.addr, err)
	}
	seg, err := Parse(payload, ih.Src.As4(), ih.Dst.As4())
	if err != nil {
		n.t.Fatalf("host %v sent a bad TCP segment: %v", h.addr, err)
	}
	if n.keep {
		n.sent = append(n.sent, seg) // payload aliases a private copy
	}
	act := pass
	if n.filter != nil {
		act = n.filter(h.addr, &seg)
	}
	if act == drop || (n.loss > 0 && n.rng.Float64() < n.loss) {
		return
	}
	copies := 1
	if act == duplicate || (n.dup > 0 && n.rng.Float64() < n.dup) {
		copies = 2
	}
	dst := n.hosts[ih.Dst]
	if dst == nil {
		return
	}
	d := n.delay
	if n.rate > 0 {
		now := n.clk.Now()
		start := max(now, n.busy)
		n.busy = start + time.Duration(float64(len(p))/n.rate*float64(time.Second))
		d += n.busy - now
	}
	if n.reord > 0 && n.rng.Float64() < n.reord {
		d += n.delay
	}
	for range copies {
		n.clk.AfterFunc(d, func() { dst.mux.Input(ih.Src, ih.Dst, payload, nil) })
	}
}

func newTestNet(t *testing.T, cfg Config) (*testNet, *testHost, *testHost) {
	n := &testNet{t: t, clk: clock.NewVirtual(), hosts: map[netip.Addr]*testHost{}, delay: 5 * time.Millisecond,
		rng: rand.New(rand.NewPCG(42, 7))}
	a := n.add("198.18.0.1", cfg)
	b := n.add("198.18.0.2", cfg)
	return n, a, b
}

func (n *testNet) add(addr string, cfg Config) *testHost {
	h := &testHost{n: n, addr: netip.MustParseAddr(addr), mtu: 1500}
	h.mux = NewMux(h, cfg)
	n.hosts[h.addr] = h
	return h
}

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.SendBuf, cfg.RecvBuf = 256<<10, 256<<10
	seed := uint32(1000)
	cfg.ISN = func() uint32 { seed += 7919; return seed }
	return cfg
}

// run advances virtual time until cond holds, failing after limit.
func (n *testNet) run(limit time.Duration, what string, cond func() bool) {
	n.t.Helper()
	if !n.clk.RunUntil(limit, cond) {
		n.t.Fatalf("%s: not done after %v of virtual time", what, limit)
	}
}

// connect opens a connection from a to b:80 and returns both ends.
func connect(t *testing.T, n *testNet, a, b *testHost) (*Conn, *Conn) {
	t.Helper()
	l, err := b.mux.Listen(b.addr, 80)
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.mux.Dial(a.addr, 0, b.addr, 80)
	if err != nil {
		t.Fatal(err)
	}
	var s *Conn
	n.run(10*time.Second, "handshake", func() bool {
		if s == nil {
			s, _ = l.Accept()
		}
		ok, _ := c.Established()
		return s != nil && ok
	})
	return c, s
}

// transfer writes data on w and reads it on r, driving the clock; it returns what r read.
func transfer(t *testing.T, n *testNet, w, r *Conn, data []byte, limit time.Duration) []byte {
	t.Helper()
	var got bytes.Buffer
	off := 0
	buf := make([]byte, 64<<10)
	closed := false
	n.run(limit, "transfer", func() bool {
		for off < len(data) {
			k, err := w.Write(data[off:])
			if errors.Is(err, ErrWouldBlock) {
				break
			}
			if err != nil {
				t.Fatalf("write: %v", err)
			}
			off += k
		}
		if off == len(data) && !closed {
			closed = true
			if err := w.CloseWrite(); err != nil {
				t.Fatalf("close write: %v", err)
			}
		}
		return drain(t, r, buf, &got)
	})
	return got.Bytes()
}

// drain reads what r has into got; it reports whether the peer's FIN has been read.
func drain(t *testing.T, r *Conn, buf []byte, got *bytes.Buffer) bool {
	t.Helper()
	for {
		k, err := r.Read(buf)
		got.Write(buf[:k])
		if err == io.EOF {
			return true
		}
		if errors.Is(err, ErrWouldBlock) {
			return false
		}
		if err != nil {
			t.Fatalf("read: %v", err)
		}
	}
}

func randomData(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func sameData(t *testing.T, got, want []byte) {
	t.Helper()
	if len(got) != len(want) || sha256.Sum256(got) != sha256.Sum256(want) {
		t.Fatalf("received %d bytes, sent %d, or contents differ", len(got), len(want))
	}
}
