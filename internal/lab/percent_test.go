package lab

import "testing"

func TestPercent(t *testing.T) {
	t.Parallel()
	for p, want := range map[float64]string{100.0 / 26: "3.846%", 0.5: "0.5%", 25: "25%", 100 * 0.1 * 3: "30%", 0: "-"} {
		if got := percentOrDash(p); got != want {
			t.Errorf("percentOrDash(%v) = %q, want %q", p, got, want)
		}
	}
}
