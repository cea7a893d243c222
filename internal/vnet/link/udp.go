package link

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	xipv4 "golang.org/x/net/ipv4"

	"github.com/flowplane/flowplane/internal/impair"
)

const (
	batchSize = 64
	queueMax  = 8192 // packets waiting for the writer; beyond this the link drops (tail drop)
)

// Stats counts a link's traffic.
type Stats struct {
	TxPackets, TxBytes, RxPackets, RxBytes   atomic.Uint64
	TxDropped, RxDropped, RxForeign, RxLarge atomic.Uint64
	Lost, Duplicated, Corrupted, Reordered   atomic.Uint64
}

// UDP is one end of a virtual link carried in UDP datagrams.
// receive counts packet p and hands it up, or counts it as too large for mtu and drops it.
func (s *Stats) receive(p []byte, mtu int, handle func([]byte)) {
	if len(p) > mtu {
		s.RxLarge.Add(1)
		return
	}
	s.RxPackets.Add(1)
	s.RxBytes.Add(uint64(len(p)))
	handle(p)
}

type UDP struct {
	conn   *net.UDPConn
	pc     *xipv4.PacketConn
	peer   *net.UDPAddr
	mtu    int
	start  time.Time
	closed atomic.Bool

	mu    sync.Mutex
	queue []*[]byte
	wake  chan struct{}
	done  chan struct{}
	free  sync.Pool
	imp   atomic.Pointer[Impair] // replaced by SetImpair; read by the writer
	gro   bool                   // the kernel coalesces what we receive
	gso   atomic.Bool            // the kernel segments what we send
	Stats Stats
}

// Listen binds a UDP socket on local for a link of the given MTU.
func Listen(local *net.UDPAddr, mtu int) (*UDP, error) {
	c, err := net.ListenUDP("udp4", local)
	if err != nil {
		return nil, fmt.Errorf("link: listen on %v: %w", local, err)
	}
	_ = c.SetReadBuffer(8 << 20)
	_ = c.SetWriteBuffer(8 << 20)
	u := &UDP{conn: c, pc: xipv4.NewPacketConn(c), mtu: mtu, start: time.Now(),
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	u.free.New = func() any { b := make([]byte, mtu); return &b }
	u.gro = enableGRO(c)
	u.gso.Store(true)
	return u, nil
}

// LocalAddr is the socket's address.
func (u *UDP) LocalAddr() *net.UDPAddr { return u.conn.LocalAddr().(*net.UDPAddr) }

// MTU is the largest packet the link carries.
func (u *UDP) MTU() int { return u.mtu }

// SetImpair changes the impairments; safe at any time.
func (u *UDP) SetImpair(im Impair) { u.imp.Store(&im) }

// Start begins exchanging packets with peer: handle is called for every packet received (in the
// reader goroutine, with a buffer valid only during the call), then flush after each batch.
func (u *UDP) Start(peer *net.UDPAddr, handle func([]byte), flush func()) {
	u.peer = peer
	go u.reader(handle, flush)
	go u.writer()
}

// Send queues a packet; it is copied, so pkt may be reused at once. It never blocks.
func (u *UDP) Send(pkt []byte) {
	if len(pkt) > u.mtu || u.closed.Load() {
		u.Stats.TxDropped.Add(1)
		return
	}
	b := u.free.Get().(*[]byte)
	*b = append((*b)[:0], pkt...)
	u.mu.Lock()
	if len(u.queue) >= queueMax {
		u.mu.Unlock()
		u.free.Put(b)
		u.Stats.TxDropped.Add(1)
		return
	}
	u.queue = append(u.queue, b)
	first := len(u.queue) == 1
	u.mu.Unlock()
	if first {
		select {
		case u.wake <- struct{}{}:
		default:
		}
	}
}

// Close stops the link.
func (u *UDP) Close() error {
	if u.closed.Swap(true) {
		return nil
	}
	close(u.done)
	return u.conn.Close()
}

func (u *UDP) reader(handle func([]byte), flush func()) {
	ms := make([]xipv4.Message, batchSize)
	bufs := make([][]byte, batchSize)
	size := u.mtu + 1 // one spare byte detects oversized datagrams
	if u.gro {
		size = 65536
	}
	for i := range ms {
		bufs[i] = make([]byte, size)
		ms[i].Buffers = [][]byte{bufs[i]}
		ms[i].OOB = make([]byte, 64)
	}
	for {
		n, err := u.pc.ReadBatch(ms, 0)
		if err != nil {
			if u.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// ECONNREFUSED and friends: the peer process is not up yet. Keep going.
			time.Sleep(time.Millisecond)
			continue
		}
		for i := 0; i < n; i++ {
			m := &ms[i]
			if a, ok := m.Addr.(*net.UDPAddr); !ok || u.peer == nil || a.Port != u.peer.Port || !a.IP.Equal(u.peer.IP) {
				u.Stats.RxForeign.Add(1) // only the neighbour may inject packets
				continue
			}
			data := bufs[i][:m.N]
			seg := len(data)
			if u.gro && m.NN > 0 {
				if g := groSize(m.OOB[:m.NN]); g > 0 {
					seg = g
				}
			}
			for len(data) > 0 {
				p := data[:min(seg, len(data))]
				data = data[len(p):]
				u.Stats.receive(p, u.mtu, handle)
			}
		}
		flush()
	}
}

func (u *UDP) now() time.Duration { return time.Since(u.start) }

func (u *UDP) writer() {
	ms := make([]xipv4.Message, 0, batchSize)
	var out, spare []*[]byte
	var sh *impair.Shaper
	var shImp *Impair
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-u.wake:
		case <-timer.C:
		case <-u.done:
			return
		}
		u.mu.Lock()
		in := u.queue
		u.queue = spare[:0]
		u.mu.Unlock()
		imp := u.imp.Load()
		if imp != shImp {
			shImp = imp
			sh = nil
			if imp != nil && imp.Active() {
				sh = impair.New(*imp)
			}
		}
		out = out[:0]
		if sh == nil {
			out = append(out, in...)
		} else {
			now := u.now()
			emit := func(b *[]byte) { out = append(out, b) }
			for _, b := range in {
				sh.Admit(b, now, emit, u.clone, u.release)
			}
			if next := sh.Due(now, emit); next > 0 {
				timer.Reset(next - now)
			}
			u.Stats.Lost.Store(sh.Lost)
			u.Stats.Duplicated.Store(sh.Duplicated)
			u.Stats.Corrupted.Store(sh.Corrupted)
			u.Stats.Reordered.Store(sh.Reordered)
			u.Stats.TxDropped.Add(sh.Overflow)
			sh.Overflow = 0
		}
		for i := range in {
			in[i] = nil
		}
		spare = in
		u.flushOut(ms, out)
		for i := range out {
			out[i] = nil
		}
	}
}

