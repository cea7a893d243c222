package tcp

import "net/netip"

// Listener accepts connections on one port.
type Listener struct {
	m       *Mux
	key     listenKey
	wake    chan struct{}
	backlog int
	// guarded by m.mu (the table lock) to keep lock ordering simple: conn.mu -> m.mu
	queue   []*Conn
	pending int
	closed  bool
}

// Addr is the listening address and port.
func (l *Listener) Addr() (netip.Addr, uint16) { return l.key.addr, l.key.port }

// AcceptWake is signalled when Accept may succeed.
func (l *Listener) AcceptWake() <-chan struct{} { return l.wake }

// Accept returns an established connection or ErrWouldBlock.
func (l *Listener) Accept() (*Conn, error) {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	if len(l.queue) == 0 {
		return nil, ErrWouldBlock
	}
	c := l.queue[0]
	l.queue[0] = nil
	l.queue = l.queue[1:]
	return c, nil
}

// Close stops listening and resets connections not yet accepted.
func (l *Listener) Close() error {
	l.m.mu.Lock()
	if l.closed {
		l.m.mu.Unlock()
		return ErrClosed
	}
	l.closed = true
	delete(l.m.listeners, l.key)
	q := l.queue
	l.queue = nil
	var half []*Conn
	for _, c := range l.m.conns {
		if c.listener == l && !c.queued {
			half = append(half, c)
		}
	}
	l.m.mu.Unlock()
	signal(l.wake)
	for _, c := range append(q, half...) {
		c.Abort()
	}
	return nil
}

// syn handles a SYN for this listener: a new connection in SYN-RECEIVED.
func (l *Listener) syn(id Tuple, s *Segment) {
	m := l.m
	m.mu.Lock()
	if l.closed || m.conns[id] != nil {
		m.mu.Unlock()
		return
	}
	if len(l.queue)+l.pending >= l.backlog {
		m.mu.Unlock()
		m.ListenOverflow.Add(1)
		return // drop: the peer retransmits its SYN
	}
	c := newConn(m, id)
	c.listener, c.passive = l, true
	l.pending++
	m.conns[id] = c
	m.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.irs, c.rcvNxt = s.Seq, s.Seq.Add(1)
	c.rcvAdv = c.rcvNxt
	c.negotiate(s)
	c.sndWnd = int(s.Window)
	c.sndWl1 = s.Seq
	c.setState(SynReceived)
	c.rttStart = c.now()
	c.sendSyn(true)
	c.sndNxt, c.sndMax = c.iss.Add(1), c.iss.Add(1)
	c.armRtx()
	c.lastRecv = c.now()
}

// ready moves an established connection to the accept queue; called with c.mu held.
func (l *Listener) ready(c *Conn) {
	l.m.mu.Lock()
	l.pending--
	c.queued = true
	if l.closed {
		l.m.mu.Unlock()
		c.abort()
		return
	}
	l.queue = append(l.queue, c)
	l.m.mu.Unlock()
	signal(l.wake)
}
