package clock

import (
	"testing"
	"time"
)

func TestVirtualFiresInOrderAndResets(t *testing.T) {
	v := NewVirtual()
	var got []string
	v.AfterFunc(30*time.Millisecond, func() { got = append(got, "c") })
	a := v.AfterFunc(10*time.Millisecond, func() { got = append(got, "a") })
	v.AfterFunc(20*time.Millisecond, func() {
		got = append(got, "b")
		v.AfterFunc(5*time.Millisecond, func() { got = append(got, "b2") }) // scheduled from a callback
	})
	a.Reset(40 * time.Millisecond)
	stopped := v.AfterFunc(15*time.Millisecond, func() { got = append(got, "never") })
	if !stopped.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	v.Advance(time.Second)
	if want := "b b2 c a"; join(got) != want {
		t.Fatalf("order %q, want %q", join(got), want)
	}
	if v.Now() != time.Second {
		t.Fatalf("now %v", v.Now())
	}
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}
