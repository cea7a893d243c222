package ipv4

import (
	"errors"
	"math"
	"net/netip"
	"time"
)

// ErrFragDF means a packet needs fragmenting but forbids it.
var ErrFragDF = errors.New("ipv4: packet larger than MTU with DF set")

// Fragment splits pkt (a whole packet with a 20-byte header) into fragments that fit mtu, calling
// emit for each with a buffer valid only during the call.
func Fragment(pkt []byte, mtu int, scratch []byte, emit func([]byte)) error {
	h, payload, err := Parse(pkt)
	if err != nil {
		return err
	}
	if h.TotalLen <= mtu {
		emit(pkt[:h.TotalLen])
		return nil
	}
	if h.DF {
		return ErrFragDF
	}
	chunk := (mtu - HeaderLen) &^ 7
	if chunk <= 0 {
		return errors.New("ipv4: mtu too small to fragment")
	}
	for off := 0; off < len(payload); off += chunk {
		end := min(off+chunk, len(payload))
		f := h
		f.FragOff = h.FragOff + off
		f.MF = h.MF || end < len(payload)
		f.TotalLen = HeaderLen + end - off
		if cap(scratch) < f.TotalLen {
			scratch = make([]byte, f.TotalLen)
		}
		b := scratch[:f.TotalLen]
		Put(b, &f)
		copy(b[HeaderLen:], payload[off:end])
		emit(b)
	}
	return nil
}

type fragKey struct {
	src, dst netip.Addr
	id       uint16
	proto    uint8
}

type datagram struct {
	data     []byte
	have     []span // received byte ranges, sorted, merged
	total    int    // payload length, -1 until the last fragment arrives
	first    Header // header of the fragment at offset 0, for the rebuilt packet
	gotFirst bool
	deadline time.Duration
	size     int // bytes charged against the memory limit
}

type span struct{ lo, hi int }

// Reassembler rebuilds fragmented datagrams with a per-datagram timeout and a memory limit so a
// flood of partial datagrams cannot exhaust memory. Not safe for concurrent use.
type Reassembler struct {
	Timeout  time.Duration
	MaxBytes int
	pending  map[fragKey]*datagram
	used     int
	// nextExpiry is no later than the earliest deadline pending, so Expire, which runs for
	// every fragment, skips the scan of the whole table until something can have expired.
	nextExpiry time.Duration
	// Counters.
	Reassembled, TimedOut, Dropped uint64
}

// maxDatagrams bounds the incomplete datagrams held at once, whatever their size; maxHoles
// bounds the separate pieces of one datagram (a 64 KiB datagram in 576-byte fragments has 120
// fragments, so legitimate reordering stays far below), since each fragment costs a pass over
// them.
const (
	maxDatagrams = 4096
	maxHoles     = 128
)

// NewReassembler returns a reassembler with the RFC 791 suggested 15 s... rounded up to 30 s as
// Linux does, and a 4 MiB memory limit.
func NewReassembler() *Reassembler {
	return &Reassembler{Timeout: 30 * time.Second, MaxBytes: 4 << 20, pending: map[fragKey]*datagram{}}
}

// Add takes one fragment (header h, payload p) at time now. When it completes a datagram, Add
// returns the whole packet (header and payload, freshly allocated).
func (r *Reassembler) Add(h Header, p []byte, now time.Duration) []byte {
	r.Expire(now)
	if h.FragOff+len(p) > 65535-HeaderLen || (h.MF && len(p)%8 != 0) || (h.MF && len(p) == 0) {
		r.Dropped++
		return nil
	}
	k := fragKey{h.Src, h.Dst, h.ID, h.Proto}
	d := r.pending[k]
	if d == nil {
		if len(r.pending) >= maxDatagrams {
			r.Dropped++
			return nil
		}
		d = &datagram{total: -1, deadline: now + r.Timeout}
		if len(r.pending) == 0 || d.deadline < r.nextExpiry {
			r.nextExpiry = d.deadline
		}
		r.pending[k] = d
	}
	end := h.FragOff + len(p)
	if !h.MF {
		if d.total >= 0 && d.total != end || end < d.maxHave() {
			r.drop(k, d) // inconsistent last fragment: a corrupt or hostile datagram
			return nil
		}
		d.total = end
	} else if d.total >= 0 && end > d.total {
		r.drop(k, d)
		return nil
	}
	if end > len(d.data) {
		grow := end - len(d.data)
		if r.used+grow > r.MaxBytes {
			r.drop(k, d)
			return nil
		}
		r.used += grow
		d.size += grow
		d.data = append(d.data, make([]byte, grow)...)
	}
	copy(d.data[h.FragOff:], p)
	d.add(span{h.FragOff, end})
	if len(d.have) > maxHoles {
		r.drop(k, d) // tiny fragments scattered to make each insert cost more: hostile
		return nil
	}
	if h.FragOff == 0 {
		d.first, d.gotFirst = h, true
	}
	if d.total < 0 || !d.gotFirst || len(d.have) != 1 || d.have[0].lo != 0 || d.have[0].hi != d.total {
		return nil
	}
	delete(r.pending, k)
	r.used -= d.size
	r.Reassembled++
	out := make([]byte, HeaderLen+d.total)
	f := d.first
	f.MF, f.FragOff, f.TotalLen = false, 0, len(out)
	Put(out, &f)
	copy(out[HeaderLen:], d.data[:d.total])
	return out
}

func (d *datagram) maxHave() int {
	if len(d.have) == 0 {
		return 0
	}
	return d.have[len(d.have)-1].hi
}

func (d *datagram) add(s span) {
	out := d.have[:0:0]
	placed := false
	for _, x := range d.have {
		switch {
		case x.hi < s.lo:
			out = append(out, x)
		case s.hi < x.lo:
			if !placed {
				out, placed = append(out, s), true
			}
			out = append(out, x)
		default:
			s = span{min(s.lo, x.lo), max(s.hi, x.hi)}
		}
	}
	if !placed {
		out = append(out, s)
	}
	d.have = out
}

func (r *Reassembler) drop(k fragKey, d *datagram) {
	delete(r.pending, k)
	r.used -= d.size
	r.Dropped++
}

// Expired is a datagram given up on; the first fragment lets the caller send ICMP time exceeded.
type Expired struct {
	First    Header
	GotFirst bool
	Data     []byte
}

// Expire drops datagrams past their deadline and returns them.
func (r *Reassembler) Expire(now time.Duration) []Expired {
	if len(r.pending) == 0 || now < r.nextExpiry {
		return nil
	}
	var out []Expired
	next := time.Duration(math.MaxInt64)
	for k, d := range r.pending {
		if now >= d.deadline {
			r.used -= d.size
			delete(r.pending, k)
			r.TimedOut++
			out = append(out, Expired{First: d.first, GotFirst: d.gotFirst, Data: d.data})
			continue
		}
		next = min(next, d.deadline)
	}
	r.nextExpiry = next
	return out
}

// Pending is the number of incomplete datagrams held.
func (r *Reassembler) Pending() int { return len(r.pending) }

// Used is the number of bytes held for incomplete datagrams.
func (r *Reassembler) Used() int { return r.used }
