package verifier

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	under := Count{Case: "c", Program: "small", Insns: Limit * 8 / 10}
	over := Count{Case: "c", Program: "big", Insns: Limit*8/10 + 1}
	if err := Check([]Count{under}); err != nil {
		t.Errorf("%d instructions refused: %v", under.Insns, err)
	}
	err := Check([]Count{under, over})
	if err == nil || !strings.Contains(err.Error(), "program big") || strings.Contains(err.Error(), "small") {
		t.Errorf("Check: %v, want program big named alone", err)
	}
	if tb := Table([]Count{under, over}); !strings.Contains(tb, "800001") || !strings.Contains(tb, "80.0") {
		t.Errorf("Table:\n%s", tb)
	}
}
