package lab

import (
	"github.com/flowplane/flowplane/internal/verifier"
)

// VerifierCases are the loss programs' load configurations for the verifier budget check
// (internal/verifier): no loss and some.
func VerifierCases() []verifier.Case {
	return []verifier.Case{
		{Name: "lab loss 0%", Spec: verifier.WithVars(loadLoss, map[string]any{"loss_threshold": lossThreshold(0)})},
		{Name: "lab loss 10%", Spec: verifier.WithVars(loadLoss, map[string]any{"loss_threshold": lossThreshold(10)})},
	}
}
