package lab

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/impair"
)

// The relay process: `lab up` starts one per impaired link, in the link's relay namespace,
// by running its own executable with relayEnv set to the relay's configuration (JSON). Any
// binary that links this package (flowplane, a test, a benchmark) therefore runs a relay the
// same way, without a command line of its own: init sees the variable and supervises the relay
// (relaysup.go), which is the same executable again with relayWorkerEnv set too: it relays until
// killed, and exits.
const relayEnv = "FLOWPLANE_LAB_RELAY"

// relayConfig is what a relay process is told.
type relayConfig struct {
	Stats      string            `json:"stats"`      // its counters file
	Supervisor string            `json:"supervisor"` // its supervisor's state file
	MTU        int               `json:"mtu"`
	Dirs       [2]relayDirConfig `json:"dirs"`
}

// relayDirConfig is one direction: frames received on In leave by Out, impaired by Params.
type relayDirConfig struct {
	In     string        `json:"in"`
	Out    string        `json:"out"`
	Params impair.Params `json:"params"`
}

func init() {
	cfg := os.Getenv(relayEnv)
	if cfg == "" {
		return
	}
	run, what := superviseRelay, "lab relay supervisor"
	if os.Getenv(relayWorkerEnv) != "" {
		run, what = runRelay, "lab relay"
	}
	if err := run(cfg); err != nil {
		slog.Error(what, "err", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// RelayCounters are one direction's counters, as the relay writes them to its counters file.
type RelayCounters struct {
	RxPackets  uint64 `json:"rx_packets"`
	RxBytes    uint64 `json:"rx_bytes"`
	TxPackets  uint64 `json:"tx_packets"`
	TxErrors   uint64 `json:"tx_errors"` // frames the outgoing veth refused
	Delayed    uint64 `json:"delayed"`
	Lost       uint64 `json:"lost"`
	Duplicated uint64 `json:"duplicated"`
	Reordered  uint64 `json:"reordered"`
	Corrupted  uint64 `json:"corrupted"`
	Overflow   uint64 `json:"overflow"` // dropped at the queue's limit
	Queue      uint64 `json:"queue"`    // packets waiting now
}

// The counters file: a header (magic, pid) then RelayCounters for A→B and B→A, rewritten in
// place every relayFlush.
const (
	relayMagic   = 0x666c6f77706c6e72 // "flowplnr"
	relayHeader  = 16
	relayFlush   = 100 * time.Millisecond
	relayBatch   = 64
	ethHeaderLen = 14
)

var relayCountersSize = binary.Size(RelayCounters{})

func runRelay(cfgJSON string) error {
	var cfg relayConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	// The supervisor made the file; a relay started again goes on from its predecessor's counters.
	f, err := os.OpenFile(cfg.Stats, os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	var carried [2]RelayCounters
	if st, err := readRelay(cfg.Stats); err == nil {
		carried = [2]RelayCounters{st.AToB, st.BToA}
	}
	fds := map[string]int{}
	for _, d := range cfg.Dirs {
		for _, name := range []string{d.In, d.Out} {
			if _, ok := fds[name]; ok {
				continue
			}
			fd, err := packetSocket(name)
			if err != nil {
				return err
			}
			fds[name] = fd
		}
	}
	errc := make(chan error, 2)
	for i, d := range cfg.Dirs {
		r := &relayDir{in: fds[d.In], out: fds[d.Out], mtu: cfg.MTU, stats: f, off: int64(relayHeader + i*relayCountersSize), base: carried[i]}
		r.c = r.base
		r.c.Queue = 0
		r.params = d.Params
		r.params.CorruptFrom = ethHeaderLen // a wire's frame check would catch a bad link header
		r.params.KeepWhole = notIP          // ARP has no checksum: a bad reply would poison a cache
		go func() { errc <- r.run() }()
	}
	// The header last: lab up waits for it, and then both directions are receiving.
	hdr := make([]byte, relayHeader)
	binary.LittleEndian.PutUint64(hdr, relayMagic)
	binary.LittleEndian.PutUint64(hdr[8:], uint64(os.Getpid()))
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return err
	}
	return <-errc
}

// packetSocket opens a raw packet socket bound to the interface name, receiving what arrives
// on it (not what the relay sends) and sending past its qdisc.
func packetSocket(name string) (int, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return -1, err
	}
	proto := htons(unix.ETH_P_ALL)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		return -1, fmt.Errorf("packet socket: %w", err)
	}
	for _, o := range []struct {
		level, opt, val int
		what            string
	}{
		{unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1, "PACKET_IGNORE_OUTGOING"},
		{unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1, "PACKET_QDISC_BYPASS"},
		{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8 << 20, "SO_RCVBUFFORCE"},
		{unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8 << 20, "SO_SNDBUFFORCE"},
		{unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1, "SO_TIMESTAMPNS"},
	} {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.val); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("%s on %s: %w", o.what, name, err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifc.Index}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind packet socket to %s: %w", name, err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// relayDir moves one direction's frames: received in batches (recvmmsg), passed through the
// impairment engine, sent in batches (sendmmsg) when due. It owns an OS thread, which sleeps in
// ppoll until a frame arrives or the next delayed one is due, with a timer slack of 1 ns.
type relayDir struct {
	in, out int
	mtu     int
	params  impair.Params
	stats   *os.File
	off     int64
	base    RelayCounters // a dead predecessor's counters, carried on
	c       RelayCounters
	free    []*[]byte
}

func (r *relayDir) get() *[]byte {
	if n := len(r.free); n > 0 {
		b := r.free[n-1]
		r.free = r.free[:n-1]
		return b
	}
	b := make([]byte, r.mtu+ethHeaderLen+8)
	return &b
}

func (r *relayDir) put(b *[]byte) { *b = (*b)[:cap(*b)]; r.free = append(r.free, b) }

func (r *relayDir) clone(b *[]byte) *[]byte {
	c := r.get()
	*c = append((*c)[:0], *b...)
	return c
}

func (r *relayDir) run() error {
	runtime.LockOSThread() // the timer slack and the scheduling policy are per thread
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("timer slack: %w", err)
	}
	// netem's timers fire in the kernel whatever else runs; a relay thread waiting for the
	// scheduler behind busy processes would stretch every delay by that wait. The lowest real-time
	// priority wakes it first (the kernel's RT throttling still leaves others 5 % of each CPU).
	// Without the privilege, it runs as an ordinary thread.
	if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: 1}, 0); err != nil {
		slog.Warn("lab relay: no real-time priority; delays will include scheduling latency", "err", err)
	}
	sh := impair.New(r.params)
	start := time.Now()
	wall := start.UnixNano() // the realtime clock at start, for the kernel's timestamps
	rx := newMmsgs(relayBatch)
	rxBufs := make([]*[]byte, relayBatch)
	for i := range rxBufs {
		rxBufs[i] = r.get()
	}
	var out []*[]byte
	tx := newMmsgs(relayBatch)
	emit := func(b *[]byte) { out = append(out, b) }
	fds := []unix.PollFd{{Fd: int32(r.in), Events: unix.POLLIN}}
	lastFlush := time.Duration(0)
	next := time.Duration(0)
	for {
		now := time.Since(start)
		wait := relayFlush
		if next > 0 {
			wait = min(wait, next-now)
		}
		if wait > 0 {
			ts := unix.NsecToTimespec(int64(wait))
			if _, err := unix.Ppoll(fds, &ts, nil); err != nil && !errors.Is(err, unix.EINTR) {
				return fmt.Errorf("ppoll: %w", err)
			}
		}
		n, err := rx.recv(r.in, rxBufs)
		if err != nil {
			return fmt.Errorf("recvmmsg: %w", err)
		}
		now = time.Since(start)
		for i := range n {
			b := rxBufs[i]
			*b = (*b)[:rx.len(i)]
			r.c.RxPackets++
			r.c.RxBytes += uint64(len(*b))
			// A frame's delay runs from its arrival, not from when this thread got to it: the
			// kernel's receive timestamp takes the relay's wake-up latency out of the delay.
			at := now
			if ts := rx.stamp(i); ts > 0 {
				at = min(max(time.Duration(ts-wall), now-time.Second), now)
			}
			sh.Admit(b, at, emit, r.clone, r.put)
			rxBufs[i] = r.get()
		}
		next = sh.Due(now, emit)
		for i := 0; i < len(out); i += relayBatch {
			batch := out[i:min(i+relayBatch, len(out))]
			sent := tx.send(r.out, batch)
			r.c.TxPackets += uint64(sent)
			r.c.TxErrors += uint64(len(batch) - sent)
			for _, b := range batch {
				r.put(b)
			}
		}
		clear(out)
		out = out[:0]
		if now-lastFlush >= relayFlush {
			lastFlush = now
			b := &r.base
			r.c.Delayed, r.c.Lost, r.c.Duplicated = b.Delayed+sh.Delayed, b.Lost+sh.Lost, b.Duplicated+sh.Duplicated
			r.c.Reordered, r.c.Corrupted, r.c.Overflow = b.Reordered+sh.Reordered, b.Corrupted+sh.Corrupted, b.Overflow+sh.Overflow
			r.c.Queue = uint64(sh.Queued())
			buf := make([]byte, 0, relayCountersSize)
			buf, _ = binary.Append(buf, binary.LittleEndian, &r.c)
			if _, err := r.stats.WriteAt(buf, r.off); err != nil {
				return fmt.Errorf("write counters: %w", err)
			}
		}
	}
}

