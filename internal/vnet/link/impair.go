// Package link is vnet's link layer: a virtual interface is a UDP socket that exchanges IPv4
// packets with its neighbour's UDP socket, with batched system calls and user-space impairments.
package link

import (
	"container/heap"
	"math/rand/v2"
	"time"
)

// Impair describes what a link does to packets on their way out. Probabilities are 0..1.
type Impair struct {
	Loss, Duplicate, Corrupt, Reorder float64
	Delay, Jitter                     time.Duration
	Rate                              uint64 // bits per second, 0 unlimited
	Seed                              uint64 // for reproducible runs; 0 picks one
}

// Active reports whether any impairment is configured.
func (im Impair) Active() bool {
	return im.Loss > 0 || im.Duplicate > 0 || im.Corrupt > 0 || im.Reorder > 0 || im.Delay > 0 || im.Jitter > 0 || im.Rate > 0
}

// shaper applies an Impair to a packet stream. It is owned by the writer goroutine.
type shaper struct {
	im       Impair
	rng      *rand.Rand
	nextFree time.Duration // when the rate limiter can start the next packet
	held     *[]byte       // packet held back for reordering without delay
	q        delayHeap
	seq      uint64
	// counters
	lost, duplicated, corrupted, reordered uint64
	overflow                               uint64 // dropped because the delay queue was full
}

func newShaper(im Impair) *shaper {
	seed := im.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &shaper{im: im, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

type delayed struct {
	due time.Duration
	seq uint64
	buf *[]byte
}

type delayHeap []delayed

func (h delayHeap) Len() int { return len(h) }
func (h delayHeap) Less(i, j int) bool {
	if h[i].due != h[j].due {
		return h[i].due < h[j].due
	}
	return h[i].seq < h[j].seq
}
func (h delayHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)   { *h = append(*h, x.(delayed)) }
func (h *delayHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// admit passes one packet through the impairments: emit is called for packets to send now,
// the rest wait in the delay queue. clone copies a buffer (for duplicates), free releases one.
func (s *shaper) admit(b *[]byte, now time.Duration, emit func(*[]byte), clone func(*[]byte) *[]byte, free func(*[]byte)) {
	im := &s.im
	if im.Loss > 0 && s.rng.Float64() < im.Loss {
		s.lost++
		free(b)
		return
	}
	copies := []*[]byte{b}
	if im.Duplicate > 0 && s.rng.Float64() < im.Duplicate {
		s.duplicated++
		copies = append(copies, clone(b))
	}
	for _, p := range copies {
		if len(s.q) >= queueMax {
			// A delay or rate queue is finite, as netem's limit is: tail drop rather than
			// holding an unbounded backlog (a fast sender into a slow rate would grow it forever).
			s.overflow++
			free(p)
			continue
		}
		if im.Corrupt > 0 && s.rng.Float64() < im.Corrupt && len(*p) > 0 {
			s.corrupted++
			i := s.rng.IntN(len(*p))
			(*p)[i] ^= byte(1 << s.rng.IntN(8))
		}
		d := im.Delay
		if im.Jitter > 0 {
			d += time.Duration(s.rng.Int64N(int64(2*im.Jitter)+1)) - im.Jitter
		}
		reorder := im.Reorder > 0 && s.rng.Float64() < im.Reorder
		if reorder {
			s.reordered++
			if im.Delay == 0 {
				// No delay to skip: hold the packet and send it after the next one.
				if s.held != nil {
					emit(s.held)
				}
				s.held = p
				continue
			}
			d = 0 // netem semantics: a reordered packet skips the delay
		}
		due := now + d
		if im.Rate > 0 {
			start := max(due, s.nextFree)
			s.nextFree = start + time.Duration(float64(len(*p)*8)/float64(im.Rate)*float64(time.Second))
			due = s.nextFree
		}
		if due <= now {
			emit(p)
			if s.held != nil {
				emit(s.held)
				s.held = nil
			}
			continue
		}
		s.seq++
		heap.Push(&s.q, delayed{due, s.seq, p})
	}
}

// due pops packets whose time has come and reports when the next one is due (0: none).
func (s *shaper) due(now time.Duration, emit func(*[]byte)) time.Duration {
	for len(s.q) > 0 && s.q[0].due <= now {
		emit(heap.Pop(&s.q).(delayed).buf)
	}
	if s.held != nil && len(s.q) == 0 {
		emit(s.held) // nothing else coming soon: do not hold it forever
		s.held = nil
	}
	if len(s.q) > 0 {
		return s.q[0].due
	}
	return 0
}
