// Package verifier measures how much of the kernel verifier's budget flowplane's BPF programs
// use: each subsystem lists its programs' load configurations (Case), Measure loads them and
// reads the instructions the verifier processed (BPF_OBJ_GET_INFO_BY_FD's verified_insns), and
// Check refuses any above MaxShare of Limit, so a change that would no longer load on a kernel
// with less headroom fails a test first.
package verifier

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/cilium/ebpf"
)

// Limit is the verifier's budget of processed instructions per program
// (BPF_COMPLEXITY_LIMIT_INSNS): a program needing more fails to load.
const Limit = 1_000_000

// MaxShare is the share of Limit a program may use: the rest is headroom for the next change
// and for other kernels' verifiers, which prune differently.
const MaxShare = 0.80

// Case is one configuration of one BPF object: the load-time constants that change which code
// the verifier walks (volatile const values make branches dead) set in Spec.
type Case struct {
	// Name names the configuration: "conntrack xdp firewall".
	Name string
	// Spec returns the collection spec, its variables set as the subsystem's loader sets them.
	Spec func() (*ebpf.CollectionSpec, error)
}

// Count is one loaded program's verified instruction count.
type Count struct {
	Case    string // Case.Name
	Program string // the program's name in the object
	Insns   uint32 // instructions the verifier processed
}

// Share is c's fraction of Limit.
func (c Count) Share() float64 { return float64(c.Insns) / Limit }

// Measure loads every program of c (maps created fresh, nothing attached or pinned) and
// returns their counts, by program name.
func Measure(c Case) ([]Count, error) {
	spec, err := c.Spec()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Name, err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("%s: load: %+v", c.Name, ve)
		}
		return nil, fmt.Errorf("%s: load: %w", c.Name, err)
	}
	defer coll.Close()
	var out []Count
	for name, p := range coll.Programs {
		info, err := p.Info()
		if err != nil {
			return nil, fmt.Errorf("%s: %s: program info: %w", c.Name, name, err)
		}
		n, ok := info.VerifiedInstructions()
		if !ok {
			return nil, fmt.Errorf("%s: %s: the kernel does not report verified instructions (Linux 5.16 or later does)", c.Name, name)
		}
		out = append(out, Count{Case: c.Name, Program: name, Insns: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Program < out[j].Program })
	return out, nil
}

// MeasureAll measures every case, in order.
func MeasureAll(cases []Case) ([]Count, error) {
	var all []Count
	for _, c := range cases {
		cs, err := Measure(c)
		if err != nil {
			return nil, err
		}
		all = append(all, cs...)
	}
	return all, nil
}

// Check returns an error naming every count above MaxShare of Limit.
func Check(counts []Count) error {
	var errs []error
	for _, c := range counts {
		if c.Share() > MaxShare {
			errs = append(errs, fmt.Errorf("%s: program %s: %d verified instructions, %.1f%% of the verifier's %d, above the %.0f%% allowed: move work into global (__noinline) functions or cut branches (docs/architecture.md#verifier-budget)",
				c.Case, c.Program, c.Insns, 100*c.Share(), Limit, 100*MaxShare))
		}
	}
	return errors.Join(errs...)
}

// WithVars is a Case.Spec: load's spec with vars (name: value) set.
func WithVars(load func() (*ebpf.CollectionSpec, error), vars map[string]any) func() (*ebpf.CollectionSpec, error) {
	return func() (*ebpf.CollectionSpec, error) {
		spec, err := load()
		if err != nil {
			return nil, err
		}
		for name, v := range vars {
			sv, ok := spec.Variables[name]
			if !ok {
				return nil, fmt.Errorf("no variable %s", name)
			}
			if err := sv.Set(v); err != nil {
				return nil, fmt.Errorf("set %s: %w", name, err)
			}
		}
		return spec, nil
	}
}

// Table formats counts as a text table: case, program, verified instructions, % of Limit.
func Table(counts []Count) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "configuration\tprogram\tverified insns\t% of limit\t")
	for _, c := range counts {
		fmt.Fprintf(w, "%s\t%s\t%d\t%.1f\t\n", c.Case, c.Program, c.Insns, 100*c.Share())
	}
	w.Flush()
	return b.String()
}