// mmsgs is a batch of message headers for recvmmsg and sendmmsg, one buffer each, and room for
// each received frame's timestamp.
type mmsgs struct {
	hdrs []unix.Mmsghdr
	iovs []unix.Iovec
	oob  []byte
}

// oobSize holds one SCM_TIMESTAMPNS message: a cmsghdr and a timespec.
const oobSize = 32

func newMmsgs(n int) *mmsgs {
	m := &mmsgs{hdrs: make([]unix.Mmsghdr, n), iovs: make([]unix.Iovec, n), oob: make([]byte, n*oobSize)}
	for i := range m.hdrs {
		m.hdrs[i].Hdr.Iov = &m.iovs[i]
		m.hdrs[i].Hdr.Iovlen = 1
	}
	return m
}

func (m *mmsgs) len(i int) int { return int(m.hdrs[i].Len) }

// stamp is when the kernel received frame i (CLOCK_REALTIME, ns), or 0.
func (m *mmsgs) stamp(i int) int64 {
	h := &m.hdrs[i].Hdr
	if h.Controllen < oobSize {
		return 0
	}
	c := m.oob[i*oobSize:]
	if int32(binary.NativeEndian.Uint32(c[8:])) != unix.SOL_SOCKET || int32(binary.NativeEndian.Uint32(c[12:])) != unix.SCM_TIMESTAMPNS {
		return 0
	}
	return int64(binary.NativeEndian.Uint64(c[16:]))*1e9 + int64(binary.NativeEndian.Uint64(c[24:]))
}

