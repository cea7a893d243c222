package xdpgen

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/stats"
)

// Config describes one run of the generator.
type Config struct {
	// Netns is the named network namespace (nsrun) the frames leave from; "" is the calling
	// thread's, where Send makes no interface of its own, so it cannot hold the program in the
	// XDP dispatcher (see hold) and each kernel call takes ~20 ms longer.
	Netns string
	// Ifindex is the interface, in Netns, that transmits the frames.
	Ifindex int
	// Frame is the template: a whole Ethernet frame (no FCS) with valid checksums, at most a
	// few kilobytes (it must fit a page with the kernel's headroom).
	Frame []byte
	// Count is how many frames to send; 0: no limit.
	Count uint64
	// Duration is how long to send; 0: no limit. With a Rate, exactly Rate × Duration frames
	// go out spread over Duration (fewer only if the machine cannot keep up).
	Duration time.Duration
	// Rate is in frames per second; 0 sends as fast as the sending CPU can.
	Rate float64
	// SrcPorts > 1 rotates the TCP/UDP source port over the template's and the SrcPorts-1
	// following ports: frame i uses port + i mod SrcPorts.
	SrcPorts int
	// SrcAddrs > 1 rotates the source address over the template's and the SrcAddrs-1 following
	// addresses (counting in its last 32 bits), changing once per full turn of the ports: frame
	// i uses address + (i / SrcPorts) mod SrcAddrs.
	SrcAddrs int
	// Seq sets each TCP frame's sequence number to the template's plus the frame's index.
	Seq bool
	// First is the index of the first frame (0 by default): a run that continues another one's
	// rotation starts where that one ended.
	First uint64
	// Batch is how many frames the kernel prepares and flushes at once (1–256, default 64).
	Batch int
	// Progress, if set, is kept at the number of frames sent so far, updated after every kernel
	// call (at full speed every ~20 ms), to measure over a window of a run.
	Progress *atomic.Uint64
}

// errUnbounded refuses a run with no Count, no Duration and a context that never ends.
var errUnbounded = errors.New("xdpgen: no Count, no Duration and a context without deadline or cancel: the run would never end")

func (c *Config) validate() (layout, error) {
	l, err := parseFrame(c.Frame)
	if err != nil {
		return l, fmt.Errorf("xdpgen: %w", err)
	}
	switch {
	case c.Ifindex <= 0:
		return l, fmt.Errorf("xdpgen: Ifindex %d: need the transmitting interface", c.Ifindex)
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return l, fmt.Errorf("xdpgen: Rate %v: want frames per second ≥ 0", c.Rate)
	case c.Duration < 0:
		return l, fmt.Errorf("xdpgen: Duration %v is negative", c.Duration)
	case c.SrcPorts < 0 || c.SrcPorts > 65536:
		return l, fmt.Errorf("xdpgen: SrcPorts %d: want 0–65536", c.SrcPorts)
	case c.SrcAddrs < 0:
		return l, fmt.Errorf("xdpgen: SrcAddrs %d is negative", c.SrcAddrs)
	case c.Batch < 0 || c.Batch > 256:
		return l, fmt.Errorf("xdpgen: Batch %d: want 1–256 (0: the kernel's 64)", c.Batch)
	}
	if err := l.check(c); err != nil {
		return l, fmt.Errorf("xdpgen: %w", err)
	}
	if c.SrcPorts > 1 {
		if p := int(binary.BigEndian.Uint16(c.Frame[l.l4:])); p+c.SrcPorts-1 > 65535 {
			return l, fmt.Errorf("xdpgen: source ports %d–%d run past 65535", p, p+c.SrcPorts-1)
		}
	}
	if c.SrcAddrs > 1 {
		if a := uint64(binary.BigEndian.Uint32(c.Frame[l.saddr:])); a+uint64(c.SrcAddrs)-1 > math.MaxUint32 {
			return l, fmt.Errorf("xdpgen: %d source addresses from the template's run past the end of its last 32 bits", c.SrcAddrs)
		}
	}
	return l, nil
}

