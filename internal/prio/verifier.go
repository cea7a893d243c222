package prio

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/flowplane/flowplane/internal/verifier"
)

// VerifierCases are the classifier's and the host program's load configurations for the
// verifier budget check (internal/verifier): every scheme with the flow cache and all
// thresholds, and the host program with the most selectors, with and without refresh limits.
func VerifierCases() []verifier.Case {
	var cases []verifier.Case
	for _, s := range schemes {
		for _, slots := range []uint32{0, cacheSlots} {
			vars := map[string]any{
				"scheme": s.code(), "nleaves": uint32(classifierPrioLimitPRIO_MAX_LEAVES),
				"max_claim": uint32(classifierPrioLimitPRIO_MAX_BANDS - 1), "nthresh": uint32(classifierPrioLimitPRIO_MAX_THRESH),
				"thresh":             [8]uint64{1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24},
				"change_interval_ns": uint64(1e6), "idle_reset_ns": uint64(1e7), "move_gap_ns": uint64(1e6),
				"cache_slots": slots,
			}
			load := verifier.WithVars(loadClassifier, vars)
			cases = append(cases, verifier.Case{
				Name: fmt.Sprintf("prio classifier %s cache %d", s, slots),
				Spec: func() (*ebpf.CollectionSpec, error) {
					spec, err := load()
					if err != nil {
						return nil, err
					}
					spec.Maps["prio_cache"].MaxEntries = max(slots, 1)
					spec.Maps["prio_gen"].MaxEntries = max(slots, 1)
					return spec, nil
				},
			})
		}
	}
	for _, refresh := range []uint64{0, uint64(1e9)} {
		cases = append(cases, verifier.Case{
			Name: fmt.Sprintf("prio host refresh %d", refresh),
			Spec: verifier.WithVars(loadHost, map[string]any{
				"nselectors": uint32(prioMaxSelects), "refresh_ns": refresh, "min_interval_ns": refresh / 10}),
		})
	}
	return cases
}
