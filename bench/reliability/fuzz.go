package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flowplane/flowplane/bench/report"
)

// The fuzz part: every Go native fuzz target (Fuzz* in internal/*) whose name matches the
// regexp FUZZ (default all), run for FUZZTIME (default 2m) with go test -fuzz, one target per
// invocation, in its package, as `make fuzz` does (FUZZPARALLEL, FUZZMINIMIZETIME as there);
// what each executed, the corpus it grew and what failed.

func init() { register(part{name: "fuzz", title: "coverage-guided fuzzing", run: runFuzz}) }

// fuzzPrograms names the BPF programs each target runs; the other targets fuzz Go parsers.
var fuzzPrograms = map[string]string{
	"FuzzConntrackXDP":   "conntrack_xdp",
	"FuzzConntrackTC":    "conntrack_tc",
	"FuzzPrioClassifier": "prio_classify (5 schemes)",
	"FuzzAltmarkProbe":   "altmark_probe_in/out (3 carriers)",
	"FuzzAltmarkMarker":  "altmark_mark (5 configurations)",
	"FuzzLabLoss":        "lab_loss, lab_loss_xdp",
}

// fuzzRun is one target's run.
type fuzzRun struct {
	Target      string  `json:"target"`
	Package     string  `json:"package"`
	Seconds     float64 `json:"seconds"` // fuzzing time asked for
	Execs       int64   `json:"execs"`
	PerSec      float64 `json:"execs_per_sec"`
	Baseline    int     `json:"baseline_corpus"` // seeds, committed corpus and cached inputs
	Interesting int     `json:"new_interesting"` // inputs that found new coverage
	Failures    int     `json:"failures"`
	Input       string  `json:"failing_input,omitempty"` // written to testdata/fuzz/<target>/
	Message     string  `json:"failure,omitempty"`
}

