/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* stats.h: per-CPU counters. A program declares
 *
 *     FP_COUNTERS(name, enum name_reason, NAME_MAX);
 *
 * with an enum of reasons ending in NAME_MAX (keying the map by the enum puts it in BTF, so
 * bpf2go -type hands the same constants to Go), and calls fp_count(&name, REASON) or
 * fp_count_n(&name, REASON, n). Per-CPU arrays need no atomics; user space sums the CPUs. */
#ifndef FLOWPLANE_STATS_H
#define FLOWPLANE_STATS_H

#include "common.h"

/* Per-CPU array: key = a value of the program's reason enum, value = __u64 count. */
#define FP_COUNTERS(name, key_enum, max)                                                           \
	struct {                                                                                   \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                                           \
		__type(key, key_enum);                                                             \
		__type(value, __u64);                                                              \
		__uint(max_entries, max);                                                          \
	} name SEC(".maps")

static __always_inline void fp_count_n(void *map, __u32 reason, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(map, &reason);

	if (v)
		*v += n;
}

static __always_inline void fp_count(void *map, __u32 reason)
{
	fp_count_n(map, reason, 1);
}

#endif
