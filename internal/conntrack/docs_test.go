package conntrack

import (
	"testing"

	"github.com/flowplane/flowplane/internal/docscheck"
)

// TestDocsConfigurationKeys: docs/conntrack.md's configuration reference documents exactly the
// keys the configuration decoder accepts.
func TestDocsConfigurationKeys(t *testing.T) {
	docscheck.Read(t, "../../docs/conntrack.md").CheckKeys(t, configKeys,
		docscheck.Qualify("timeouts", timeoutNames), docscheck.Qualify("allow", allowKeys), docscheck.Qualify("table", tableKeys))
}

// TestDocsCommands: every conntrack command and flag is in docs/conntrack.md.
func TestDocsCommands(t *testing.T) {
	docscheck.Read(t, "../../docs/conntrack.md").CheckCommands(t, Command())
}
