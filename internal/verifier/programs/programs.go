// Package programs lists the load configurations of every BPF program flowplane loads, for the
// verifier budget check (internal/verifier): its test and make bench's reliability section.
package programs

import (
	"slices"

	"github.com/flowplane/flowplane/internal/altmark"
	"github.com/flowplane/flowplane/internal/conntrack"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/prio"
	"github.com/flowplane/flowplane/internal/tune"
	"github.com/flowplane/flowplane/internal/verifier"
)

// Cases are every subsystem's verifier cases.
func Cases() []verifier.Case {
	return slices.Concat(conntrack.VerifierCases(), prio.VerifierCases(), tune.VerifierCases(),
		altmark.VerifierCases(), lab.VerifierCases())
}
