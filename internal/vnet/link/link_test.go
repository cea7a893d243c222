package link

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

func pair(t *testing.T, mtu int) (*UDP, *UDP) {
	t.Helper()
	lo := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}
	a, err := Listen(lo, mtu)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Listen(lo, mtu)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestUDPLinkCarriesPacketsInOrder(t *testing.T) {
	t.Parallel()
	a, b := pair(t, 1500)
	var mu sync.Mutex
	var got []string
	done := make(chan struct{})
	a.Start(b.LocalAddr(), func([]byte) {}, func() {})
	b.Start(a.LocalAddr(), func(p []byte) {
		mu.Lock()
		got = append(got, string(p))
		if len(got) == 1000 {
			close(done)
		}
		mu.Unlock()
	}, func() {})
	for i := 0; i < 1000; i++ {
		a.Send([]byte(fmt.Sprintf("packet %d", i)))
		if i%100 == 99 {
			time.Sleep(time.Millisecond) // stay within socket buffers
		}
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("only %d packets arrived", len(got))
	}
	for i, s := range got {
		if s != fmt.Sprintf("packet %d", i) {
			t.Fatalf("packet %d is %q", i, s)
		}
	}
	a.Send(make([]byte, 1501))
	if a.Stats.TxDropped.Load() != 1 {
		t.Fatal("oversized packet not dropped")
	}
}

func TestForeignSenderIgnored(t *testing.T) {
	t.Parallel()
	a, b := pair(t, 1500)
	c, _ := pair(t, 1500)
	got := make(chan []byte, 10)
	b.Start(a.LocalAddr(), func(p []byte) { got <- append([]byte(nil), p...) }, func() {})
	c.Start(b.LocalAddr(), func([]byte) {}, func() {})
	c.Send([]byte("intruder"))
	a.Start(b.LocalAddr(), func([]byte) {}, func() {})
	a.Send([]byte("neighbour"))
	select {
	case p := <-got:
		if string(p) != "neighbour" {
			t.Fatalf("got %q", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing arrived")
	}
	for b.Stats.RxForeign.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
}

// The shaper is tested on its own with virtual time: no sleeping, no timing assertions.
func TestShaperImpairments(t *testing.T) {
	t.Parallel()
	mk := func(n int) *[]byte { b := make([]byte, 100); b[0] = byte(n); return &b }
	run := func(im Impair, n int) (out []*[]byte, s *shaper) {
		s = newShaper(im)
		emit := func(b *[]byte) { out = append(out, b) }
		clone := func(b *[]byte) *[]byte { c := append([]byte(nil), *b...); return &c }
		for i := 0; i < n; i++ {
			s.admit(mk(i), time.Duration(i)*time.Millisecond, emit, clone, func(*[]byte) {})
		}
		s.due(time.Hour, emit)
		return out, s
	}
	out, s := run(Impair{Loss: 0.1, Seed: 1}, 10000)
	if s.lost < 800 || s.lost > 1200 || len(out) != 10000-int(s.lost) {
		t.Fatalf("loss 10%%: lost %d, delivered %d", s.lost, len(out))
	}
	out, s = run(Impair{Duplicate: 0.05, Seed: 2}, 10000)
	if len(out) != 10000+int(s.duplicated) || s.duplicated < 400 {
		t.Fatalf("duplicate: %d out, %d duplicated", len(out), s.duplicated)
	}
	out, s = run(Impair{Corrupt: 0.5, Seed: 3}, 1000)
	bad := 0
	for _, b := range out {
		for _, x := range (*b)[1:] {
			if x != 0 {
				bad++
				break
			}
		}
	}
	if s.corrupted < 400 || bad == 0 {
		t.Fatalf("corrupt: %d corrupted, %d seen", s.corrupted, bad)
	}
	out, s = run(Impair{Reorder: 0.2, Seed: 4}, 1000)
	inversions := 0
	for i := 1; i < len(out); i++ {
		if (*out[i])[0] < (*out[i-1])[0] {
			inversions++
		}
	}
	if len(out) != 1000 || inversions == 0 || s.reordered == 0 {
		t.Fatalf("reorder: %d out, %d inversions", len(out), inversions)
	}
	// Delay and rate: nothing leaves early; the rate spaces packets by their size.
	sh := newShaper(Impair{Delay: 10 * time.Millisecond, Rate: 8e6, Seed: 5})
	var got []*[]byte
	emit := func(b *[]byte) { got = append(got, b) }
	for i := 0; i < 10; i++ {
		sh.admit(mk(i), 0, emit, nil, nil)
	}
	if len(got) != 0 {
		t.Fatal("delayed packets left at once")
	}
	if next := sh.due(10*time.Millisecond+50*time.Microsecond, emit); len(got) != 0 || next != 10*time.Millisecond+100*time.Microsecond {
		t.Fatalf("rate: %d sent, next due %v", len(got), next)
	}
	sh.due(time.Second, emit)
	if len(got) != 10 {
		t.Fatalf("%d of 10 delivered", len(got))
	}
	// The delay queue is bounded: beyond queueMax waiting packets the shaper drops at the tail.
	sh = newShaper(Impair{Rate: 8e3, Seed: 6})
	got = got[:0]
	for i := 0; i < queueMax+10; i++ {
		sh.admit(mk(i), 0, emit, nil, func(*[]byte) {})
	}
	if len(sh.q)+len(got) != queueMax || sh.overflow != 10 {
		t.Fatalf("rate queue: %d waiting, %d sent, %d dropped; want %d kept, 10 dropped", len(sh.q), len(got), sh.overflow, queueMax)
	}
}
