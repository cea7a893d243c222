package vnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/vnet/tcp"
)

// deadline is a settable deadline whose wait channel closes when it passes (the net.Pipe
// pattern): one timer per Set call, none per packet.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{}
}

func newDeadline() *deadline { return &deadline{cancel: make(chan struct{})} }

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired and closed cancel: wait for it, then make a fresh one
	}
	d.timer = nil
	closed := isClosed(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
		}
		ch := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(ch) })
		return
	}
	if !closed {
		close(d.cancel)
	}
}

func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Conn is a vnet TCP connection as a net.Conn.
type Conn struct {
	c      *tcp.Conn
	node   *Node
	rd, wd *deadline
}

var _ net.Conn = (*Conn)(nil)

func newConn(n *Node, c *tcp.Conn) *Conn {
	return &Conn{c: c, node: n, rd: newDeadline(), wd: newDeadline()}
}

func opErr(op string, c *Conn, err error) error {
	if err == nil {
		return nil
	}
	return &net.OpError{Op: op, Net: "vnet", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Read reads data, blocking until some arrives, EOF, an error, or the read deadline.
func (c *Conn) Read(p []byte) (int, error) {
	for {
		n, err := c.c.Read(p)
		if !errors.Is(err, tcp.ErrWouldBlock) {
			if err == nil || err == io.EOF {
				return n, err
			}
			return n, opErr("read", c, err)
		}
		select {
		case <-c.c.ReadWake():
		case <-c.rd.wait():
			return 0, opErr("read", c, os.ErrDeadlineExceeded)
		}
	}
}

// Write writes all of p unless an error or the write deadline stops it.
func (c *Conn) Write(p []byte) (int, error) {
	total := 0
	for total < len(p) {
		n, err := c.c.Write(p[total:])
		total += n
		if err == nil {
			continue
		}
		if !errors.Is(err, tcp.ErrWouldBlock) {
			return total, opErr("write", c, err)
		}
		select {
		case <-c.c.WriteWake():
		case <-c.wd.wait():
			return total, opErr("write", c, os.ErrDeadlineExceeded)
		}
	}
	return total, nil
}

// Close closes the connection (FIN, or RST when unread data remains).
func (c *Conn) Close() error {
	if err := c.c.Close(); err != nil {
		return opErr("close", c, err)
	}
	return nil
}

// CloseWrite shuts the sending side (half-close); reads continue until the peer's FIN.
func (c *Conn) CloseWrite() error { return opErr("close", c, c.c.CloseWrite()) }

// TCP exposes the protocol connection, for statistics.
func (c *Conn) TCP() *tcp.Conn { return c.c }

func (c *Conn) LocalAddr() net.Addr {
	id := c.c.ID()
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(id.LocalAddr, id.LocalPort))
}

func (c *Conn) RemoteAddr() net.Addr {
	id := c.c.ID()
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(id.RemoteAddr, id.RemotePort))
}

func (c *Conn) SetDeadline(t time.Time) error {
	c.rd.set(t)
	c.wd.set(t)
	return nil
}
func (c *Conn) SetReadDeadline(t time.Time) error  { c.rd.set(t); return nil }
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wd.set(t); return nil }

// SetNoDelay disables Nagle's algorithm when on is true.
func (c *Conn) SetNoDelay(on bool) error { c.c.SetNoDelay(on); return nil }

// SetKeepAlive switches keepalive probes on or off (idle time from the configuration).
func (c *Conn) SetKeepAlive(on bool) error { c.c.SetKeepAlive(on, 0); return nil }

// SetKeepAlivePeriod sets the idle time before the first probe and switches probing on.
func (c *Conn) SetKeepAlivePeriod(d time.Duration) error {
	if d <= 0 {
		return cli.Usagef("keepalive period %v must be positive", d)
	}
	c.c.SetKeepAlive(true, d)
	return nil
}

// Listener is a vnet TCP listener as a net.Listener.
type Listener struct {
	l      *tcp.Listener
	node   *Node
	closed chan struct{}
	once   sync.Once
}

var _ net.Listener = (*Listener)(nil)

// Listen listens on port of every address of the node ("port" or ":port" or "addr:port").
func (n *Node) Listen(address string) (*Listener, error) {
	ap, err := parseListenAddr(address)
	if err != nil {
		return nil, err
	}
	l, err := n.tcp.Listen(ap.Addr(), ap.Port())
	if err != nil {
		return nil, fmt.Errorf("listen %s on %s: %w", address, n.Name, err)
	}
	return &Listener{l: l, node: n, closed: make(chan struct{})}, nil
}

func parseListenAddr(s string) (netip.AddrPort, error) {
	if p, err := strconv.ParseUint(s, 10, 16); err == nil {
		return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(p)), nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, cli.Usagef("%q is not a port or address:port", s)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, cli.Usagef("%q: port %q is not a number from 0 to 65535", s, port)
	}
	a := netip.IPv4Unspecified()
	if host != "" {
		if a, err = netip.ParseAddr(host); err != nil || !a.Is4() {
			return netip.AddrPort{}, cli.Usagef("%q: %q is not an IPv4 address", s, host)
		}
	}
	return netip.AddrPortFrom(a, uint16(p)), nil
}

// Accept waits for a connection.
func (l *Listener) Accept() (net.Conn, error) { return l.AcceptVnet() }

// AcceptVnet is Accept returning the concrete type.
func (l *Listener) AcceptVnet() (*Conn, error) {
	for {
		c, err := l.l.Accept()
		if err == nil {
			return newConn(l.node, c), nil
		}
		if !errors.Is(err, tcp.ErrWouldBlock) {
			if isClosed(l.closed) {
				err = net.ErrClosed // what net/http's Serve expects after Close
			}
			return nil, &net.OpError{Op: "accept", Net: "vnet", Addr: l.Addr(), Err: err}
		}
		select {
		case <-l.l.AcceptWake():
		case <-l.closed:
			return nil, &net.OpError{Op: "accept", Net: "vnet", Addr: l.Addr(), Err: net.ErrClosed}
		}
	}
}

func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.l.Close()
}

func (l *Listener) Addr() net.Addr {
	a, p := l.l.Addr()
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(a, p))
}

// Dial connects to address ("ip:port") and waits for the handshake, the context, or failure.
func (n *Node) Dial(ctx context.Context, address string) (*Conn, error) {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !ap.Addr().Is4() {
		return nil, cli.Usagef("%q is not an IPv4 address:port, e.g. 198.18.0.2:80", address)
	}
	src, ok := n.SourceFor(ap.Addr())
	if !ok {
		return nil, &net.OpError{Op: "dial", Net: "vnet", Addr: net.TCPAddrFromAddrPort(ap), Err: ErrNoRoute}
	}
	tc, err := n.tcp.Dial(src, 0, ap.Addr(), ap.Port())
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "vnet", Addr: net.TCPAddrFromAddrPort(ap), Err: err}
	}
	c := newConn(n, tc)
	for {
		ok, err := tc.Established()
		if ok {
			return c, nil
		}
		if err != nil {
			return nil, opErr("dial", c, err)
		}
		select {
		case <-tc.StateWake():
		case <-ctx.Done():
			tc.Abort()
			return nil, opErr("dial", c, ctx.Err())
		}
	}
}

// DialContext matches net.Dialer.DialContext so http.Transport can use a node.
func (n *Node) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if network != "tcp" && network != "tcp4" {
		return nil, fmt.Errorf("vnet dials tcp only, not %s", network)
	}
	return n.Dial(ctx, address)
}
