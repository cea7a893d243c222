package vnet

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/vnet/ipv4"
)

// Shell is the vnet command interpreter: interactive (a REPL per node) or scripted (vnet exec).
// With a whole network, "NODE COMMAND" or "node NODE" picks the node a command runs on.
type Shell struct {
	nw    *Network // nil for a standalone node
	nodes []*Node
	cur   *Node
	out   io.Writer
	mu    sync.Mutex // guards socks and nextID; accept loops add sockets concurrently
	socks map[int]*socket
	next  int
	// Timeout bounds blocking commands (ping, connect, read) in scripts.
	Timeout time.Duration
	quit    bool
}

type socket struct {
	node *Node
	conn *Conn
	ln   *Listener
}

// lockedWriter serialises output: accept loops and file receivers print from their own
// goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// NewShell returns a shell over the nodes; the first is current.
func NewShell(out io.Writer, nw *Network, nodes ...*Node) *Shell {
	s := &Shell{nw: nw, nodes: nodes, out: &lockedWriter{w: out}, socks: map[int]*socket{}, Timeout: 10 * time.Second}
	if len(nodes) > 0 {
		s.cur = nodes[0]
	}
	return s
}

type command struct {
	args  string
	help  string
	min   int
	run   func(s *Shell, n *Node, a []string) error
	names []string
}

var commands []*command

func init() {
	commands = []*command{
		{names: []string{"interfaces", "li"}, help: "list interfaces", run: (*Shell).cmdInterfaces},
		{names: []string{"neighbors", "ln"}, help: "list neighbours on up interfaces", run: (*Shell).cmdNeighbors},
		{names: []string{"routes", "lr"}, help: "show the forwarding table", run: (*Shell).cmdRoutes},
		{names: []string{"up"}, args: "IFACE", min: 1, help: "bring an interface up", run: func(s *Shell, n *Node, a []string) error { return s.setUp(n, a[0], true) }},
		{names: []string{"down"}, args: "IFACE", min: 1, help: "bring an interface down", run: func(s *Shell, n *Node, a []string) error { return s.setUp(n, a[0], false) }},
		{names: []string{"send"}, args: "ADDR TEXT...", min: 2, help: "send a test-protocol (0) message", run: (*Shell).cmdSend},
		{names: []string{"texts"}, help: "show test messages received", run: (*Shell).cmdTexts},
		{names: []string{"ping"}, args: "ADDR [COUNT [SIZE [TTL]]]", min: 1, help: "ICMP echo", run: (*Shell).cmdPing},
		{names: []string{"traceroute"}, args: "ADDR", min: 1, help: "trace the path to ADDR", run: (*Shell).cmdTraceroute},
		{names: []string{"sockets", "ls"}, help: "list sockets", run: (*Shell).cmdSockets},
		{names: []string{"listen", "a"}, args: "PORT", min: 1, help: "listen and accept connections in the background", run: (*Shell).cmdListen},
		{names: []string{"connect", "c"}, args: "ADDR PORT", min: 2, help: "open a connection", run: (*Shell).cmdConnect},
		{names: []string{"write", "s"}, args: "ID TEXT...", min: 2, help: "write text to a socket", run: (*Shell).cmdWrite},
		{names: []string{"read", "r"}, args: "ID N", min: 2, help: "read up to N bytes (waits for at least one)", run: (*Shell).cmdRead},
		{names: []string{"shutdown", "sd"}, args: "ID [write|read|both]", min: 1, help: "half-close", run: (*Shell).cmdShutdown},
		{names: []string{"close", "cl"}, args: "ID", min: 1, help: "close a socket", run: (*Shell).cmdClose},
		{names: []string{"sendfile", "sf"}, args: "PATH ADDR PORT", min: 3, help: "send a file over a new connection", run: (*Shell).cmdSendfile},
		{names: []string{"recvfile", "rf"}, args: "PATH PORT", min: 2, help: "accept one connection and save what it sends", run: (*Shell).cmdRecvfile},
		{names: []string{"info", "window"}, args: "ID", min: 1, help: "connection state: cwnd, ssthresh, srtt, rto, retransmissions, bytes", run: (*Shell).cmdInfo},
		{names: []string{"stats"}, help: "IP, TCP, RIP and link counters", run: (*Shell).cmdStats},
		{names: []string{"capture"}, args: "IFACE PATH | stop IFACE", min: 2, help: "record an interface to pcapng", run: (*Shell).cmdCapture},
		{names: []string{"sleep"}, args: "DURATION", min: 1, help: "pause a script", run: (*Shell).cmdSleep},
		{names: []string{"converge"}, help: "wait until routing reaches every subnet", run: (*Shell).cmdConverge},
		{names: []string{"link"}, args: "INDEX up|down", min: 2, help: "bring both ends of link INDEX up or down (whole network only)", run: (*Shell).cmdLink},
	}
}

