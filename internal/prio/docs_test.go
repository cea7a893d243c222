package prio

import (
	"testing"

	"github.com/flowplane/flowplane/internal/docscheck"
	"github.com/flowplane/flowplane/internal/match"
)

// TestDocsConfigurationKeys: docs/prio.md's configuration reference documents exactly the keys
// the policy decoders accept (host policy, its selectors, router policy).
func TestDocsConfigurationKeys(t *testing.T) {
	docscheck.Read(t, "../../docs/prio.md").CheckKeys(t, hostKeys, match.Keys, routerKeys)
}

// TestDocsCommands: every prio command and flag is in docs/prio.md.
func TestDocsCommands(t *testing.T) {
	docscheck.Read(t, "../../docs/prio.md").CheckCommands(t, Command())
}
