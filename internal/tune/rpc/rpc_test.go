package rpc

import (
	"net"
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

// TestSetupLoop runs the setup loop for a moment inside a fresh namespace: connections, wall
// and CPU time.
func TestSetupLoop(t *testing.T) {
	testenv.Privileged(t)
	ns := testenv.Netns(t)
	var r Result
	if err := nsrun.Do(ns, func() (err error) { r, err = SetupLoop(50 * time.Millisecond); return err }); err != nil {
		t.Fatal(err)
	}
	if r.Connect.Calls == 0 || r.Seconds < 0.05 || r.CPUNs <= 0 {
		t.Errorf("%+v", r)
	}
}