func lookup(name string) *command {
	for _, c := range commands {
		if slices.Contains(c.names, name) {
			return c
		}
	}
	return nil
}

// Run reads commands from r until EOF or quit. With stopOnError, the first failing command
// ends the run with its error (scripts); otherwise errors are printed and the shell goes on.
func (s *Shell) Run(r io.Reader, prompt, stopOnError bool) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for {
		if prompt && s.cur != nil {
			fmt.Fprintf(s.out, "%s> ", s.cur.Name)
		}
		if !sc.Scan() {
			return sc.Err()
		}
		line++
		err := s.Exec(sc.Text())
		if errors.Is(err, errQuit) {
			s.quit = true
			return nil
		}
		if err != nil {
			if stopOnError {
				return fmt.Errorf("line %d: %q: %w", line, strings.TrimSpace(sc.Text()), err)
			}
			fmt.Fprintf(s.out, "error: %v\n", err)
		}
	}
}

var errQuit = errors.New("quit")

// Exec runs one command line.
func (s *Shell) Exec(line string) error {
	f := strings.Fields(line)
	if len(f) == 0 || strings.HasPrefix(f[0], "#") {
		return nil
	}
	n := s.cur
	if len(f) > 1 {
		if target := s.node(f[0]); target != nil {
			n, f = target, f[1:]
		}
	}
	switch f[0] {
	case "quit", "exit", "q":
		return errQuit
	case "help", "h", "?":
		s.help()
		return nil
	case "node":
		if len(f) < 2 {
			return cli.Usagef("usage: node NAME; nodes: %s", s.nodeNames())
		}
		t := s.node(f[1])
		if t == nil {
			return cli.Usagef("no node %q; nodes: %s", f[1], s.nodeNames())
		}
		s.cur = t
		return nil
	case "nodes":
		fmt.Fprintln(s.out, s.nodeNames())
		return nil
	}
	c := lookup(f[0])
	if c == nil {
		if len(f) > 1 && lookup(f[1]) != nil { // NODE COMMAND with a node that is not there
			return cli.Usagef("no node %q; nodes: %s", f[0], s.nodeNames())
		}
		return cli.Usagef("unknown command %q; type help for the list", f[0])
	}
	if len(f)-1 < c.min {
		return cli.Usagef("usage: %s %s", c.names[0], c.args)
	}
	if n == nil {
		return cli.Usage(errors.New("no node selected; use node NAME"))
	}
	return c.run(s, n, f[1:])
}

func (s *Shell) node(name string) *Node {
	for _, n := range s.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

func (s *Shell) nodeNames() string {
	var names []string
	for _, n := range s.nodes {
		names = append(names, n.Name)
	}
	return strings.Join(names, ", ")
}

func (s *Shell) help() {
	w := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "node NAME\tmake NAME the current node (or prefix any command with a node name)")
	for _, c := range commands {
		fmt.Fprintf(w, "%s %s\t%s\n", strings.Join(c.names, "|"), c.args, c.help)
	}
	fmt.Fprintln(w, "quit\tleave")
	w.Flush()
}

func (s *Shell) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.Timeout)
}

func parseAddr(a string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(a)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, cli.Usagef("%q is not an IPv4 address, e.g. 198.18.0.2", a)
	}
	return ip, nil
}

func parseInt(what, v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, cli.Usagef("%s %q must be a number from %d to %d", what, v, lo, hi)
	}
	return n, nil
}

