package vnet

import (
	"path/filepath"
	"testing"

	"github.com/flowplane/flowplane/internal/topo"
)

// The shipped examples must load, and the ring must converge and survive a link going down.
func TestExamplesLoad(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("../../examples/vnet-*.yaml")
	if len(files) == 0 {
		t.Fatal("no examples/vnet-*.yaml found")
	}
	for _, f := range files {
		if _, err := topo.Load(f); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
}

func TestExampleRingReroutes(t *testing.T) {
	t.Parallel()
	out, err := runCLI(t, "exec", "--config", "../../examples/vnet-ring.yaml",
		"-c", "h1 ping 198.18.11.2 3", "-c", "link 3 down", "-c", "sleep 1s", "-c", "h1 ping 198.18.11.2 3", "-c", "h1 traceroute 198.18.11.2")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