// recv reads up to len(bufs) frames without blocking; 0 when none is waiting.
func (m *mmsgs) recv(fd int, bufs []*[]byte) (int, error) {
	for i, b := range bufs {
		m.iovs[i].Base = &(*b)[0]
		m.iovs[i].SetLen(len(*b))
		m.hdrs[i].Len = 0
		m.hdrs[i].Hdr.Control = &m.oob[i*oobSize]
		m.hdrs[i].Hdr.SetControllen(oobSize)
	}
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&m.hdrs[0])), uintptr(len(bufs)), unix.MSG_DONTWAIT, 0, 0)
	runtime.KeepAlive(bufs)
	switch errno {
	case 0:
		return int(n), nil
	case unix.EAGAIN, unix.EINTR:
		return 0, nil
	}
	return 0, errno
}

// send writes the frames; it returns how many the kernel took (the rest are dropped, as a full
// queue drops them).
func (m *mmsgs) send(fd int, bufs []*[]byte) int {
	for i, b := range bufs {
		m.iovs[i].Base = &(*b)[0]
		m.iovs[i].SetLen(len(*b))
	}
	done, ok := 0, 0
	for done < len(bufs) {
		n, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&m.hdrs[done])), uintptr(len(bufs)-done), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case errno == unix.EINTR:
		case errno != 0:
			done++ // the frame the kernel refused is dropped
		default:
			done += int(n)
			ok += int(n)
		}
	}
	runtime.KeepAlive(bufs)
	return ok
}

// notIP says whether an Ethernet frame carries neither IPv4 nor IPv6 (ARP, for one), whose
// corruption no checksum would catch as a real wire's frame check would.
func notIP(frame []byte) bool {
	if len(frame) < ethHeaderLen {
		return true
	}
	et := binary.BigEndian.Uint16(frame[12:14])
	return et != unix.ETH_P_IP && et != unix.ETH_P_IPV6
}
