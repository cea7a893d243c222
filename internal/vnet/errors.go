// Package vnet is a user-space TCP/IP network over UDP links: each virtual interface is a UDP
// socket on 127.0.0.1 talking to its neighbour's, and on top run vnet's own IPv4 (forwarding,
// fragmentation, ICMP), RIP and TCP. A whole topology runs in one process (Network) or one node
// per process (StartNode); Listen and Dial give net.Listener and net.Conn so ordinary Go code
// (io.Copy, net/http) runs over it.
package vnet

import (
	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/vnet/tcp"
)

// UsageError is bad input from the user (a topology, a flag, a REPL command): the message says
// what is wrong, where, and how to fix it. It exits with code 2.
type UsageError = cli.UsageError

func usagef(err error) error { return &UsageError{Err: err} }

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
