// Package impair is the impairment engine of user-space links: loss (Bernoulli or
// Gilbert–Elliott), duplication, corruption, reordering, delay with jitter drawn from a
// distribution, and a rate, applied to one direction of a packet stream as netem does in the
// kernel. vnet's links and the kernel lab's relays both run it.
package impair

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"time"
)

// Distribution is the law of the jitter around the delay.
type Distribution string

const (
	// Uniform: delay + U(−jitter, +jitter).
	Uniform Distribution = "uniform"
	// Normal: delay + jitter·Z, Z standard normal (jitter is the standard deviation).
	Normal Distribution = "normal"
	// Pareto: delay + jitter·(X − 1.5)/√0.75 with X Pareto(x_m = 1, α = 3): a heavy tail of late
	// packets, mean delay and standard deviation jitter, never earlier than delay − 0.577·jitter.
	Pareto Distribution = "pareto"
)

// Distributions are the jitter distributions, the first the default.
var Distributions = []Distribution{Uniform, Normal, Pareto}

// GilbertElliott is a two-state burst loss model, as netem's `loss gemodel p r 1-h 1-k`. All
// values are probabilities 0..1, drawn once per packet.
type GilbertElliott struct {
	P        float64 `json:"p"`         // good → bad
	R        float64 `json:"r"`         // bad → good
	LossBad  float64 `json:"loss_bad"`  // loss in the bad state (netem's 1-h)
	LossGood float64 `json:"loss_good"` // loss in the good state (netem's 1-k)
}

// MeanLoss is the long-run loss probability.
func (g GilbertElliott) MeanLoss() float64 {
	if g.P+g.R == 0 {
		return g.LossGood
	}
	bad := g.P / (g.P + g.R)
	return bad*g.LossBad + (1-bad)*g.LossGood
}

// Params describes what one direction of a link does to packets. Probabilities are 0..1.
type Params struct {
	Loss                        float64         // Bernoulli loss, when GE is nil
	GE                          *GilbertElliott // burst loss instead of Loss
	Duplicate, Corrupt, Reorder float64
	// CorruptFrom is how many bytes at the start of a packet corruption leaves alone: a link
	// header a real wire's frame check would catch.
	CorruptFrom int
	// KeepWhole, when set, names packets corruption leaves alone: those no checksum would catch.
	KeepWhole    func(pkt []byte) bool `json:"-"`
	Delay        time.Duration
	Jitter       time.Duration
	Distribution Distribution // "" is Uniform
	Rate         uint64       // bits per second, 0 unlimited
	Limit        int          // packets waiting at most; 0 is DefaultLimit
	Seed         uint64       // for reproducible runs; 0 picks one
}

// DefaultLimit bounds the delay queue as netem's limit does: beyond it, tail drop.
const DefaultLimit = 8192

// Active reports whether any impairment is configured.
func (p Params) Active() bool {
	return p.Loss > 0 || p.GE != nil || p.Duplicate > 0 || p.Corrupt > 0 || p.Reorder > 0 || p.Delay > 0 || p.Jitter > 0 || p.Rate > 0
}

// Counters are what a Shaper did.
type Counters struct {
	Lost, Duplicated, Corrupted, Reordered uint64
	Delayed                                uint64 // packets that waited in the delay queue
	Overflow                               uint64 // dropped because the queue was full
}

// Shaper applies Params to one packet stream. It is not safe for concurrent use: one goroutine
// (the link's writer) owns it.
type Shaper struct {
	p        Params
	rng      *rand.Rand
	bad      bool          // Gilbert–Elliott state
	nextFree time.Duration // when the rate limiter can start the next packet
	held     *[]byte       // packet held back for reordering without delay
	q        delayHeap
	seq      uint64
	Counters
}