func (s *Shell) cmdInterfaces(n *Node, _ []string) error {
	w := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "iface\taddress\tpeer\tmtu\tstate\tin\tout")
	for _, i := range n.ifaces {
		st := "down"
		if i.Up() {
			st = "up"
		}
		fmt.Fprintf(w, "%s\t%v\t%v\t%d\t%s\t%d\t%d\n", i.Name, i.Addr, i.Peer, i.MTU(), st, i.Stats.In.Load(), i.Stats.Out.Load())
	}
	return w.Flush()
}

func (s *Shell) cmdNeighbors(n *Node, _ []string) error {
	for _, i := range n.ifaces {
		if i.Up() {
			fmt.Fprintf(s.out, "%s\t%v\n", i.Name, i.Peer)
		}
	}
	return nil
}

func (s *Shell) cmdRoutes(n *Node, _ []string) error {
	w := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "prefix\tvia\tiface\tmetric")
	for _, r := range n.Routes() {
		via := "connected"
		if !r.Connected {
			via = r.NextHop.String()
		}
		fmt.Fprintf(w, "%v\t%s\t%s\t%d\n", r.Prefix, via, r.Iface.Name, r.Metric)
	}
	return w.Flush()
}

func (s *Shell) setUp(n *Node, name string, up bool) error {
	i := n.Iface(name)
	if i == nil {
		return cli.Usagef("%s has no interface %q", n.Name, name)
	}
	n.SetUp(i, up)
	return nil
}

func (s *Shell) cmdSend(n *Node, a []string) error {
	dst, err := parseAddr(a[0])
	if err != nil {
		return err
	}
	return n.SendIP(dst, ipv4.ProtoTest, 64, []byte(strings.Join(a[1:], " ")))
}

func (s *Shell) cmdTexts(n *Node, _ []string) error {
	for _, t := range n.Texts() {
		fmt.Fprintf(s.out, "from %v: %s\n", t.From, t.Text)
	}
	return nil
}

func (s *Shell) cmdPing(n *Node, a []string) error {
	dst, err := parseAddr(a[0])
	if err != nil {
		return err
	}
	count, size, ttl := 3, 56, 64
	if len(a) > 1 {
		if count, err = parseInt("count", a[1], 1, 1000000); err != nil {
			return err
		}
	}
	if len(a) > 2 {
		if size, err = parseInt("size", a[2], 0, 65507); err != nil {
			return err
		}
	}
	if len(a) > 3 {
		if ttl, err = parseInt("ttl", a[3], 1, 255); err != nil {
			return err
		}
	}
	replies := 0
	for seq := 1; seq <= count; seq++ {
		ctx, cancel := context.WithTimeout(context.Background(), min(s.Timeout, 2*time.Second))
		r, err := n.Ping(ctx, dst, uint16(seq), size, uint8(ttl))
		cancel()
		switch {
		case err != nil && errors.Is(err, context.DeadlineExceeded):
			fmt.Fprintf(s.out, "no answer from %v: icmp_seq=%d\n", dst, seq)
		case err != nil:
			return err
		case r.Reply:
			replies++
			fmt.Fprintf(s.out, "%d bytes from %v: icmp_seq=%d ttl=%d time=%.3f ms\n", size+8, r.From, seq, r.TTL, float64(r.RTT.Microseconds())/1000)
		default:
			fmt.Fprintf(s.out, "from %v: icmp_seq=%d %s\n", r.From, seq, r.Describe)
		}
		if seq < count {
			time.Sleep(100 * time.Millisecond)
		}
	}
	fmt.Fprintf(s.out, "%d sent, %d replies\n", count, replies)
	if replies == 0 {
		return fmt.Errorf("no replies from %v", dst)
	}
	return nil
}

func (s *Shell) cmdTraceroute(n *Node, a []string) error {
	dst, err := parseAddr(a[0])
	if err != nil {
		return err
	}
	hops, err := n.Traceroute(context.Background(), dst, 30, time.Second)
	for _, h := range hops {
		if h.From.IsValid() {
			fmt.Fprintf(s.out, "%2d  %v  %.3f ms\n", h.TTL, h.From, float64(h.RTT.Microseconds())/1000)
		} else {
			fmt.Fprintf(s.out, "%2d  *\n", h.TTL)
		}
	}
	return err
}

