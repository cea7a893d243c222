package tune

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// HostKernel reads what validation needs from the running kernel: CONFIG_HZ from its config
// (the same source the program's __kconfig CONFIG_HZ is filled from), the available congestion
// controls and the buffer caps.
func HostKernel() (Kernel, error) {
	hz, err := configHZ()
	if err != nil {
		return Kernel{}, err
	}
	k := Kernel{HZ: hz}
	cc, err := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
	if err != nil {
		return k, fmt.Errorf("read available congestion controls: %w", err)
	}
	k.Congestion = strings.Fields(string(cc))
	k.WmemMax = readInt("/proc/sys/net/core/wmem_max")
	k.RmemMax = readInt("/proc/sys/net/core/rmem_max")
	return k, nil
}

func readInt(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// configHZ finds CONFIG_HZ in /boot/config-$(uname -r) or /proc/config.gz.
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
		return 0, fmt.Errorf("no kernel config (/boot/config-%s or /proc/config.gz): CONFIG_HZ is needed to convert milliseconds to jiffies", release)
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CONFIG_HZ="); ok {
			hz, err := strconv.Atoi(v)
			if err != nil || hz <= 0 {
				return 0, fmt.Errorf("kernel config has CONFIG_HZ=%q", v)
			}
			return hz, nil
		}
	}
	return 0, fmt.Errorf("kernel config has no CONFIG_HZ")
}