// New returns a Shaper for p.
func New(p Params) *Shaper {
	seed := p.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	if p.Limit <= 0 {
		p.Limit = DefaultLimit
	}
	return &Shaper{p: p, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
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

// Queued is the number of packets waiting (delay queue and a packet held for reordering).
func (s *Shaper) Queued() int {
	n := len(s.q)
	if s.held != nil {
		n++
	}
	return n
}

// lose draws the loss decision for one packet.
func (s *Shaper) lose() bool {
	if g := s.p.GE; g != nil {
		// netem's order: the state changes first, then the packet meets the new state.
		if s.bad {
			if s.rng.Float64() < g.R {
				s.bad = false
			}
		} else if s.rng.Float64() < g.P {
			s.bad = true
		}
		if s.bad {
			return g.LossBad > 0 && s.rng.Float64() < g.LossBad
		}
		return g.LossGood > 0 && s.rng.Float64() < g.LossGood
	}
	return s.p.Loss > 0 && s.rng.Float64() < s.p.Loss
}

// Sample draws one packet's delay: Delay varied by Jitter under Distribution, never negative.
func (s *Shaper) Sample() time.Duration {
	p := &s.p
	if p.Jitter <= 0 {
		return p.Delay
	}
	var x float64 // standardized: mean 0 (uniform: range ±1)
	switch p.Distribution {
	case Normal:
		x = s.rng.NormFloat64()
	case Pareto:
		// Inverse transform of Pareto(1, 3), then mean 1.5 and variance 0.75 taken out.
		x = (math.Pow(1-s.rng.Float64(), -1.0/3) - 1.5) / math.Sqrt(0.75)
	default:
		x = 2*s.rng.Float64() - 1
	}
	d := p.Delay + time.Duration(x*float64(p.Jitter))
	return max(d, 0)
}

// Admit passes one packet through the impairments: emit is called for packets to send now,
// the rest wait in the delay queue. clone copies a buffer (for duplicates), free releases one.
func (s *Shaper) Admit(b *[]byte, now time.Duration, emit func(*[]byte), clone func(*[]byte) *[]byte, free func(*[]byte)) {
	p := &s.p
	if s.lose() {
		s.Lost++
		free(b)
		return
	}
	copies := [2]*[]byte{b}
	n := 1
	if p.Duplicate > 0 && s.rng.Float64() < p.Duplicate {
		s.Duplicated++
		copies[1] = clone(b)
		n = 2
	}
	for _, c := range copies[:n] {
		if s.Queued() >= p.Limit {
			// A delay or rate queue is finite, as netem's limit is: tail drop rather than
			// holding an unbounded backlog (a fast sender into a slow rate would grow it forever).
			s.Overflow++
			free(c)
			continue
		}
		if p.Corrupt > 0 && s.rng.Float64() < p.Corrupt && len(*c) > p.CorruptFrom && (p.KeepWhole == nil || !p.KeepWhole(*c)) {
			s.Corrupted++
			i := p.CorruptFrom + s.rng.IntN(len(*c)-p.CorruptFrom)
			(*c)[i] ^= byte(1 << s.rng.IntN(8))
		}
		d := s.Sample()
		if p.Reorder > 0 && s.rng.Float64() < p.Reorder {
			s.Reordered++
			if p.Delay == 0 && p.Jitter == 0 {
				// No delay to skip: hold the packet and send it after the next one.
				if s.held != nil {
					emit(s.held)
				}
				s.held = c
				continue
			}
			d = 0 // netem semantics: a reordered packet skips the delay
		}
		due := now + d
		if p.Rate > 0 {
			start := max(due, s.nextFree)
			s.nextFree = start + time.Duration(float64(len(*c)*8)/float64(p.Rate)*float64(time.Second))
			due = s.nextFree
		}
		if due <= now {
			emit(c)
			if s.held != nil {
				emit(s.held)
				s.held = nil
			}
			continue
		}
		s.Delayed++
		s.seq++
		heap.Push(&s.q, delayed{due, s.seq, c})
	}
}

// Due emits the packets whose time has come and reports when the next one is due (0: none).
func (s *Shaper) Due(now time.Duration, emit func(*[]byte)) time.Duration {
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
