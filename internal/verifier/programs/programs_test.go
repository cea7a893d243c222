package programs

import (
	"testing"

	"github.com/flowplane/flowplane/internal/testenv"
	"github.com/flowplane/flowplane/internal/verifier"
)

// TestVerifierBudget loads every program in every configuration that changes its code, logs
// the instructions the verifier processed, and fails for any above verifier.MaxShare of the
// limit.
func TestVerifierBudget(t *testing.T) {
	testenv.Privileged(t)
	counts, err := verifier.MeasureAll(Cases())
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + verifier.Table(counts))
	if err := verifier.Check(counts); err != nil {
		t.Fatal(err)
	}
}
