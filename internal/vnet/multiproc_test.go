package vnet

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/topo"
)

// Each node started on its own, as separate `vnet node` processes would be: they find each
// other only through the UDP ports derived from the file.
func TestStandaloneNodesFindEachOther(t *testing.T) {
	t.Parallel()
	tp, err := topo.Load("testdata/line.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*Node
	var lastErr error
	for try := 0; try < 5 && len(nodes) < len(tp.Nodes); try++ {
		for _, n := range nodes {
			n.Close()
		}
		nodes = nil
		base := 30000 + rand.IntN(3000)*8 // a random range: parallel test runs must not collide
		for _, tn := range tp.Nodes {
			n, err := StartNode(tp, tn.Name, Options{BasePort: base})
			if err != nil {
				lastErr = err
				break
			}
			nodes = append(nodes, n)
		}
	}
	if len(nodes) < len(tp.Nodes) {
		t.Fatalf("could not bind ports: %v", lastErr)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.Close()
		}
	})
	h1, h2 := nodes[0], nodes[3]
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := h1.Ping(ctx, h2.Ifaces()[0].Addr.Addr(), 1, 0, 64)
		cancel()
		if err == nil && r.Reply {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("h1 cannot reach h2 across standalone nodes: %+v %v", r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
