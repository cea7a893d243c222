package main

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
)

// CDF is a flow-size distribution in TrafficGenerator's format: lines "bytes probability",
// ascending, the last at probability 1; sizes between points are interpolated linearly.
type CDF struct {
	Name  string
	Size  []float64
	Prob  []float64
	Limit float64 // sizes above are cut to it (0: none)
}

// LoadCDF reads a CDF file; '#' starts a comment.
func LoadCDF(name, file string, limit float64) (*CDF, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &CDF{Name: name, Limit: limit}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s:%d: want \"bytes probability\"", file, line)
		}
		s, err1 := strconv.ParseFloat(fields[0], 64)
		p, err2 := strconv.ParseFloat(fields[1], 64)
		if err1 != nil || err2 != nil || p < 0 || p > 1 ||
			(len(c.Prob) > 0 && (p < c.Prob[len(c.Prob)-1] || s < c.Size[len(c.Size)-1])) {
			return nil, fmt.Errorf("%s:%d: want ascending sizes and probabilities in [0, 1]", file, line)
		}
		c.Size, c.Prob = append(c.Size, s), append(c.Prob, p)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(c.Prob) < 2 || c.Prob[len(c.Prob)-1] != 1 {
		return nil, fmt.Errorf("%s: the last probability must be 1", file)
	}
	return c, nil
}

// Quantile is the size at cumulative probability p.
func (c *CDF) Quantile(p float64) float64 {
	for i := 1; i < len(c.Prob); i++ {
		if p <= c.Prob[i] {
			span := c.Prob[i] - c.Prob[i-1]
			s := c.Size[i]
			if span > 0 {
				s = c.Size[i-1] + (p-c.Prob[i-1])/span*(c.Size[i]-c.Size[i-1])
			}
			if c.Limit > 0 && s > c.Limit {
				s = c.Limit
			}
			return max(s, 1)
		}
	}
	return c.Size[len(c.Size)-1]
}

// Sample draws a flow size.
func (c *CDF) Sample(r *rand.Rand) int { return int(c.Quantile(r.Float64())) }

// Mean is the mean flow size, the cap included (numerically, over 100,000 quantiles).
func (c *CDF) Mean() float64 {
	const n = 100000
	var sum float64
	for i := range n {
		sum += c.Quantile((float64(i) + 0.5) / n)
	}
	return sum / n
}

// PIASThresholds derives demotion edges from the distribution, as PIAS does from its
// workload. PIAS solves for the edges that minimize mean FCT under a queueing model; the rule
// here is the simple one that keeps its spirit: each of the bands carries an equal share of
// the bytes. A flow sends its bytes below edge e₁ in band 0, those between e₁ and e₂ in band 1,
// and so on, so e_k is where the mean of min(size, e_k) reaches k/bands of the mean size: the
// top band holds the many small flows whole and the heads of the long ones.
func (c *CDF) PIASThresholds(bands int) []uint64 {
	const n = 20000
	sizes := make([]float64, n)
	for i := range n {
		sizes[i] = c.Quantile((float64(i) + 0.5) / n)
	}
	sentBelow := func(x float64) float64 { // mean of min(size, x)
		var sum float64
		for _, s := range sizes {
			sum += min(s, x)
		}
		return sum / n
	}
	mean := sentBelow(c.Size[len(c.Size)-1] + 1)
	var edges []uint64
	for k := 1; k < bands; k++ {
		want := mean * float64(k) / float64(bands)
		lo, hi := 1.0, c.Size[len(c.Size)-1]
		for range 60 {
			mid := (lo + hi) / 2
			if sentBelow(mid) < want {
				lo = mid
			} else {
				hi = mid
			}
		}
		if e := uint64(hi); len(edges) == 0 || e > edges[len(edges)-1] {
			edges = append(edges, e)
		}
	}
	return edges
}
