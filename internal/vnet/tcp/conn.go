package tcp

import (
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/flowplane/flowplane/internal/vnet/ipv4"
)

// State is a connection state (RFC 9293 3.3.2).
type State int

const (
	Closed State = iota
	Listen
	SynSent
	SynReceived
	Established
	FinWait1
	FinWait2
	CloseWait
	Closing
	LastAck
	TimeWait
)

var stateNames = [...]string{"CLOSED", "LISTEN", "SYN-SENT", "SYN-RECEIVED", "ESTABLISHED", "FIN-WAIT-1",
	"FIN-WAIT-2", "CLOSE-WAIT", "CLOSING", "LAST-ACK", "TIME-WAIT"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Tuple identifies a connection.
type Tuple struct {
	LocalAddr  netip.Addr
	LocalPort  uint16
	RemoteAddr netip.Addr
	RemotePort uint16
}

func (t Tuple) String() string {
	return fmt.Sprintf("%v:%d-%v:%d", t.LocalAddr, t.LocalPort, t.RemoteAddr, t.RemotePort)
}

// Conn is one TCP connection. All fields are guarded by mu; timers and the receive path take
// it, and it is never held while calling into another connection.
type Conn struct {
	mu       sync.Mutex
	mux      *Mux
	cfg      *Config
	id       Tuple
	src, dst [4]byte
	state    State
	err      error // why the connection died, reported to Read/Write
	listener *Listener
	passive  bool
	queued   bool // handed to the listener's accept queue; guarded by mux.mu

	// Send side.
	iss, sndUna, sndNxt, sndMax Seq
	sndWnd                      int // bytes, already scaled
	maxSndWnd                   int
	sndWl1, sndWl2              Seq
	sndBuf                      ring
	sndBufSeq                   Seq // sequence number of sndBuf's first byte
	finQueued                   bool
	writeClosed                 bool
	sndShift                    uint8 // peer's window scale
	mss                         int   // payload bytes in a full segment
	peerMSS                     int
	advMSS                      int // what we announce: route MTU less headers
	ipID                        uint16

	// Receive side.
	irs, rcvNxt, rcvAdv Seq
	rcvBuf              ring
	ooo                 oooQueue
	rcvShift            uint8
	finRcvd             bool // FIN seen (maybe out of order)
	finSeq              Seq
	readClosed          bool
	eof                 bool // FIN consumed: reads return EOF once drained
	unackedSegs         int
	ackPending          bool
	inBatch             bool
	lastRecv            time.Duration

	// Options agreed in the handshake.
	wsOK, tsOK, sackOK bool
	tsRecent           uint32
	tsOffset           uint32
	lastAckSent        Seq

	// RTT and retransmission (RFC 6298).
	srtt, rttvar, rto time.Duration
	minRTT            time.Duration
	rttTiming         bool
	rttSeq            Seq
	rttStart          time.Duration
	backoff           int
	retries           int
	persistBackoff    int
	kaProbes          int

	// Congestion control and loss recovery.
	cc         CongestionControl
	ccs        CCState
	dupAcks    int
	inRecovery bool
	recover    Seq
	highRxt    Seq
	rxts       []rxtRec // retransmissions in this recovery, to detect their loss
	tlpOut     bool     // a tail loss probe is unanswered
	forceLost  Seq      // after a probe: unSACKed data below this is lost (if forcing)
	forcing    bool
	inflate    int // NewReno window inflation during recovery without SACK
	sb         scoreboard

	rtxTimer, delackTimer, kaTimer, twTimer ltimer

	rdWake, wrWake, stWake chan struct{}
	scratch                []byte
	sackBuf                [4]Block

	stats Stats
}

// Stats counts what a connection did.
type Stats struct {
	SegsOut, SegsIn        uint64
	BytesOut, BytesIn      uint64 // payload sent (retransmissions included) / delivered in order
	BytesAcked             uint64
	Retransmits            uint64 // segments
	FastRetransmits        uint64 // recovery episodes
	Timeouts               uint64
	DupAcks                uint64
	ChallengeAcks          uint64
	OutOfOrder             uint64
	OutOfOrderDropped      uint64 // beyond the receiver's limit on holes
	ZeroWindowProbes       uint64
	TailLossProbes         uint64
	LostRetransmits        uint64
	PAWSDropped, BadAcks   uint64
	UnacceptableSegs       uint64
	KeepAlivesSent         uint64
	DelayedAcks, FullAcks  uint64
	RcvBufFull, SndBufFull uint64
}

// Info is a snapshot of a connection for humans and tests.
type Info struct {
	Tuple      Tuple
	State      State
	CC         string
	Cwnd       int
	Ssthresh   int
	SRTT       time.Duration
	RTTVar     time.Duration
	RTO        time.Duration
	MSS        int
	SndWnd     int
	RcvWnd     int
	InFlight   int
	SndBuffer  int
	RcvBuffer  int
	SACK       bool
	Timestamps bool
	WScale     [2]uint8 // ours, peer's
	InRecovery bool
	Stats      Stats
}

func newConn(m *Mux, id Tuple) *Conn {
	c := &Conn{mux: m, cfg: &m.cfg, id: id, src: id.LocalAddr.As4(), dst: id.RemoteAddr.As4(),
		sndBuf: newRing(m.cfg.SendBuf), rcvBuf: newRing(m.cfg.RecvBuf),
		rdWake: make(chan struct{}, 1), wrWake: make(chan struct{}, 1), stWake: make(chan struct{}, 1),
		rto: m.cfg.InitialRTO}
	c.cc, _ = NewCC(m.cfg.CC)
	if c.cc == nil {
		c.cc = &Cubic{}
	}
	c.iss = Seq(m.isn())
	c.sndUna, c.sndNxt, c.sndMax = c.iss, c.iss, c.iss
	c.sndBufSeq = c.iss.Add(1)
	c.recover = c.iss
	c.tsOffset = m.isn()
	for c.rcvShift = 0; c.rcvShift < 14 && m.cfg.RecvBuf>>c.rcvShift > 0xffff; c.rcvShift++ {
	}
	if !m.cfg.WindowScale {
		c.rcvShift = 0
	}
	mtu := m.host.MTU(id.RemoteAddr)
	if mtu <= 0 {
		mtu = 1500
	}
	c.advMSS = mtu - ipv4.HeaderLen - HeaderLen
	c.mss = c.advMSS
	c.peerMSS = 536
	c.scratch = make([]byte, mtu+64)
	c.rtxTimer.init(c, c.onRtxTimer)
	c.delackTimer.init(c, c.onDelack)
	c.kaTimer.init(c, c.onKeepalive)
	c.twTimer.init(c, c.onTimeWait)
	return c
}

func (c *Conn) now() time.Duration { return c.mux.host.Clock().Now() }

// ID is the connection's address tuple.
func (c *Conn) ID() Tuple { return c.id }

// State is the current state.
func (c *Conn) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// Err is why the connection failed, or nil.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// ReadWake is signalled when Read may make progress.
func (c *Conn) ReadWake() <-chan struct{} { return c.rdWake }

// WriteWake is signalled when Write may make progress.
func (c *Conn) WriteWake() <-chan struct{} { return c.wrWake }

// StateWake is signalled on state changes (established, closed).
func (c *Conn) StateWake() <-chan struct{} { return c.stWake }

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (c *Conn) wakeAll() {
	signal(c.rdWake)
	signal(c.wrWake)
	signal(c.stWake)
}

func (c *Conn) setState(s State) {
	c.state = s
	signal(c.stWake)
	signal(c.rdWake)
	signal(c.wrWake)
}

// Established reports whether the handshake completed, and the error if it failed.
func (c *Conn) Established() (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.state {
	case SynSent, SynReceived:
		return false, nil
	case Closed:
		if c.err != nil {
			return false, c.err
		}
		return false, ErrClosed
	}
	return true, nil
}

// Read copies received data into p. It returns ErrWouldBlock when nothing is buffered, io.EOF
// after the peer's FIN, or the connection's error.
func (c *Conn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.readClosed {
		return 0, ErrClosed
	}
	if c.rcvBuf.Len() > 0 {
		if len(p) == 0 {
			return 0, nil
		}
		n := c.rcvBuf.Read(p)
		c.maybeWindowUpdate()
		return n, nil
	}
	if c.eof {
		return 0, io.EOF
	}
	if c.err != nil {
		return 0, c.err
	}
	if c.state == Closed {
		return 0, ErrClosed
	}
	return 0, ErrWouldBlock
}

// Buffered is the number of received bytes waiting to be read.
func (c *Conn) Buffered() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rcvBuf.Len()
}

