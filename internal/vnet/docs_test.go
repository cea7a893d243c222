package vnet

import (
	"testing"

	"github.com/flowplane/flowplane/internal/docscheck"
)

// docs/vnet.md's reference documents exactly the keys of the topology format.
func TestDocsConfigurationKeys(t *testing.T) {
	docscheck.ReadSection(t, "../../docs/vnet.md", "Topology keys in vnet").CheckKeys(t, docscheck.TopologyPaths())
}

// TestDocsCommands: every vnet command and flag is in docs/vnet.md.
func TestDocsCommands(t *testing.T) {
	docscheck.Read(t, "../../docs/vnet.md").CheckCommands(t, Command())
}
