// Package units parses and formats the units of flowplane's configuration files: rates in tc's
// bit units, percentages, sizes and durations.
package units

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

var rateRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([a-z]*(?:/s)?)$`)

var rateUnits = map[string]float64{"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}

// ParseRate reads a rate in tc's bit units: 500kbit, 100mbit, 1gbit.
func ParseRate(s string) (uint64, error) {
	m := rateRE.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return 0, fmt.Errorf("%q is not a rate; write a number and a unit, e.g. 100mbit or 1gbit", s)
	}
	unit := strings.TrimSuffix(m[2], "/s")
	if strings.HasSuffix(unit, "bps") {
		return 0, fmt.Errorf("%q is ambiguous: tc reads bps as bytes per second; write bits: kbit, mbit, gbit", s)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	if v == 0 {
		return 0, fmt.Errorf("%q: a rate of 0 sends nothing; give one above 0, e.g. 100mbit", s)
	}
	if unit == "" {
		return 0, fmt.Errorf("%q has no unit; write one, e.g. %smbit (bit, kbit, mbit, gbit or tbit)", s, m[1])
	}
	mult, ok := rateUnits[unit]
	if !ok {
		return 0, fmt.Errorf("%q has unknown unit %q; use bit, kbit, mbit, gbit or tbit", s, m[2])
	}
	bits := v * mult
	if bits < 8000 || bits > 1e12 {
		return 0, fmt.Errorf("%q is out of range; a rate is between 8kbit and 1tbit", s)
	}
	return uint64(math.Round(bits)), nil
}

// FormatRate writes bits per second the way tc does.
func FormatRate(bps uint64) string {
	for _, u := range []struct {
		name string
		mult uint64
	}{{"tbit", 1e12}, {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}} {
		if bps >= u.mult && bps%u.mult == 0 {
			return fmt.Sprintf("%d%s", bps/u.mult, u.name)
		}
	}
	if bps >= 1e6 {
		return fmt.Sprintf("%.3gmbit", float64(bps)/1e6)
	}
	return fmt.Sprintf("%dbit", bps)
}

// ParsePercent reads a probability in percent: 1, 0.5 or 2%.
func ParsePercent(s string) (float64, error) {
	t := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(s), "%"))
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q is not a percentage; write a number from 0 to 100, e.g. 1 or 0.5%%", s)
	}
	if v < 0 || v > 100 {
		return 0, fmt.Errorf("%q is out of range; a percentage is from 0 to 100", s)
	}
	return v, nil
}

var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)$`)

var sizeUnits = map[string]float64{"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}

// ParseSize reads a byte count: 1500, 100KB, 1.5MB, 64KiB (KB = 1000 bytes, KiB = 1024).
func ParseSize(s string) (uint64, error) {
	m := sizeRE.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return 0, fmt.Errorf("%q is not a size; write a number of bytes with an optional unit, e.g. 1500, 100KB or 64KiB", s)
	}
	mult, ok := sizeUnits[m[2]]
	if !ok {
		return 0, fmt.Errorf("%q has unknown unit %q; use B, KB, MB, GB, KiB, MiB or GiB", s, m[2])
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	if v*mult >= 1<<53 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return uint64(math.Round(v * mult)), nil
}

// durationRE is Go's duration grammar (time.ParseDuration): a sign, then numbers with units.
var durationRE = regexp.MustCompile(`^[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+$`)

// ErrDurationRange: a well-formed duration beyond what time.Duration holds (about 292 years).
var ErrDurationRange = errors.New("too long; the most is " + time.Duration(math.MaxInt64).String())

// ParseDuration is time.ParseDuration that tells a duration too long to hold (ErrDurationRange,
// e.g. 3000000h) from one that is not a duration at all, which Go reports alike. A negative one
// beyond the range stays Go's error: no caller takes a negative duration.
func ParseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil && !strings.HasPrefix(s, "-") && durationRE.MatchString(s) {
		return 0, ErrDurationRange
	}
	return d, err
}