// Write queues as much of p as fits in the send buffer and sends what the windows allow. It
// returns ErrWouldBlock when the buffer is full.
func (c *Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.writeClosed {
		return 0, ErrClosed
	}
	switch c.state {
	case SynSent, SynReceived, Established, CloseWait:
	default:
		return 0, ErrInvalidState
	}
	if len(p) == 0 {
		return 0, nil
	}
	n := c.sndBuf.Write(p)
	if n == 0 {
		c.stats.SndBufFull++
		return 0, ErrWouldBlock
	}
	if c.state == Established || c.state == CloseWait {
		c.output()
	}
	return n, nil
}

// CloseWrite sends FIN after the queued data (half-close).
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeWrite()
}

func (c *Conn) closeWrite() error {
	if c.writeClosed {
		return nil
	}
	switch c.state {
	case Closed:
		if c.err != nil {
			return c.err
		}
		return ErrClosed
	case SynSent:
		c.writeClosed = true
		c.destroy(nil)
		return nil
	case SynReceived, Established:
		c.writeClosed, c.finQueued = true, true
		if c.state == Established {
			c.setState(FinWait1)
			c.output()
		} // SYN-RECEIVED sends FIN once established (RFC 9293 3.10.4)
	case CloseWait:
		c.writeClosed, c.finQueued = true, true
		c.setState(LastAck)
		c.output()
	default:
		return ErrInvalidState
	}
	return nil
}

