// Package vnet is flowplane's user-space TCP/IP network for Go programs of other modules: a
// topology of nodes whose interfaces are UDP sockets on 127.0.0.1, running vnet's own IPv4, RIP
// and TCP, with Listen and Dial giving net.Listener and net.Conn (io.Copy and net/http run over
// it unchanged). It names what internal/vnet implements (docs/vnet.md, "Go API"):
//
//	t, err := vnet.LoadTopology("examples/vnet-line.yaml")
//	nw, err := vnet.Start(t, vnet.Options{})
//	defer nw.Close()
//	l, err := nw.Node("h2").Listen(":80")
//	c, err := nw.Node("h1").Dial(ctx, "198.18.2.2:80")
package vnet

import (
	"errors"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/config"
	"github.com/flowplane/flowplane/internal/topo"
	iv "github.com/flowplane/flowplane/internal/vnet"
	"github.com/flowplane/flowplane/internal/vnet/tcp"
)

type (
	// Topology is a validated topology file (the lab's format, docs/lab.md).
	Topology = topo.Topology
	// Network is a whole topology in this process.
	Network = iv.Network
	// Node is one node: Listen, Dial, DialContext, Ping, Traceroute, Routes.
	Node = iv.Node
	// Conn is a TCP connection: a net.Conn with CloseWrite.
	Conn = iv.Conn
	// Listener is a listening TCP socket: a net.Listener.
	Listener = iv.Listener
	// Options configures Start and StartNode; the zero value is the defaults.
	Options = iv.Options
	// TCPConfig is Options.TCP: buffers, congestion control (CC: reno or cubic), timers.
	TCPConfig = tcp.Config
	// TAPSpec is one of Options.TAPs: a node's extra interface on a TAP device (root only).
	TAPSpec = iv.TAPSpec
	// UsageError is bad input (a topology, an address): the message says what and where.
	UsageError = cli.UsageError
)

// Errors of the socket API; test them with errors.Is.
var (
	ErrPortInUse    = iv.ErrPortInUse
	ErrRefused      = iv.ErrRefused
	ErrReset        = iv.ErrReset
	ErrTimeout      = iv.ErrTimeout
	ErrClosed       = iv.ErrClosed
	ErrInvalidState = iv.ErrInvalidState
	ErrNoRoute      = iv.ErrNoRoute
)

// LoadTopology reads and validates a topology file: a problem in it is a *UsageError naming
// its line (every problem at once); a file that cannot be read, the os error.
func LoadTopology(path string) (*Topology, error) { return usage(topo.Load(path)) }

// ParseTopology validates a topology held in memory; file names it in errors.
func ParseTopology(file string, data []byte) (*Topology, error) {
	return usage(topo.Parse(file, data))
}

func usage(t *Topology, err error) (*Topology, error) {
	var es config.Errors
	if errors.As(err, &es) {
		return nil, cli.Usage(err)
	}
	return t, err
}

// DefaultTCPConfig is the TCP configuration Options gets when its TCP is zero; a TCP
// configuration of one's own starts from it (Start refuses one with a field left zero).
func DefaultTCPConfig() TCPConfig { return tcp.DefaultConfig() }

// Start runs every node of t in this process and starts their links and RIP.
func Start(t *Topology, opts Options) (*Network, error) { return iv.Start(t, opts) }

// StartNode runs one node of t in this process; the other nodes run elsewhere (other
// processes, flowplane vnet node), found through the UDP ports derived from t's name.
func StartNode(t *Topology, name string, opts Options) (*Node, error) {
	return iv.StartNode(t, name, opts)
}
