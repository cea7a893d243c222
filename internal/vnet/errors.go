// Package vnet is a user-space TCP/IP network over UDP links: each virtual interface is a UDP
// socket on 127.0.0.1 talking to its neighbour's, and on top run vnet's own IPv4 (forwarding,
// fragmentation, ICMP), RIP and TCP. A whole topology runs in one process (Network) or one node
// per process (StartNode); Listen and Dial give net.Listener and net.Conn so ordinary Go code
// (io.Copy, net/http) runs over it.
package vnet

import (
	"github.com/flowplane/flowplane/internal/vnet/tcp"
)

// Bad input from the user (a topology, a flag, a REPL command) is a *cli.UsageError: the
// message says what is wrong, where, and how to fix it, and the process exits with code 2.

// Errors of the socket API; test them with errors.Is.
var (
	ErrPortInUse    = tcp.ErrPortInUse
	ErrRefused      = tcp.ErrRefused
	ErrReset        = tcp.ErrReset
	ErrTimeout      = tcp.ErrTimeout
	ErrClosed       = tcp.ErrClosed
	ErrInvalidState = tcp.ErrInvalidState
	ErrNoRoute      = tcp.ErrNoRoute
)
