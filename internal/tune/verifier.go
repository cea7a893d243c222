package tune

import (
	"github.com/flowplane/flowplane/internal/verifier"
)

// VerifierCases is the tune program's load configuration for the verifier budget check
// (internal/verifier): its one constant, hz, changes no path.
func VerifierCases() []verifier.Case {
	return []verifier.Case{{Name: "tune sockops", Spec: verifier.WithVars(loadTune, map[string]any{"hz": uint32(250)})}}
}