func (s *Shell) add(sk *socket) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.next
	s.next++
	s.socks[id] = sk
	return id
}

func (s *Shell) sock(a string) (int, *socket, error) {
	id, err := strconv.Atoi(a)
	if err != nil {
		return 0, nil, cli.Usagef("%q is not a socket id; see sockets", a)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sk := s.socks[id]
	if sk == nil {
		return 0, nil, cli.Usagef("no socket %d; see sockets", id)
	}
	return id, sk, nil
}

func (s *Shell) cmdSockets(n *Node, _ []string) error {
	s.mu.Lock()
	ids := make([]int, 0, len(s.socks))
	for id := range s.socks {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	sort.Ints(ids)
	w := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "id\tnode\tlocal\tremote\tstate")
	for _, id := range ids {
		s.mu.Lock()
		sk := s.socks[id]
		s.mu.Unlock()
		if sk.ln != nil {
			fmt.Fprintf(w, "%d\t%s\t%v\t-\tLISTEN\n", id, sk.node.Name, sk.ln.Addr())
			continue
		}
		fmt.Fprintf(w, "%d\t%s\t%v\t%v\t%v\n", id, sk.node.Name, sk.conn.LocalAddr(), sk.conn.RemoteAddr(), sk.conn.c.State())
	}
	return w.Flush()
}

func (s *Shell) cmdListen(n *Node, a []string) error {
	port, err := parseInt("port", a[0], 1, 65535)
	if err != nil {
		return err
	}
	l, err := n.Listen(strconv.Itoa(port))
	if err != nil {
		return err
	}
	id := s.add(&socket{node: n, ln: l})
	fmt.Fprintf(s.out, "socket %d listening on %s port %d\n", id, n.Name, port)
	go func() {
		for {
			c, err := l.AcceptVnet()
			if err != nil {
				return
			}
			cid := s.add(&socket{node: n, conn: c})
			fmt.Fprintf(s.out, "socket %d accepted from %v\n", cid, c.RemoteAddr())
		}
	}()
	return nil
}

func (s *Shell) cmdConnect(n *Node, a []string) error {
	c, err := s.dial(n, a[0], a[1])
	if err != nil {
		return err
	}
	id := s.add(&socket{node: n, conn: c})
	fmt.Fprintf(s.out, "socket %d connected %v -> %v\n", id, c.LocalAddr(), c.RemoteAddr())
	return nil
}

// dial connects n to the ADDR and PORT arguments of connect and sendfile.
func (s *Shell) dial(n *Node, addr, portArg string) (*Conn, error) {
	dst, err := parseAddr(addr)
	if err != nil {
		return nil, err
	}
	port, err := parseInt("port", portArg, 1, 65535)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	return n.Dial(ctx, netip.AddrPortFrom(dst, uint16(port)).String())
}

func (s *Shell) connSock(a string) (*socket, error) {
	_, sk, err := s.sock(a)
	if err != nil {
		return nil, err
	}
	if sk.conn == nil {
		return nil, cli.Usagef("socket %s is a listener", a)
	}
	return sk, nil
}

func (s *Shell) cmdWrite(n *Node, a []string) error {
	sk, err := s.connSock(a[0])
	if err != nil {
		return err
	}
	_ = sk.conn.SetWriteDeadline(time.Now().Add(s.Timeout))
	k, err := sk.conn.Write([]byte(strings.Join(a[1:], " ")))
	fmt.Fprintf(s.out, "wrote %d bytes\n", k)
	return err
}

func (s *Shell) cmdRead(n *Node, a []string) error {
	sk, err := s.connSock(a[0])
	if err != nil {
		return err
	}
	size, err := parseInt("byte count", a[1], 1, 1<<24)
	if err != nil {
		return err
	}
	buf := make([]byte, size)
	_ = sk.conn.SetReadDeadline(time.Now().Add(s.Timeout))
	k, err := sk.conn.Read(buf)
	_ = sk.conn.SetReadDeadline(time.Time{})
	fmt.Fprintf(s.out, "read %d bytes: %s\n", k, buf[:k])
	if err == io.EOF {
		fmt.Fprintln(s.out, "(end of stream)")
		return nil
	}
	return err
}

func (s *Shell) cmdShutdown(n *Node, a []string) error {
	sk, err := s.connSock(a[0])
	if err != nil {
		return err
	}
	how := "write"
	if len(a) > 1 {
		how = a[1]
	}
	switch how {
	case "write":
		return sk.conn.CloseWrite()
	case "read":
		// Reads end locally; vnet has no receive-side shutdown on the wire (neither has TCP).
		return sk.conn.SetReadDeadline(time.Unix(1, 0))
	case "both":
		return sk.conn.Close()
	}
	return cli.Usagef("shutdown %q: say write, read or both", how)
}

func (s *Shell) cmdClose(n *Node, a []string) error {
	id, sk, err := s.sock(a[0])
	if err != nil {
		return err
	}
	if sk.ln != nil {
		err = sk.ln.Close()
	} else {
		err = sk.conn.Close()
	}
	s.mu.Lock()
	delete(s.socks, id)
	s.mu.Unlock()
	return err
}

func (s *Shell) cmdSendfile(n *Node, a []string) error {
	f, err := os.Open(a[0])
	if err != nil {
		return cli.Usagef("sendfile: %w", err)
	}
	defer f.Close()
	c, err := s.dial(n, a[1], a[2])
	if err != nil {
		return err
	}
	defer c.Close()
	start := time.Now()
	h := sha256.New()
	k, err := io.Copy(c, io.TeeReader(f, h))
	if err != nil {
		return err
	}
	if err := c.CloseWrite(); err != nil {
		return err
	}
	// Wait for the receiver to finish (its FIN) so the transfer is really over.
	_, _ = io.Copy(io.Discard, c)
	el := time.Since(start)
	fmt.Fprintf(s.out, "sent %d bytes in %v (%.1f Mbit/s) sha256 %x\n", k, el.Round(time.Millisecond), float64(k)*8/el.Seconds()/1e6, h.Sum(nil))
	return nil
}

func (s *Shell) cmdRecvfile(n *Node, a []string) error {
	port, err := parseInt("port", a[1], 1, 65535)
	if err != nil {
		return err
	}
	f, err := os.Create(a[0])
	if err != nil {
		return cli.Usagef("recvfile: %w", err)
	}
	l, err := n.Listen(strconv.Itoa(port))
	if err != nil {
		f.Close()
		return err
	}
	fmt.Fprintf(s.out, "waiting for a connection on port %d\n", port)
	go func() {
		defer f.Close()
		defer l.Close()
		c, err := l.AcceptVnet()
		if err != nil {
			return
		}
		h := sha256.New()
		start := time.Now()
		k, err := io.Copy(io.MultiWriter(f, h), c)
		c.Close()
		if err != nil {
			fmt.Fprintf(s.out, "recvfile: %v after %d bytes\n", err, k)
			return
		}
		fmt.Fprintf(s.out, "received %d bytes in %v sha256 %x\n", k, time.Since(start).Round(time.Millisecond), h.Sum(nil))
	}()
	return nil
}

func (s *Shell) cmdInfo(n *Node, a []string) error {
	sk, err := s.connSock(a[0])
	if err != nil {
		return err
	}
	in := sk.conn.c.Info()
	fmt.Fprintf(s.out, "%v %v cc=%s cwnd=%d ssthresh=%d srtt=%v rttvar=%v rto=%v mss=%d\n", in.Tuple, in.State, in.CC, in.Cwnd, in.Ssthresh, in.SRTT, in.RTTVar, in.RTO, in.MSS)
	fmt.Fprintf(s.out, "snd.wnd=%d rcv.wnd=%d inflight=%d sndbuf=%d rcvbuf=%d sack=%v ts=%v wscale=%v\n", in.SndWnd, in.RcvWnd, in.InFlight, in.SndBuffer, in.RcvBuffer, in.SACK, in.Timestamps, in.WScale)
	st := in.Stats
	fmt.Fprintf(s.out, "segs out=%d in=%d bytes sent=%d acked=%d received=%d retransmits=%d fast=%d timeouts=%d dupacks=%d out-of-order=%d (dropped %d)\n",
		st.SegsOut, st.SegsIn, st.BytesOut, st.BytesAcked, st.BytesIn, st.Retransmits, st.FastRetransmits, st.Timeouts, st.DupAcks, st.OutOfOrder, st.OutOfOrderDropped)
	return nil
}

func (s *Shell) cmdStats(n *Node, _ []string) error {
	st := &n.Stats
	fmt.Fprintf(s.out, "ip: received=%d delivered=%d forwarded=%d sent=%d no-route=%d ttl-exceeded=%d not-for-us=%d\n",
		st.Received.Load(), st.Delivered.Load(), st.Forwarded.Load(), st.Sent.Load(), st.NoRoute.Load(), st.TTLExceeded.Load(), st.NotForUs.Load())
	fmt.Fprintf(s.out, "ip malformed: header=%d checksum=%d length=%d version=%d; fragments: made=%d reassembled=%d dropped=%d timed-out=%d\n",
		st.BadHeader.Load(), st.BadChecksum.Load(), st.BadLength.Load(), st.BadVersion.Load(), st.Fragmented.Load(), st.Reassembled.Load(), st.ReasmDropped.Load(), st.ReasmTimed.Load())
	fmt.Fprintf(s.out, "icmp: in=%d out=%d malformed=%d; test messages=%d\n", st.ICMPIn.Load(), st.ICMPOut.Load(), st.ICMPMalformed.Load(), st.TestMessages.Load())
	m := n.tcp
	fmt.Fprintf(s.out, "tcp: segments=%d malformed=%d bad-checksum=%d no-socket=%d rst-sent=%d listen-overflow=%d\n",
		m.SegsIn.Load(), m.Malformed.Load(), m.BadChecksum.Load(), m.NoSocket.Load(), m.RSTsSent.Load(), m.ListenOverflow.Load())
	rs := n.rip.Stats()
	fmt.Fprintf(s.out, "rip: requests=%d responses=%d sent=%d triggered=%d malformed=%d ignored=%d table-full=%d\n", rs.Requests, rs.Responses, rs.Sent, rs.Triggered, rs.Malformed, rs.Ignored, rs.TableFull)
	for _, i := range n.ifaces {
		if u, ok := i.link.(interface{ LinkStats() string }); ok {
			fmt.Fprintf(s.out, "%s: %s\n", i.Name, u.LinkStats())
		}
	}
	return nil
}

func (s *Shell) cmdCapture(n *Node, a []string) error {
	if a[0] == "stop" {
		i := n.Iface(a[1])
		if i == nil {
			return cli.Usagef("%s has no interface %q", n.Name, a[1])
		}
		k, err := n.StopCapture(i)
		if err == nil {
			fmt.Fprintf(s.out, "capture on %s stopped: %d packets\n", i.Name, k)
		}
		return err
	}
	i := n.Iface(a[0])
	if i == nil {
		return cli.Usagef("%s has no interface %q", n.Name, a[0])
	}
	return n.StartCapture(i, a[1])
}

func (s *Shell) cmdSleep(n *Node, a []string) error {
	d, err := time.ParseDuration(a[0])
	if err != nil || d < 0 || d > time.Hour {
		return cli.Usagef("sleep %q: give a duration such as 500ms or 2s", a[0])
	}
	time.Sleep(d)
	return nil
}

func (s *Shell) cmdConverge(n *Node, _ []string) error {
	if s.nw == nil {
		return cli.Usage(errors.New("converge needs the whole network (vnet up or vnet exec)"))
	}
	start := time.Now()
	if err := s.nw.WaitConverged(s.Timeout); err != nil {
		return err
	}
	fmt.Fprintf(s.out, "converged in %v\n", time.Since(start).Round(time.Millisecond))
	return nil
}

func (s *Shell) cmdLink(n *Node, a []string) error {
	if s.nw == nil {
		return cli.Usage(errors.New("link needs the whole network (vnet up or vnet exec); use down IFACE on a node"))
	}
	idx, err := parseInt("link index", a[0], 0, len(s.nw.Topo.Links)-1)
	if err != nil {
		return err
	}
	if a[1] != "up" && a[1] != "down" {
		return cli.Usagef("link %s %q: say up or down", a[0], a[1])
	}
	s.nw.SetLinkUp(s.nw.Topo.Links[idx], a[1] == "up")
	return nil
}
