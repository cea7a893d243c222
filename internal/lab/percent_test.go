package lab

import "testing"

func TestPercent(t *testing.T) {
	t.Parallel()
	avg, tenth := 1.0, 0.1 // variables: a constant expression would be computed exactly
	avg /= 26              // a gemodel average loss: 1/26
	for p, want := range map[float64]string{100 * avg: "3.846%", 0.5: "0.5%", 25: "25%", 100 * tenth * 3: "30%", 0: "-"} {
		if got := percentOrDash(p); got != want {
			t.Errorf("percentOrDash(%v) = %q, want %q", p, got, want)
		}
	}
}
