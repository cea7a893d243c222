// Package rip is vnet's distance-vector routing: RIP carried in IP protocol 200 with the compact
// message format of the classic teaching stack (command, count, then cost/address/mask entries),
// periodic and triggered updates, split horizon with poisoned reverse, expiry and garbage
// collection (RFC 2453 semantics with shorter timers).
package rip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
)

// Protocol constants.
const (
	Infinity   = 16
	MaxEntries = 64
	// MaxRoutes bounds the table, so a neighbour advertising endless prefixes cannot exhaust
	// memory; further new prefixes are ignored (counted as TableFull).
	MaxRoutes   = 4096
	CmdRequest  = 1
	CmdResponse = 2
	entryLen    = 12
)

// Entry is one advertised route.
type Entry struct {
	Prefix netip.Prefix
	Cost   uint32
}

// Message is a decoded RIP message.
type Message struct {
	Command uint16
	Entries []Entry
}

var (
	ErrShort   = errors.New("rip: message shorter than its header")
	ErrLength  = errors.New("rip: length does not match the entry count")
	ErrCommand = errors.New("rip: unknown command")
	ErrEntries = errors.New("rip: too many entries")
	ErrMask    = errors.New("rip: mask is not contiguous")
	ErrCost    = errors.New("rip: cost above infinity")
)

// Parse decodes and validates a message; any invalid entry rejects the whole message.
func Parse(b []byte) (Message, error) {
	var m Message
	if len(b) < 4 {
		return m, ErrShort
	}
	m.Command = binary.BigEndian.Uint16(b)
	n := int(binary.BigEndian.Uint16(b[2:]))
	if m.Command != CmdRequest && m.Command != CmdResponse {
		return m, fmt.Errorf("%w %d", ErrCommand, m.Command)
	}
	if n > MaxEntries {
		return m, ErrEntries
	}
	if len(b) != 4+n*entryLen {
		return m, ErrLength
	}
	if m.Command == CmdRequest && n != 0 {
		return m, ErrLength
	}
	m.Entries = make([]Entry, 0, n)
	for i := 0; i < n; i++ {
		e := b[4+i*entryLen:]
		cost := binary.BigEndian.Uint32(e)
		addr := binary.BigEndian.Uint32(e[4:])
		mask := binary.BigEndian.Uint32(e[8:])
		ones := bits.LeadingZeros32(^mask)
		if bits.TrailingZeros32(mask) != 32-ones { // contiguous: ones then zeros (0 included)
			return m, ErrMask
		}
		if cost > Infinity {
			return m, ErrCost
		}
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], addr)
		p := netip.PrefixFrom(netip.AddrFrom4(a), ones).Masked()
		m.Entries = append(m.Entries, Entry{Prefix: p, Cost: cost})
	}
	return m, nil
}

// Append encodes m after dst. It panics if m has more than MaxEntries entries (a programming
// error: the router splits updates).
func Append(dst []byte, m *Message) []byte {
	if len(m.Entries) > MaxEntries {
		panic("rip: too many entries in one message")
	}
	dst = binary.BigEndian.AppendUint16(dst, m.Command)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(m.Entries)))
	for _, e := range m.Entries {
		a := e.Prefix.Masked().Addr().As4()
		dst = binary.BigEndian.AppendUint32(dst, e.Cost)
		dst = append(dst, a[:]...)
		var mask uint32
		if e.Prefix.Bits() > 0 {
			mask = ^uint32(0) << (32 - e.Prefix.Bits())
		}
		dst = binary.BigEndian.AppendUint32(dst, mask)
	}
	return dst
}
