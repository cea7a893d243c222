package conntrack

import (
	"github.com/cilium/ebpf"

	"github.com/flowplane/flowplane/internal/verifier"
)

// VerifierCases are the conntrack programs' load configurations for the verifier budget check
// (internal/verifier): the XDP and tc builds, each as a firewall and track-only.
func VerifierCases() []verifier.Case {
	var cases []verifier.Case
	for _, hook := range []string{HookXDP, HookTC} {
		for _, mode := range []string{"firewall", "track"} {
			cases = append(cases, verifier.Case{
				Name: "conntrack " + hook + " " + mode,
				Spec: func() (*ebpf.CollectionSpec, error) { return programSpec(hook == HookTC, mode == "track") },
			})
		}
	}
	return cases
}
