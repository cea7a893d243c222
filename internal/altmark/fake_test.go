package altmark

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// memDatapath is an in-memory implementation of the Datapath seam: period n gives every
// point a count derived from n, and two samples, so tests can check what was recorded.
type memDatapath struct {
	mu       sync.Mutex
	spec     ProbeSpec
	reads    []int64
	closed   bool
	fail     map[int64]error
	nSamples int // samples per point and period (2 when 0)
}

func (d *memDatapath) Read(n int64) ([]Counter, []Sample, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, nil, fmt.Errorf("read after close")
	}
	d.reads = append(d.reads, n)
	if err := d.fail[n]; err != nil {
		return nil, nil, err
	}
	var cs []Counter
	var ss []Sample
	ns := d.nSamples
	if ns == 0 {
		ns = 2
	}
	for i, p := range d.spec.Points {
		L := d.spec.PeriodNs
		cs = append(cs, Counter{Ifname: p.Ifname, Ifindex: int32(i + 2), Direction: p.Direction, FlowMonID: -1,
			Packets: wantPackets(n, p), Bytes: 1500 * wantPackets(n, p), HashBits: int32(d.spec.HashBits),
			FirstTAINs: n*L + 1, LastTAINs: (n+1)*L - 1, MeanTAINs: n*L + L/2})
		for j := range ns {
			ss = append(ss, Sample{Ifname: p.Ifname, Direction: p.Direction, FlowMonID: -1, Color: int32((n + int64(d.spec.StartColor)) & 1),
				Hash: int64(0xabcd0000 + j), TAINs: n*L + int64(j+1)*1000, SrcAddr: "198.18.0.1", DstAddr: "198.18.1.2",
				Proto: 17, SrcPort: 5000, DstPort: int32(6000 + j), Length: 1500})
		}
	}
	ss = append(ss, Sample{Ifname: "eth9", Direction: "in", FlowMonID: 77, Hash: 0x1234, TAINs: n*d.spec.PeriodNs + 5,
		SrcAddr: "fd00::1", DstAddr: "fd00::2", Proto: 6, SrcPort: 1, DstPort: 2, Length: 60})
	return cs, ss, nil
}

func wantPackets(n int64, p Point) int64 {
	k := int64(100)
	if p.Direction == "out" {
		k = 50
	}
	return k + n%1000
}

func (d *memDatapath) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

func (d *memDatapath) readList() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int64(nil), d.reads...)
}

// fakeClock is a TAI clock tests move: time runs freely up to limit, then waits there until
// the limit moves or the wait is cancelled. A wait that cannot be cancelled runs past it.
type fakeClock struct {
	mu      sync.Mutex
	now     int64
	limit   int64
	changed chan struct{}
	// stall, when set, makes a wait for t end at stall(t) instead (a busy machine).
	stall func(t int64) int64
}

func newFakeClock(now, limit int64) *fakeClock {
	return &fakeClock{now: now, limit: limit, changed: make(chan struct{})}
}

func (c *fakeClock) Now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Until(t int64, cancel <-chan struct{}) bool {
	for {
		c.mu.Lock()
		if t <= c.limit || cancel == nil {
			if c.stall != nil {
				t = c.stall(t)
			}
			c.now = max(c.now, t)
			c.mu.Unlock()
			return true
		}
		c.now = max(c.now, c.limit)
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-cancel:
			return false
		case <-ch:
		}
	}
}

func (c *fakeClock) TAIMinusUTC() int64 { return 37 * int64(time.Second) }

func (c *fakeClock) setLimit(t int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limit = t
	close(c.changed)
	c.changed = make(chan struct{})
}

// testRunner is a runner over memDatapaths and a fake clock starting at now.
func testRunner(t *testing.T, cfg *Config, clock *fakeClock) (*Runner, *[]*memDatapath) {
	t.Helper()
	var dps []*memDatapath
	var mu sync.Mutex
	r := NewRunner(cfg, func(s ProbeSpec) (Datapath, error) {
		mu.Lock()
		defer mu.Unlock()
		dp := &memDatapath{spec: s}
		dps = append(dps, dp)
		return dp, nil
	})
	r.Clock = clock
	r.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Cleanup(func() { r.Stop() })
	return r, &dps
}

// testConfig is a valid configuration writing under a fresh directory.
func testConfig(t *testing.T, extra string) *Config {
	t.Helper()
	cfg, err := ParseConfig("test.yaml", []byte(`probe_id: r1
interfaces: [{name: eth0, direction: both}, {name: eth1, direction: in}]
period: 1s
carrier: dscp
data_dir: `+t.TempDir()+"\n"+extra))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

const sec = int64(time.Second)
