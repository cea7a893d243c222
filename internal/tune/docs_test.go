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

// Every counter of enum tune_stat has a JSON name: a counter added in C must be named here.
func TestEveryCounterIsNamed(t *testing.T) {
	for s := tuneTuneStat(0); s < tuneTuneStatTUNE_STAT_MAX; s++ {
		if _, ok := statNames[s]; !ok {
			t.Errorf("tune_stat %d has no name in statNames", s)
		}
	}
}
