package altmark

import (
	"testing"

	"github.com/flowplane/flowplane/internal/docscheck"
)

// TestDocsConfigurationKeys: docs/altmark.md's two references document exactly the keys the
// probe's and the marker's decoders accept.
func TestDocsConfigurationKeys(t *testing.T) {
	docscheck.ReadSection(t, "../../docs/altmark.md", "Probe configuration").CheckKeys(t,
		configKeys, docscheck.Qualify("interfaces[]", interfaceKeys), docscheck.Qualify("ipfix", ipfixKeys))
	docscheck.ReadSection(t, "../../docs/altmark.md", "Marker configuration").CheckKeys(t,
		markKeys, docscheck.Qualify("double", doubleKeys), docscheck.Qualify("select", selectKeys))
}

// TestDocsCommands: every altmark command and flag is in docs/altmark.md.
func TestDocsCommands(t *testing.T) {
	docscheck.Read(t, "../../docs/altmark.md").CheckCommands(t, Command())
}
