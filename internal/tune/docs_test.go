package tune

import (
	"testing"

	"github.com/flowplane/flowplane/internal/docscheck"
)

// TestDocsConfigurationKeys: docs/tune.md's configuration reference documents exactly the keys
// the policy decoder accepts, at every level.
func TestDocsConfigurationKeys(t *testing.T) {
	docscheck.Read(t, "../../docs/tune.md").CheckKeys(t, policyKeys, ruleKeys, docscheck.Qualify("match", matchKeys),
		profileKeys, docscheck.Qualify("keepalive", keepaliveKeys), docscheck.Qualify("react", reactKeys))
}

// TestDocsCommands: every tune command and flag is in docs/tune.md.
func TestDocsCommands(t *testing.T) {
	docscheck.Read(t, "../../docs/tune.md").CheckCommands(t, Command())
}
