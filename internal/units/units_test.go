package units

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRates(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]uint64{"1gbit": 1e9, "100Mbit": 1e8, "1.5mbit": 1.5e6, "500kbit/s": 5e5, "8000bit": 8000} {
		got, err := ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	// Each refusal says what is wrong and how to write it.
	for in, want := range map[string]string{
		"0":          "a rate of 0 sends nothing",
		"0mbit":      "a rate of 0 sends nothing",
		"100":        `"100" has no unit; write one, e.g. 100mbit`,
		"10furlongs": `unknown unit "furlongs"`,
		"1mbps":      "bytes per second",
		"1kbit":      "out of range",
		"fast":       "not a rate",
	} {
		if _, err := ParseRate(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRate(%q) = %v; want an error with %q", in, err, want)
		}
	}
	for bps, want := range map[uint64]string{1e9: "1gbit", 1.5e6: "1500kbit", 2e5: "200kbit"} {
		if got := FormatRate(bps); got != want {
			t.Errorf("FormatRate(%d) = %s, want %s", bps, got, want)
		}
	}
}

func TestSizes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]uint64{"1500": 1500, "100KB": 1e5, "1.5MB": 1.5e6, "64KiB": 65536, "2 GiB": 2 << 30, "0": 0} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "KB", "1 XB", "-1", "1e3"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in      string
		want    time.Duration
		tooLong bool
		bad     bool
	}{
		{in: "1.5s", want: 1500 * time.Millisecond},
		{in: "2h30m", want: 150 * time.Minute},
		{in: "-1ms", want: -time.Millisecond},
		{in: "3000000h", tooLong: true},
		{in: "99999999999999999999ns", tooLong: true},
		{in: "+3000000h", tooLong: true},
		{in: "-3000000h", bad: true},
		{in: ".5s", want: 500 * time.Millisecond},
		{in: "1.s", want: time.Second},
		{in: "+0", want: 0},
		{in: "1us", want: time.Microsecond},
		{in: "1µs", want: time.Microsecond},
		{in: "9223372036854775807ns", want: time.Duration(1<<63 - 1)},
		{in: "9223372036854775808ns", tooLong: true},
		{in: "+-1s", bad: true},
		{in: "soon", bad: true},
		{in: "10", bad: true},
		{in: "5x", bad: true},
		{in: "", bad: true},
	} {
		d, err := ParseDuration(c.in)
		switch {
		case c.tooLong:
			if !errors.Is(err, ErrDurationRange) {
				t.Errorf("%q: err %v, want ErrDurationRange", c.in, err)
			}
		case c.bad:
			if err == nil || errors.Is(err, ErrDurationRange) {
				t.Errorf("%q: err %v, want a syntax error", c.in, err)
			}
		case err != nil || d != c.want:
			t.Errorf("%q = %v, %v; want %v", c.in, d, err, c.want)
		}
	}
}