func runFuzz(ctx context.Context) ([]*report.Table, any, error) {
	per, err := envDuration("FUZZTIME", 2*time.Minute)
	if err != nil {
		return nil, nil, err
	}
	parallel, minimize := envOr("FUZZPARALLEL", "1"), envOr("FUZZMINIMIZETIME", "5s")
	match, err := regexp.Compile(envOr("FUZZ", "."))
	if err != nil {
		return nil, nil, fmt.Errorf("FUZZ: %w (a regexp of target names)", err)
	}
	targets, err := fuzzTargets(ctx, match)
	if err != nil {
		return nil, nil, err
	}
	var runs []fuzzRun
	for _, tg := range targets {
		slog.Info("fuzzing", "target", tg[1], "package", tg[0], "for", per)
		r, err := fuzzOne(ctx, tg[0], tg[1], per, parallel, minimize)
		if err != nil {
			return nil, nil, err
		}
		runs = append(runs, r)
	}
	t := &report.Table{
		Title:   fmt.Sprintf("coverage-guided fuzzing: %s per target (go test -fuzz, %s worker)", per, parallel),
		Columns: []string{"target", "program", "executions", "execs/s", "corpus (at start + new)", "crashes / invariant failures"},
		Notes: []string{"Each target runs its program through BPF_PROG_TEST_RUN on fuzzer-made frames and checks invariants, " +
			"not only the absence of crashes (docs/architecture.md, \"Fuzzing\"); a failing input is kept in the package's testdata/fuzz/. " +
			"The corpus at start is the seeds, the committed inputs and what earlier runs kept in Go's build cache."},
	}
	for _, r := range runs {
		prog := fuzzPrograms[r.Target]
		if prog == "" {
			prog = "— (Go: " + strings.TrimPrefix(r.Package, "./internal/") + ")"
		}
		t.Add(r.Target, prog, strconv.FormatInt(r.Execs, 10), report.Num(r.PerSec),
			fmt.Sprintf("%d + %d", r.Baseline, r.Interesting), r.Failures)
		t.Goal(report.AtMost("failures", float64(r.Failures), 0))
		if r.Failures > 0 {
			t.Notes = append(t.Notes, fmt.Sprintf("%s: %s (input %s)", r.Target, r.Message, r.Input))
		}
	}
	return []*report.Table{t}, runs, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// fuzzTargets lists (package, target) for every Fuzz* function under internal/ that match
// matches, as go test -list reports them.
func fuzzTargets(ctx context.Context, match *regexp.Regexp) ([][2]string, error) {
	var pkgs []string
	err := filepath.WalkDir("internal", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if pkg := "./" + filepath.Dir(path); bytes.Contains(b, []byte("\nfunc Fuzz")) && !slices.Contains(pkgs, pkg) {
			pkgs = append(pkgs, pkg)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("find fuzz targets (run from the repository root): %w", err)
	}
	var out [][2]string
	for _, pkg := range pkgs {
		b, err := exec.CommandContext(ctx, "go", "test", "-list", "^Fuzz", pkg).Output()
		if err != nil {
			return nil, fmt.Errorf("go test -list ^Fuzz %s: %w", pkg, err)
		}
		for _, l := range strings.Fields(string(b)) {
			if strings.HasPrefix(l, "Fuzz") && match.MatchString(l) {
				out = append(out, [2]string{pkg, l})
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no fuzz target under internal/ matches FUZZ=%s", match)
	}
	return out, nil
}

var (
	reBaseline = regexp.MustCompile(`gathering baseline coverage: \d+/(\d+) completed`)
	reExecs    = regexp.MustCompile(`execs: (\d+) \((\d+)/sec\), new interesting: (\d+)`)
	reInput    = regexp.MustCompile(`Failing input written to (\S+)`)
)

// fuzzOne runs one target and reads go test's progress lines. A failure is a finding, not an
// error of the bench; an error is a run that could not happen (no build, no fuzzing lines).
func fuzzOne(ctx context.Context, pkg, target string, per time.Duration, parallel, minimize string) (fuzzRun, error) {
	r := fuzzRun{Target: target, Package: pkg, Seconds: per.Seconds()}
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-fuzz", "^"+target+"$", "-fuzztime", per.String(),
		"-fuzzminimizetime", minimize, "-parallel", parallel, pkg)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	runErr := cmd.Run()
	elapsed := time.Since(start)
	sawFuzzing := false
	sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
	for sc.Scan() {
		l := sc.Text()
		if m := reBaseline.FindStringSubmatch(l); m != nil {
			r.Baseline, _ = strconv.Atoi(m[1])
			sawFuzzing = true
		}
		if m := reExecs.FindStringSubmatch(l); m != nil {
			r.Execs, _ = strconv.ParseInt(m[1], 10, 64)
			r.Interesting, _ = strconv.Atoi(m[3])
		}
		if m := reInput.FindStringSubmatch(l); m != nil {
			r.Input = filepath.Join(pkg, m[1])
		}
		if r.Message == "" && strings.Contains(l, "_test.go:") && runErr != nil {
			r.Message = strings.TrimSpace(l)
		}
	}
	if runErr != nil && ctx.Err() != nil {
		return r, ctx.Err()
	}
	if runErr != nil {
		if !sawFuzzing && r.Input == "" {
			return r, fmt.Errorf("%s %s: %w\n%s", pkg, target, runErr, out.String())
		}
		r.Failures = 1       // go test -fuzz stops at the first failing input
		if r.Message == "" { // no test failure: the fuzzing process failed; its last words
			r.Message = lastLines(out.String(), 3)
		}
		slog.Warn("fuzz target failed", "target", target, "input", r.Input, "msg", r.Message)
	}
	r.PerSec = float64(r.Execs) / min(per, elapsed).Seconds()
	return r, nil
}

// lastLines is the last n non-empty lines of s, joined by " / ".
func lastLines(s string, n int) string {
	var ls []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "fuzz: elapsed") {
			ls = append(ls, l)
		}
	}
	return strings.Join(ls[max(0, len(ls)-n):], " / ")
}
