package vnet

import (
	"testing"

	"github.com/flowplane/flowplane/internal/doccheck"
)

// docs/vnet.md says what vnet makes of every key of the topology format (vnet has no keys of
// its own), and documents no other.
func TestDocConfigKeys(t *testing.T) {
	t.Parallel()
	page, err := doccheck.Read("../../docs/vnet.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range page.KeyProblems("Topology keys in vnet", doccheck.TopologyPaths()) {
		t.Error(p)
	}
}

// docs/vnet.md names every command and flag of `flowplane vnet`.
func TestDocCommands(t *testing.T) {
	t.Parallel()
	page, err := doccheck.Read("../../docs/vnet.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range page.CommandProblems(Command()) {
		t.Error(p)
	}
}
