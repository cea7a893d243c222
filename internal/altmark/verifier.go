package altmark

import (
	"github.com/flowplane/flowplane/internal/verifier"
)

// VerifierCases are the probe's and the marker's load configurations for the verifier budget
// check (internal/verifier): per carrier, the fewest options (count only, every protocol) and
// every option that adds code (sampling, a protocol filter, backbone and port selectors,
// per-flow IDs, double marking, Hop-by-Hop).
func VerifierCases() []verifier.Case {
	var cases []verifier.Case
	for _, c := range []string{carrierDSCP, carrierIPv4Flag, carrierIPv6AltMrk} {
		code := carrierCodes[c]
		cases = append(cases,
			verifier.Case{Name: "altmark probe " + c + " count-only", Spec: verifier.WithVars(loadProbe, map[string]any{
				"carrier": code, "sampling": uint32(0)})},
			verifier.Case{Name: "altmark probe " + c + " all options", Spec: verifier.WithVars(loadProbe, map[string]any{
				"carrier": code, "sampling": uint32(1), "proto_filter": uint32(1), "backbone": uint32(1),
				"proto_mask": [8]uint32{1 << 6, 0, 0, 0, 0, 0, 0, 0}})},
			verifier.Case{Name: "altmark marker " + c + " plain", Spec: verifier.WithVars(loadMarker, map[string]any{
				"carrier": uint32(carrierCode(c))})},
			verifier.Case{Name: "altmark marker " + c + " all options", Spec: verifier.WithVars(loadMarker, map[string]any{
				"carrier": uint32(carrierCode(c)), "per_flow_id": uint32(1), "double_packets": uint32(2),
				"any_proto": uint32(0), "proto_mask": [8]uint32{1 << 6, 0, 0, 0, 0, 0, 0, 0},
				"sel_src": uint32(1), "sel_dst": uint32(1), "sel_backbone": uint32(1), "sel_ports": uint32(1),
				"sport_lo": uint16(1), "sport_hi": uint16(1000), "dport_lo": uint16(1), "dport_hi": uint16(1000)})},
		)
		if c == carrierIPv6AltMrk {
			cases = append(cases, verifier.Case{Name: "altmark marker " + c + " hop-by-hop", Spec: verifier.WithVars(loadMarker, map[string]any{
				"carrier": uint32(carrierCode(c)), "hop_by_hop": uint32(1), "per_flow_id": uint32(1), "mtu": uint32(1500)})})
		}
	}
	return cases
}
