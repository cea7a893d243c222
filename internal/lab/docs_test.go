package lab

import (
	"testing"

	"github.com/flowplane/flowplane/internal/doccheck"
)

// docs/lab.md documents every key of the topology format in its reference, and nothing else.
func TestDocConfigKeys(t *testing.T) {
	t.Parallel()
	page, err := doccheck.Read("../../docs/lab.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range page.KeyProblems("Topology file reference", doccheck.TopologyPaths()) {
		t.Error(p)
	}
}

// docs/lab.md names every command and flag of `flowplane lab`.
func TestDocCommands(t *testing.T) {
	t.Parallel()
	page, err := doccheck.Read("../../docs/lab.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range page.CommandProblems(Command()) {
		t.Error(p)
	}
}
