// Package clock abstracts time so protocol code runs on the wall clock in production and on a
// virtual clock in tests, where timers fire deterministically when the test advances time.
package clock

import (
	"container/heap"
	"sync"
	"time"
)

// Clock gives the current time and schedules callbacks.
type Clock interface {
	// Now is the time since an arbitrary fixed origin; it only grows.
	Now() time.Duration
	// AfterFunc calls f in its own goroutine (real clock) or from Advance (virtual clock).
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a scheduled callback.
type Timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

// Real is the wall clock.
type Real struct{ start time.Time }

// NewReal returns the wall clock with its origin now.
func NewReal() *Real { return &Real{start: time.Now()} }

func (r *Real) Now() time.Duration { return time.Since(r.start) }

func (r *Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Virtual is a clock that only moves when told to. Timers run in the goroutine calling Advance
// or Run, one at a time, in deadline order (ties in scheduling order), so tests are reproducible.
type Virtual struct {
	mu   sync.Mutex
	now  time.Duration
	seq  uint64
	heap timerHeap
}

// NewVirtual returns a virtual clock at time zero.
func NewVirtual() *Virtual { return &Virtual{} }

func (v *Virtual) Now() time.Duration {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.now
}

type vtimer struct {
	v     *Virtual
	when  time.Duration
	seq   uint64
	f     func()
	index int // in heap, -1 when not scheduled
}

func (v *Virtual) AfterFunc(d time.Duration, f func()) Timer {
	t := &vtimer{v: v, f: f, index: -1}
	t.Reset(d)
	return t
}

func (t *vtimer) Stop() bool {
	t.v.mu.Lock()
	defer t.v.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.v.heap, t.index)
	return true
}

func (t *vtimer) Reset(d time.Duration) bool {
	v := t.v
	v.mu.Lock()
	defer v.mu.Unlock()
	if d < 0 {
		d = 0
	}
	was := t.index >= 0
	if was {
		heap.Remove(&v.heap, t.index)
	}
	v.seq++
	t.when, t.seq = v.now+d, v.seq
	heap.Push(&v.heap, t)
	return was
}

// Advance moves time forward by d, firing every timer due on the way.
func (v *Virtual) Advance(d time.Duration) {
	v.mu.Lock()
	end := v.now + d
	v.mu.Unlock()
	v.runUntil(end)
}

func (v *Virtual) runUntil(end time.Duration) {
	for {
		v.mu.Lock()
		if len(v.heap) == 0 || v.heap[0].when > end {
			v.now = max(v.now, end)
			v.mu.Unlock()
			return
		}
		t := heap.Pop(&v.heap).(*vtimer)
		v.now = max(v.now, t.when)
		v.mu.Unlock()
		t.f()
	}
}

// Step fires the next timer, moving time to its deadline; it reports false when none is left.
func (v *Virtual) Step() bool {
	v.mu.Lock()
	if len(v.heap) == 0 {
		v.mu.Unlock()
		return false
	}
	t := heap.Pop(&v.heap).(*vtimer)
	v.now = max(v.now, t.when)
	v.mu.Unlock()
	t.f()
	return true
}

// RunUntil fires timers until cond holds or limit of virtual time has passed; it reports cond.
func (v *Virtual) RunUntil(limit time.Duration, cond func() bool) bool {
	end := v.Now() + limit
	for !cond() {
		v.mu.Lock()
		if len(v.heap) == 0 || v.heap[0].when > end {
			v.now = max(v.now, end)
			v.mu.Unlock()
			return cond()
		}
		v.mu.Unlock()
		v.Step()
	}
	return true
}

type timerHeap []*vtimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].when != h[j].when {
		return h[i].when < h[j].when
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*vtimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.index = -1
	return t
}
