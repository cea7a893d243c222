package topo

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flowplane/flowplane/internal/impair"
	"github.com/flowplane/flowplane/internal/units"
)

// parseDelay reads a one-way delay such as 10ms, at most 10s.
func parseDelay(s string) (time.Duration, error) {
	d, err := units.ParseDuration(strings.TrimSpace(s))
	if errors.Is(err, units.ErrDurationRange) {
		d = -1 // out of range below
	} else if err != nil {
		return 0, fmt.Errorf("%q is not a duration; write e.g. 10ms or 1.5ms", s)
	}
	if d < 0 || d > 10*time.Second {
		return 0, fmt.Errorf("%q is out of range; a delay is from 0 to 10s", s)
	}
	return d, nil
}

// parseLoss reads a loss: a percentage (Bernoulli), or netem's burst model
// "gemodel P R [1-H [1-K]]" in percent (1-H defaults to 100 %, 1-K to 0 %). percent is the mean.
func parseLoss(s string) (percent float64, ge *impair.GilbertElliott, err error) {
	f := strings.Fields(s)
	if len(f) == 0 || f[0] != "gemodel" {
		p, err := units.ParsePercent(s)
		return p, nil, err
	}
	const usage = "write gemodel P R [1-H [1-K]] in percent, e.g. gemodel 1% 25%: P and R the chances of " +
		"entering and leaving the bad state, 1-H and 1-K the loss in the bad (default 100%) and good (default 0%) states"
	if len(f) < 3 || len(f) > 5 {
		return 0, nil, fmt.Errorf("%q: %s", s, usage)
	}
	v := []float64{0, 0, 1, 0}
	for i, x := range f[1:] {
		p, err := units.ParsePercent(x)
		if err != nil {
			return 0, nil, fmt.Errorf("%q: %v; %s", s, err, usage)
		}
		v[i] = p / 100
	}
	if v[1] == 0 {
		return 0, nil, fmt.Errorf("%q: R is 0, so a burst would never end; %s", s, usage)
	}
	ge = &impair.GilbertElliott{P: v[0], R: v[1], LossBad: v[2], LossGood: v[3]}
	return ge.MeanLoss() * 100, ge, nil
}