func (u *UDP) clone(b *[]byte) *[]byte {
	c := u.free.Get().(*[]byte)
	*c = append((*c)[:0], *b...)
	return c
}

func (u *UDP) release(b *[]byte) { u.free.Put(b) }

// flushOut writes packets with sendmmsg; runs of equal-sized packets go out as one datagram
// each that the kernel segments (UDP GSO).
func (u *UDP) flushOut(ms []xipv4.Message, out []*[]byte) {
	iov := make([][]byte, len(out))
	for i, b := range out {
		iov[i] = *b
	}
	gso := u.gso.Load()
	for start := 0; start < len(out); {
		ms = ms[:0]
		i := start
		for i < len(out) && len(ms) < batchSize {
			j := i + 1
			if gso {
				size, total := len(iov[i]), len(iov[i])
				for j < len(out) && j-i < maxGSOSegs && total+len(iov[j]) <= maxGSOBytes && len(iov[j]) <= size {
					total += len(iov[j])
					j++
					if len(iov[j-1]) < size {
						break // a shorter packet can only end a run
					}
				}
			}
			m := xipv4.Message{Buffers: iov[i:j], Addr: u.peer}
			if j-i > 1 {
				m.OOB = gsoCmsg(nil, len(iov[i]))
			}
			ms = append(ms, m)
			i = j
		}
		sent := 0
		for sent < len(ms) {
			n, err := u.pc.WriteBatch(ms[sent:], 0)
			if err != nil {
				if u.closed.Load() {
					return
				}
				if len(ms[sent].OOB) > 0 && gso {
					// The kernel refused segmentation: stop asking and resend one by one.
					u.gso.Store(false)
					u.flushOut(nil, out[start:])
					return
				}
				// The peer socket may not exist yet (ECONNREFUSED): the packet is lost, as on
				// a cable with nobody at the other end.
				u.Stats.TxDropped.Add(uint64(len(ms[sent].Buffers)))
				start += len(ms[sent].Buffers)
				sent++
				continue
			}
			for k := sent; k < sent+n; k++ {
				for _, b := range ms[k].Buffers {
					u.Stats.TxPackets.Add(1)
					u.Stats.TxBytes.Add(uint64(len(b)))
				}
				start += len(ms[k].Buffers)
			}
			sent += n
		}
	}
	for _, b := range out {
		u.free.Put(b)
	}
}

// LinkStats is a one-line summary for the stats command.
func (u *UDP) LinkStats() string {
	s := &u.Stats
	return fmt.Sprintf("udp %v: tx=%d rx=%d tx-dropped=%d foreign=%d oversized=%d lost=%d duplicated=%d corrupted=%d reordered=%d",
		u.LocalAddr(), s.TxPackets.Load(), s.RxPackets.Load(), s.TxDropped.Load(), s.RxForeign.Load(), s.RxLarge.Load(),
		s.Lost.Load(), s.Duplicated.Load(), s.Corrupted.Load(), s.Reordered.Load())
}