// Send transmits the template frame as the config says and returns how many frames went out:
// the number the XDP program redirected to Ifindex (a full receive queue further on may still
// drop some; count at the receiver, e.g. with a Sink). It returns when Count frames are sent,
// Duration is over or ctx ends (then with ctx's error).
func Send(ctx context.Context, cfg Config) (uint64, error) {
	l, err := cfg.validate()
	if err != nil {
		return 0, err
	}
	if cfg.Count == 0 && cfg.Duration == 0 && ctx.Done() == nil {
		return 0, errUnbounded
	}
	g, err := load(&cfg, l)
	if err != nil {
		return 0, err
	}
	defer g.objs.Close()
	var sent uint64
	if cfg.Netns == "" {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		sent, err = g.send(ctx)
		return sent, err
	}
	err = nsrun.Do(cfg.Netns, func() error {
		release := g.hold()
		defer release()
		var err error
		sent, err = g.send(ctx)
		return err
	})
	return sent, err
}

// hold keeps the program in the kernel's XDP dispatcher for the whole run, so that each
// BPF_PROG_TEST_RUN call costs microseconds instead of ~20 ms: a call with more than one
// repetition adds its program to the dispatcher and removes it afterwards, each a text patch and
// an RCU grace period, unless the program is already there because it is attached to an
// interface. So it is attached to one end of a veth pair made for the purpose in the sending
// namespace, both ends down: nothing is ever received there. It runs in that namespace (only a
// named one: never on the host's interfaces) and returns how to undo it. Failing that, the run
// goes on with the slow calls.
func (g *generator) hold() func() {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "fpxg" + hex.EncodeToString(b)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name + "a"}, PeerName: name + "b"}
	if err := netlink.LinkAdd(veth); err != nil {
		slog.Debug("xdpgen: no dispatcher hold, each kernel call will be slow", "err", err)
		return func() {}
	}
	remove := func() {
		if err := netlink.LinkDel(veth); err != nil {
			slog.Warn("xdpgen: remove the dispatcher hold's veth", "name", veth.Name, "err", err)
		}
	}
	lk, err := link.AttachXDP(link.XDPOptions{Program: g.objs.Xdpgen, Interface: veth.Attrs().Index, Flags: link.XDPDriverMode})
	if err != nil {
		slog.Debug("xdpgen: no dispatcher hold, each kernel call will be slow", "err", err)
		remove()
		return func() {}
	}
	return func() {
		_ = lk.Close()
		remove()
	}
}

type generator struct {
	cfg  *Config
	objs xdpgenObjects
}

func load(cfg *Config, l layout) (*generator, error) {
	spec, err := loadXdpgen()
	if err != nil {
		return nil, fmt.Errorf("xdpgen: load program spec: %w", err)
	}
	var head [headMax]byte
	copy(head[:], cfg.Frame)
	vars := map[string]any{
		"tx_ifindex": uint32(cfg.Ifindex),
		"head_len":   l.headLen,
		"head":       head,
		"next_frame": cfg.First,
	}
	if cfg.SrcPorts > 1 || cfg.SrcAddrs > 1 || cfg.Seq {
		vars["l4_csum_off"] = l.l4Csum
		vars["udp"] = uint32(0)
		if l.proto == protoUDP {
			vars["udp"] = uint32(1)
		}
	}
	if cfg.SrcPorts > 1 {
		vars["sport_off"], vars["port_count"] = l.l4, uint32(cfg.SrcPorts)
	}
	if cfg.SrcAddrs > 1 {
		vars["saddr_off"], vars["addr_count"], vars["ip_csum_off"] = l.saddr, uint32(cfg.SrcAddrs), l.ipCsum
	}
	if cfg.Seq {
		vars["seq_off"] = l.seq
	}
	for name, v := range vars {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("xdpgen: set %s: %w", name, err)
		}
	}
	g := &generator{cfg: cfg}
	if err := spec.LoadAndAssign(&g.objs, nil); err != nil {
		return nil, fmt.Errorf("xdpgen: load program: %w", err)
	}
	return g, nil
}

const (
	tick        = time.Millisecond      // rate-limited: how often due frames go out
	chunkTarget = 20 * time.Millisecond // full speed: how long one kernel call should run
)

