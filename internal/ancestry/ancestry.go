// Package ancestry lists the processes this one descends from, outermost first: where a
// launcher (`ip netns exec`, containers) gave this process a mount namespace of its own with a
// fresh /sys, their /proc/PID/root still shows the host's mounts (the bpffs, cgroup v2).
package ancestry

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Chain returns PID 1 and this process's ancestors, outermost first (PID 1 first even when it
// is not an ancestor, as in some sandboxes; a caller skips what it cannot open).
func Chain() []int {
	var chain []int
	for pid := os.Getppid(); pid > 0 && len(chain) < 64; {
		chain = append(chain, pid)
		pid = parentOf(pid)
	}
	if len(chain) == 0 || chain[len(chain)-1] != 1 {
		chain = append(chain, 1)
	}
	for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
		chain[i], chain[j] = chain[j], chain[i]
	}
	return chain
}

// parentOf reads a process's parent from /proc/PID/stat (0 when it cannot).
func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid …: comm may hold spaces and parentheses, so cut at the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}
