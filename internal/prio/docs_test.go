package prio

import (
	"slices"
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

// The counters' names come from the C enums (stats.EnumNames): every counter is named, and the
// names status prints stay what they were.
func TestCounterNamesFromTheObjects(t *testing.T) {
	router := []string{"fifo", "parsed", "sctp", "no_option", "malformed", "untrusted", "capped", "other", "band_change", "change_held", "no_state", "idle_reset", "move_wait", "table"}
	host := []string{"matched", "unmatched", "written", "no_room", "no_tcp_sock", "unchanged", "no_storage", "held", "deferred"}
	if got := routerStatNames(); !slices.Equal(got, router) || len(got) != int(classifierPrioStatPRIO_STAT_MAX) {
		t.Errorf("router counters %v, want %v (%d)", got, router, classifierPrioStatPRIO_STAT_MAX)
	}
	if got := hostCounterNames(); !slices.Equal(got, host) || len(got) != int(hostPrioHostStatPRIO_HOST_STAT_MAX) {
		t.Errorf("host counters %v, want %v (%d)", got, host, hostPrioHostStatPRIO_HOST_STAT_MAX)
	}
}