// send is the sending loop; it runs on a locked thread in the sending namespace.
func (g *generator) send(ctx context.Context) (uint64, error) {
	c := g.cfg
	start := time.Now()
	// total is what the run sends in all, if bounded.
	total, bounded := c.Count, c.Count > 0
	if c.Rate > 0 && c.Duration > 0 {
		if byTime := uint64(c.Rate * c.Duration.Seconds()); !bounded || byTime < total {
			total, bounded = byTime, true
		}
	}
	var sent uint64
	chunk := uint64(4096) // full speed: grows or shrinks to take about chunkTarget
	for {
		if bounded && sent >= total {
			return sent, nil
		}
		if err := ctx.Err(); err != nil {
			return sent, err
		}
		elapsed := time.Since(start)
		if c.Duration > 0 && elapsed >= c.Duration && c.Rate == 0 {
			return sent, nil
		}
		var n uint64
		if c.Rate == 0 {
			n = chunk
		} else {
			due := uint64(c.Rate * elapsed.Seconds())
			if bounded && (due > total || c.Duration > 0 && elapsed >= c.Duration) {
				due = total // the end: whatever is left of the schedule
			}
			if due <= sent {
				// Nothing due: sleep until the next frame is, and at least a tick, so frames go
				// out in batches of a tick's worth.
				next := time.Duration(float64(sent+1)/c.Rate*float64(time.Second)) - elapsed
				wait := max(tick, next)
				if c.Duration > 0 {
					wait = min(wait, c.Duration-elapsed+time.Millisecond)
				}
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
				continue
			}
			// Behind schedule (a stall): catch up, a chunk at a time.
			n = min(due-sent, max(uint64(c.Rate*chunkTarget.Seconds()), 1))
		}
		if bounded {
			n = min(n, total-sent)
		}
		n = min(n, math.MaxUint32)
		t0 := time.Now()
		runErr := g.run(uint32(n))
		took := time.Since(t0)
		now, err := g.counter(xdpgenXdpgenStatXDPGEN_STAT_SENT)
		if err != nil {
			return sent, err
		}
		short, err := g.counter(xdpgenXdpgenStatXDPGEN_STAT_SHORT)
		if err != nil {
			return now, err
		}
		if short > 0 {
			return now, fmt.Errorf("xdpgen: %d frames shorter than the template head, aborted", short)
		}
		sent = now
		if c.Progress != nil {
			c.Progress.Store(sent)
		}
		if runErr != nil && !errors.Is(runErr, unix.EINTR) { // EINTR: a signal; sent says how far it got
			return sent, runErr
		}
		if c.Rate == 0 && runErr == nil && took > 0 {
			// Aim the next chunk at chunkTarget; change by at most 4× at once.
			want := float64(n) * float64(chunkTarget) / float64(took)
			chunk = uint64(min(max(want, float64(n)/4, 64), float64(n)*4, 1<<24))
		}
	}
}

// progRunAttr is the BPF_PROG_TEST_RUN part of union bpf_attr.
type progRunAttr struct {
	progFd, retval            uint32
	dataSizeIn, dataSizeOut   uint32
	dataIn, dataOut           uint64
	repeat, duration          uint32
	ctxSizeIn, ctxSizeOut     uint32
	ctxIn, ctxOut             uint64
	flags, cpu, batchSize, _p uint32
}

// run sends n frames with one BPF_PROG_TEST_RUN in live-frames mode. It calls the kernel
// directly rather than through ebpf.Program.Run, which repeats the whole call after an EINTR
// and would send frames twice; here an interrupted call returns EINTR and the program's counter
// says how many frames went out.
func (g *generator) run(n uint32) error {
	frame := g.cfg.Frame
	attr := progRunAttr{
		progFd:     uint32(g.objs.Xdpgen.FD()),
		dataSizeIn: uint32(len(frame)),
		dataIn:     uint64(uintptr(unsafe.Pointer(&frame[0]))),
		repeat:     n,
		flags:      unix.BPF_F_TEST_XDP_LIVE_FRAMES,
		batchSize:  uint32(g.cfg.Batch),
	}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(frame)
	if errno != 0 {
		return fmt.Errorf("xdpgen: BPF_PROG_TEST_RUN (live frames, %d frames): %w", n, errno)
	}
	return nil
}

// counter sums one of the program's per-CPU counters.
func (g *generator) counter(key xdpgenXdpgenStat) (uint64, error) {
	return stats.Sum(g.objs.XdpgenStats, uint32(key))
}
