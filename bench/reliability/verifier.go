package main

import (
	"context"
	"fmt"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/verifier"
	"github.com/flowplane/flowplane/internal/verifier/programs"
)

// The verifier part loads every BPF program in each configuration that changes its code
// (internal/verifier/programs, as TestVerifierBudget) and reports the instructions the kernel's
// verifier processed, against its 1,000,000 limit.
func init() {
	register(part{name: "verifier", title: "Verifier budget", run: func(context.Context) ([]*report.Table, any, error) {
		counts, err := verifier.MeasureAll(programs.Cases())
		if err != nil {
			return nil, nil, err
		}
		t := &report.Table{
			Title:   "Verifier budget",
			Columns: []string{"configuration", "program", "verified instructions", "% of limit"},
			Notes: []string{fmt.Sprintf("Instructions the verifier processed to load each program (verified_insns), of its %d limit; a program above %.0f %% fails TestVerifierBudget.",
				verifier.Limit, 100*verifier.MaxShare)},
		}
		for _, c := range counts {
			pct := 100 * c.Share()
			t.Add(c.Case, c.Program, fmt.Sprint(c.Insns), fmt.Sprintf("%.1f", pct))
			t.Goal(report.AtMost("% of limit", pct, 100*verifier.MaxShare))
		}
		return []*report.Table{t}, counts, nil
	}})
}
