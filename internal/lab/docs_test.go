package lab

import (
	"testing"

	"github.com/flowplane/flowplane/internal/docscheck"
)

// docs/lab.md's reference documents exactly the keys of the topology format.
func TestDocsConfigurationKeys(t *testing.T) {
	docscheck.ReadSection(t, "../../docs/lab.md", "Topology file reference").CheckKeys(t, docscheck.TopologyPaths())
}

// TestDocsCommands: every lab command and flag is in docs/lab.md.
func TestDocsCommands(t *testing.T) {
	docscheck.ReadSection(t, "../../docs/lab.md", "Topology file reference").CheckCommands(t, Command())
}
