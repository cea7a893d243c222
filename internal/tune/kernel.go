package tune

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/flowplane/flowplane/internal/kernel"
)

// HostKernel reads what validation needs from the running kernel: CONFIG_HZ (kernel.HZ, the
// value the loader gives the program), the available congestion controls and the buffer caps.
func HostKernel() (Kernel, error) {
	hz, err := kernel.HZ()
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
