// Package stats reads the per-CPU counters that bpf/include/stats.h declares: one
// BPF_MAP_TYPE_PERCPU_ARRAY keyed by a reason enum ending in _MAX, a __u64 per CPU.
package stats

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
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

// EnumNames names the counters of the reason enum called enum in spec's BTF as the C source
// spells them: each value's name without prefix, in lower case, in value order, up to the
// closing …_MAX. Go takes its counter names from the object, so a counter added in C cannot
// go unnamed.
func EnumNames(spec *ebpf.CollectionSpec, enum, prefix string) ([]string, error) {
	var e *btf.Enum
	if err := spec.Types.TypeByName(enum, &e); err != nil {
		return nil, fmt.Errorf("enum %s in the BPF object: %w", enum, err)
	}
	var names []string
	for i, v := range e.Values {
		if strings.HasSuffix(v.Name, "_MAX") {
			return names, nil
		}
		name, ok := strings.CutPrefix(v.Name, prefix)
		if !ok || v.Value != uint64(i) {
			return nil, fmt.Errorf("enum %s: %s = %d is not %s… = %d", enum, v.Name, v.Value, prefix, i)
		}
		names = append(names, strings.ToLower(name))
	}
	return nil, fmt.Errorf("enum %s has no closing …_MAX", enum)
}
