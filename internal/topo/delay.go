package topo

import (
	"fmt"
	"strings"
	"time"
)

// parseDelay reads a one-way delay such as 10ms, at most 10s.
func parseDelay(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration; write e.g. 10ms or 1.5ms", s)
	}
	if d < 0 || d > 10*time.Second {
		return 0, fmt.Errorf("%q is out of range; a delay is from 0 to 10s", s)
	}
	return d, nil
}
