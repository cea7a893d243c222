package rpc

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

func TestPercentile(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for p, want := range map[float64]float64{50: 5, 99: 10, 10: 1, 100: 10} {
		if got := Percentile(xs, p); got != want {
			t.Errorf("p%g = %g, want %g", p, got, want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("empty percentile")
	}
}

// TestCallAndServe runs a server and RPCs of several sizes inside a fresh namespace.
func TestCallAndServe(t *testing.T) {
	testenv.Privileged(t)
	ns := testenv.Netns(t)
	var ln net.Listener
	if err := nsrun.Do(ns, func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { _ = Serve(ln) }()
	for _, size := range []int{0, 1, 10 << 10, 1 << 20} {
		err := nsrun.Do(ns, func() error {
			lat, err := Call(ln.Addr().String(), size, 64, 5*time.Second)
			if err == nil && lat <= 0 {
				t.Errorf("size %d: latency %v", size, lat)
			}
			return err
		})
		if err != nil {
			t.Errorf("RPC of %d bytes: %v", size, err)
		}
	}
}

// TestSlices runs two connect slices against a server on loopback (the loop's goroutines run on
// any thread, so not in a namespace entered by one): one JSON result per line read, each with
// connections and the process's CPU time.
func TestSlices(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { _ = Serve(ln) }()
	var out bytes.Buffer
	if err := Slices(ln.Addr().String(), strings.NewReader("50ms\n20ms\n"), &out); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(&out)
	for i := 0; i < 2; i++ {
		var r Result
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("slice %d: %v", i, err)
		}
		if r.Connect.Calls == 0 || r.Seconds <= 0 || r.CPUNs <= 0 {
			t.Errorf("slice %d: %+v", i, r)
		}
	}
	if dec.More() {
		t.Error("more results than slices")
	}
	if err := Slices("127.0.0.1:1", strings.NewReader("soon\n"), io.Discard); err == nil {
		t.Error("a bad duration was accepted")
	}
}
