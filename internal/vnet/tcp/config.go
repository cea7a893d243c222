// Package tcp is a user-space TCP (RFC 9293) for vnet: handshake and teardown, RFC 6298
// retransmission, RFC 5681/6582 congestion control and fast recovery, RFC 2018/6675 SACK,
// RFC 7323 window scaling and timestamps, RFC 5961 challenge ACKs, pluggable congestion control
// (Reno, CUBIC), Nagle, delayed ACK, keepalive, zero-window probing.
//
// A Mux demultiplexes segments for one host; a Conn is one connection. The API here never blocks:
// it returns ErrWouldBlock and signals readiness on channels, so the same code runs on the wall
// clock and on a virtual clock in deterministic tests. Package vnet builds net.Conn on top.
package tcp

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/flowplane/flowplane/internal/vnet/clock"
)

// Config tunes a Mux and the connections it creates.
type Config struct {
	SendBuf, RecvBuf int           // bytes
	MinRTO, MaxRTO   time.Duration // RFC 6298 floor (configurable; Linux uses 200ms) and ceiling
	InitialRTO       time.Duration
	DelayedAck       bool
	AckDelay         time.Duration
	Nagle            bool
	CC               string // reno or cubic
	SACK             bool
	Timestamps       bool
	WindowScale      bool
	KeepAlive        bool
	KeepIdle         time.Duration
	KeepInterval     time.Duration
	KeepCount        int
	MSL              time.Duration // TIME_WAIT lasts 2*MSL
	SynRetries       int
	MaxRetries       int // data retransmissions before the connection times out
	Backlog          int
	// ISN returns initial sequence numbers; nil means random (RFC 9293 3.4.1 wants them
	// unpredictable). Tests set it to start near 2^32 to exercise wraparound.
	ISN func() uint32
}

// Check says what in c cannot work (a zero buffer or timer, an unknown congestion control):
// a Config is whole, so one of the library's own starts from DefaultConfig.
func (c Config) Check() error {
	var bad []string
	for _, f := range []struct {
		name string
		zero bool
	}{
		{"SendBuf", c.SendBuf <= 0}, {"RecvBuf", c.RecvBuf <= 0}, {"MinRTO", c.MinRTO <= 0},
		{"MaxRTO", c.MaxRTO < c.MinRTO}, {"InitialRTO", c.InitialRTO <= 0},
		{"AckDelay", c.DelayedAck && c.AckDelay <= 0}, {"KeepIdle", c.KeepAlive && c.KeepIdle <= 0},
		{"KeepInterval", c.KeepAlive && c.KeepInterval <= 0}, {"KeepCount", c.KeepAlive && c.KeepCount <= 0},
		{"MSL", c.MSL <= 0}, {"SynRetries", c.SynRetries <= 0}, {"MaxRetries", c.MaxRetries <= 0},
		{"Backlog", c.Backlog <= 0},
	} {
		if f.zero {
			bad = append(bad, f.name)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s not set (or out of range); start from the defaults (DefaultConfig) and change what you need", strings.Join(bad, ", "))
	}
	_, err := NewCC(c.CC)
	return err
}

// DefaultConfig is what vnet uses unless told otherwise.
func DefaultConfig() Config {
	return Config{
		SendBuf: 4 << 20, RecvBuf: 4 << 20,
		MinRTO: 200 * time.Millisecond, MaxRTO: 60 * time.Second, InitialRTO: time.Second,
		DelayedAck: true, AckDelay: 40 * time.Millisecond, Nagle: true, CC: "cubic",
		SACK: true, Timestamps: true, WindowScale: true,
		KeepIdle: 2 * time.Hour, KeepInterval: 75 * time.Second, KeepCount: 9,
		MSL: 30 * time.Second, SynRetries: 6, MaxRetries: 15, Backlog: 128,
	}
}

// Host is what a Mux needs from the IP layer below it.
type Host interface {
	Clock() clock.Clock
	// Output sends an IPv4 packet (header included). It must not keep pkt after returning.
	Output(pkt []byte)
	// MTU is the MTU of the route to dst, or 0 when there is none.
	MTU(dst netip.Addr) int
}

// Errors callers can test with errors.Is.
var (
	ErrWouldBlock   = errors.New("tcp: operation would block")
	ErrPortInUse    = errors.New("tcp: address already in use")
	ErrRefused      = errors.New("tcp: connection refused")
	ErrReset        = errors.New("tcp: connection reset by peer")
	ErrTimeout      = errors.New("tcp: connection timed out")
	ErrClosed       = errors.New("tcp: use of closed connection")
	ErrInvalidState = errors.New("tcp: invalid state for operation")
	ErrNoRoute      = errors.New("no route to host") // the IP layer's too (ping, traceroute): no "tcp:"
)

const (
	dupThresh = 3
	minMSS    = 88 // smallest peer MSS honoured (Linux's TCP_MIN_MSS)
)
