package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/flowplane/flowplane/bench/report"
)

// The random differential is a test of internal/conntrack (TestDifferentialRandom, built on the
// scripted differential's test harness, so nothing of it is in bin/flowplane): this part runs it
// with `go test` for DIFFTIME (default 10m) and reads the summary it writes to $DIFFJSON.
func init() {
	register(part{name: "difftest", title: "conntrack against nf_conntrack", run: runDifftest})
}

// diffSummary is the part of TestDifferentialRandom's $DIFFJSON this table shows.
type diffSummary struct {
	Seeds         []uint64 `json:"seeds"`
	Sequences     int      `json:"sequences"`
	Packets       int      `json:"packets"`
	PacketsAgreed int      `json:"packets_agreed"`
	States        int      `json:"states"`
	StatesAgreed  int      `json:"states_agreed"`
	Seconds       float64  `json:"seconds"`
	Fixed         int      `json:"fixed"`
	NotReproduced int      `json:"not_reproduced"`
	Disagreements []struct {
		Seed   uint64 `json:"seed"`
		Class  string `json:"class"`
		Reason string `json:"reason"`
	} `json:"disagreements"`
}

func runDifftest(ctx context.Context) ([]*report.Table, any, error) {
	diffTime, err := envDuration("DIFFTIME", 10*time.Minute)
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "fpdifftest")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "difftest.json")
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-timeout", "0", "-run", "^TestDifferentialRandom$", "./internal/conntrack")
	cmd.Dir = report.Root()
	cmd.Env = append(os.Environ(), "DIFFTIME="+diffTime.String(), "DIFFJSON="+out, "CI=true")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// Open disagreements fail the test; the summary still says what they were.
	runErr := cmd.Run()
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, nil, fmt.Errorf("difftest wrote no summary (go test: %v): %w", runErr, err)
	}
	var s diffSummary
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, nil, fmt.Errorf("difftest summary: %w", err)
	}
	class := map[string][]string{}
	reasons := map[string]int{}
	for _, d := range s.Disagreements {
		class[d.Class] = append(class[d.Class], fmt.Sprint(d.Seed))
		if d.Class == "accepted" {
			reasons[d.Reason]++
		}
	}
	var accepted []string
	for r, n := range reasons {
		accepted = append(accepted, fmt.Sprintf("%d %s", n, r))
	}
	sort.Strings(accepted)
	pct := func(n, of int) float64 {
		if of == 0 {
			return 100
		}
		return 100 * float64(n) / float64(of)
	}
	t := &report.Table{Title: "conntrack against nf_conntrack on random conversations", Columns: []string{"measure", "value"}}
	t.Add("run", fmt.Sprintf("%.0f s from seed %v", s.Seconds, s.Seeds))
	t.Add("sequences", s.Sequences)
	t.Add("packets compared", s.Packets)
	// Agreement stays below 100 % by the accepted differences: the goal is no open one.
	t.Add("per-packet agreement (delivered or not)", fmt.Sprintf("%.3f %%", pct(s.PacketsAgreed, s.Packets)))
	t.Add("final-state agreement (state, replied, assured, timeout class)", fmt.Sprintf("%.3f %% of %d connection states", pct(s.StatesAgreed, s.States), s.States))
	t.Add("disagreements fixed", fmt.Sprintf("%d (table tests in TestDifferentialMinimized)", s.Fixed))
	t.Add("disagreements accepted", fmt.Sprintf("%d (docs/conntrack.md): %s %s", len(class["accepted"]), strings.Join(accepted, "; "), seeds(class["accepted"])))
	t.Add("disagreements open", strings.TrimSpace(fmt.Sprintf("%d %s", len(class["open"]), seeds(class["open"]))))
	t.Goal(report.Check("open disagreements", "none", len(class["open"]) == 0))
	t.Add("not reproduced (timing)", s.NotReproduced)
	t.Notes = append(t.Notes, "Each packet goes to two labs in turn (nftables `ct state` rules over nf_conntrack; flowplane conntrack with XDP) with the same gaps; a sequence is up to 4 interleaved conversations. A disagreement is rerun, minimized by delta debugging and classified; `DIFFSEED=<seed> DIFFTIME=0 make difftest` reruns one sequence.")
	return []*report.Table{t}, s, nil
}

// seeds lists a few seeds.
func seeds(ss []string) string {
	if len(ss) == 0 {
		return ""
	}
	if len(ss) > 5 {
		ss = append(ss[:5:5], "…")
	}
	return "(seeds " + strings.Join(ss, ", ") + ")"
}
