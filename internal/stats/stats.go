// Package stats reads the per-CPU counters that bpf/include/stats.h declares: one
// BPF_MAP_TYPE_PERCPU_ARRAY keyed by a reason enum ending in _MAX, a __u64 per CPU.
package stats

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// Sum returns counter key of m summed over every CPU.
func Sum(m *ebpf.Map, key uint32) (uint64, error) {
	var perCPU []uint64
	if err := m.Lookup(key, &perCPU); err != nil {
		return 0, fmt.Errorf("read counter %d of %s: %w", key, m, err)
	}
	return Total(perCPU), nil
}

// Total sums one per-CPU value: for per-CPU maps keyed otherwise than by a reason enum (a
// per-CPU hash read with an iterator).
func Total(perCPU []uint64) uint64 {
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n
}

// All returns every counter of m (keys 0 … max_entries-1), each summed over every CPU.
func All(m *ebpf.Map) ([]uint64, error) {
	out := make([]uint64, m.MaxEntries())
	for k := range out {
		n, err := Sum(m, uint32(k))
		if err != nil {
			return nil, err
		}
		out[k] = n
	}
	return out, nil
}
