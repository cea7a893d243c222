package impair

import (
	"math"
	"slices"
	"time"
)

// CDF is the probability that a packet is delayed at most d under delay, jitter and dist (before
// the clamp at 0, which the lab's checks never reach: jitter ≤ delay).
func CDF(dist Distribution, delay, jitter, d time.Duration) float64 {
	if jitter <= 0 {
		if d >= delay {
			return 1
		}
		return 0
	}
	x := float64(d-delay) / float64(jitter)
	switch dist {
	case Normal:
		return 0.5 * math.Erfc(-x/math.Sqrt2)
	case Pareto:
		// X = 1.5 + x·√0.75 is Pareto(1, 3): P(X ≤ v) = 1 − v⁻³ for v ≥ 1.
		v := 1.5 + x*math.Sqrt(0.75)
		if v <= 1 {
			return 0
		}
		return 1 - math.Pow(v, -3)
	default:
		return min(max((x+1)/2, 0), 1)
	}
}

// KS is the Kolmogorov–Smirnov statistic of samples against cdf: the largest distance between
// their empirical distribution and cdf. samples is sorted in place.
func KS(samples []time.Duration, cdf func(time.Duration) float64) float64 {
	slices.Sort(samples)
	n := float64(len(samples))
	var d float64
	for i, s := range samples {
		f := cdf(s)
		d = max(d, math.Abs(float64(i+1)/n-f), math.Abs(f-float64(i)/n))
	}
	return d
}

// KSCritical is the statistic KS stays below with probability 1 − alpha for n samples drawn
// from the distribution itself (the asymptotic Kolmogorov bound √(−ln(alpha/2)/2n)).
func KSCritical(n int, alpha float64) float64 {
	return math.Sqrt(-math.Log(alpha/2) / (2 * float64(n)))
}
