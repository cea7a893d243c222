// Package kernel reads facts about the running kernel that BPF programs and their loaders
// must agree on.
package kernel

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

var hz = sync.OnceValues(func() (int, error) {
	n, err := configHZ()
	if err == nil {
		return n, nil
	}
	c, _, cerr := CalibrateHZ()
	if cerr != nil {
		return 0, fmt.Errorf("%w; calibrating jiffies against the monotonic clock failed too: %w", err, cerr)
	}
	return c, nil
})

// HZ is CONFIG_HZ, the jiffy rate, from /boot/config-$(uname -r) or /proc/config.gz (where a BPF
// program's `extern int CONFIG_HZ __kconfig` would come from; flowplane's programs get it from
// here as a load-time constant instead). Where neither file
// exists (containers often have none), it is calibrated: jiffies counted against
// CLOCK_MONOTONIC, rounded to a value CONFIG_HZ can take (CalibrateHZ).
func HZ() (int, error) { return hz() }

// ConfigHZ is CONFIG_HZ as the kernel config files say, without the calibration fallback.
func ConfigHZ() (int, error) { return configHZ() }

func configHZ() (int, error) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return 0, fmt.Errorf("uname: %w", err)
	}
	release := unix.ByteSliceToString(uts.Release[:])
	var r io.Reader
	if f, err := os.Open("/boot/config-" + release); err == nil {
		defer f.Close()
		r = f
	} else if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		gz, err := gzip.NewReader(f)
		if err != nil {
			return 0, fmt.Errorf("read /proc/config.gz: %w", err)
		}
		r = gz
	} else {
		return 0, fmt.Errorf("no kernel config (/boot/config-%s or /proc/config.gz): CONFIG_HZ is needed to convert between time and jiffies", release)
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CONFIG_HZ="); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return 0, fmt.Errorf("kernel config has CONFIG_HZ=%q", v)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("kernel config has no CONFIG_HZ")
}
