// Command reliability runs flowplane's hostile-input and fault suites for a set time and reports
// what they covered: conntrack against nf_conntrack on random conversations, coverage-guided
// fuzzing of every BPF program, and the fault and soak runs. Each suite is a part (one file
// each) that returns its tables; RELIABILITY_PARTS=a,b runs some, and their tables and figures
// replace those parts' in the earlier results, the other parts' kept (merge.go). Prints
// markdown tables and writes bench/results/reliability.json. Run as root: go run
// ./bench/reliability
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/flowplane/flowplane/bench/report"
)

// part is one suite of the reliability run.
type part struct {
	name string
	// title begins the title of each of its tables: how a merge tells them from the others'.
	title string
	// run returns the part's tables and its raw figures (saved under data[name]).
	run func(ctx context.Context) ([]*report.Table, any, error)
}

// parts are registered by each part's file (init), run in name order.
var parts []part

func register(p part) { parts = append(parts, p) }

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("reliability bench", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	slices.SortFunc(parts, func(a, b part) int { return strings.Compare(a.name, b.name) })
	want := os.Getenv("RELIABILITY_PARTS")
	if want != "" {
		for _, name := range strings.Split(want, ",") {
			if !slices.ContainsFunc(parts, func(p part) bool { return p.name == name }) {
				return fmt.Errorf("RELIABILITY_PARTS=%s: no part %q (parts: %s)", want, name, partNames())
			}
		}
	}
	res := report.Result{Name: "reliability", Time: time.Now().UTC(), Data: map[string]any{}}
	res.Setup = report.CurrentSetup(res.Time)
	var ran, failed []string
	for _, p := range parts {
		if want != "" && !slices.Contains(strings.Split(want, ","), p.name) {
			continue
		}
		ts, d, err := p.run(ctx)
		if err != nil {
			slog.Error("reliability part failed", "part", p.name, "err", err)
			failed = append(failed, p.name)
			continue
		}
		for _, t := range ts {
			if !strings.HasPrefix(t.Title, p.title) {
				return fmt.Errorf("part %s: table %q does not begin with the part's title %q", p.name, t.Title, p.title)
			}
		}
		res.Tables = append(res.Tables, ts...)
		res.Data[p.name] = d
		ran = append(ran, p.name)
	}
	if len(failed) > 0 {
		return fmt.Errorf("parts failed: %s", strings.Join(failed, ", "))
	}
	for _, t := range res.Tables {
		t.Markdown(os.Stdout)
	}
	if want != "" {
		var err error
		if res, err = mergeEarlier(res, ran); err != nil {
			return err
		}
	} else {
		res.Data[measuredKey] = measuredBy(res.Setup, ran)
	}
	return report.WriteJSON(res)
}

func partNames() string {
	var n []string
	for _, p := range parts {
		n = append(n, p.name)
	}
	return strings.Join(n, ", ")
}

// envDuration is the duration in environment variable name, or def.
func envDuration(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a duration such as 10m or 90s", name, v)
	}
	return d, nil
}