// Close closes both directions. Unread data makes it abort with RST (RFC 9293 3.10.4 / RFC 2525)
// so the peer learns its data was not consumed.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.readClosed {
		return ErrClosed
	}
	c.readClosed = true
	if c.rcvBuf.Len() > 0 || c.ooo.bytes > 0 {
		c.abort()
		return nil
	}
	err := c.closeWrite()
	signal(c.rdWake)
	if err == ErrInvalidState || err == ErrClosed {
		return nil
	}
	return err
}

// Abort resets the connection.
func (c *Conn) Abort() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readClosed = true
	c.abort()
}

func (c *Conn) abort() {
	switch c.state {
	case SynReceived, Established, FinWait1, FinWait2, CloseWait:
		c.sendFlags(c.sndNxt, RST|ACK)
	}
	c.destroy(ErrClosed)
}

// destroy moves to CLOSED and releases the connection; err (if not nil) is reported to callers.
func (c *Conn) destroy(err error) {
	if c.state == Closed && c.err != nil {
		return
	}
	if err != nil && c.err == nil {
		c.err = err
	}
	c.setState(Closed)
	c.rtxTimer.release()
	c.delackTimer.release()
	c.kaTimer.release()
	c.twTimer.release()
	if c.listener != nil {
		c.mux.mu.Lock()
		if !c.queued { // still half-open: free its backlog slot
			c.queued = true
			c.listener.pending--
		}
		c.mux.mu.Unlock()
	}
	c.mux.remove(c)
	c.wakeAll()
}

// Info returns a snapshot.
func (c *Conn) Info() Info {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Info{Tuple: c.id, State: c.state, CC: c.cc.Name(), Cwnd: c.ccs.Cwnd, Ssthresh: c.ccs.Ssthresh,
		SRTT: c.srtt, RTTVar: c.rttvar, RTO: c.rto, MSS: c.mss, SndWnd: c.sndWnd,
		RcvWnd: c.rcvAdv.Diff(c.rcvNxt), InFlight: c.sndMax.Diff(c.sndUna), SndBuffer: c.sndBuf.Len(),
		RcvBuffer: c.rcvBuf.Len(), SACK: c.sackOK, Timestamps: c.tsOK,
		WScale: [2]uint8{c.rcvShift, c.sndShift}, InRecovery: c.inRecovery, Stats: c.stats}
}

// SetNoDelay turns Nagle's algorithm off (true) or on for this connection.
func (c *Conn) SetNoDelay(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cfg := *c.cfg
	cfg.Nagle = !on
	c.cfg = &cfg
}

// SetKeepAlive switches keepalive probing on or off for this connection.
func (c *Conn) SetKeepAlive(on bool, idle time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cfg := *c.cfg
	cfg.KeepAlive = on
	if idle > 0 {
		cfg.KeepIdle = idle
	}
	c.cfg = &cfg
	c.armKeepalive()
}

func (c *Conn) armKeepalive() {
	if !c.cfg.KeepAlive || c.state != Established && c.state != CloseWait {
		c.kaTimer.stop()
		return
	}
	c.kaTimer.set(c.lastRecv + c.cfg.KeepIdle + time.Duration(c.kaProbes)*c.cfg.KeepInterval)
}
