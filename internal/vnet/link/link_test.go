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
