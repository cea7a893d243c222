// Package report prints benchmark results as markdown tables and saves them as JSON under
// bench/results/, so every benchmark reports the same way; page.go turns those files into
// docs/benchmarks.md.
package report

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Table is one markdown table. A row may carry goals (Goal): a table with any gets a goal and
// a met column, in the bench's output and on the page alike.
type Table struct {
	Title   string     `json:"title"`
	Columns []string   `json:"columns"`
	Rows    [][]string `json:"rows"`
	// Goals are each row's goals, by row index (shorter than Rows when the last rows have
	// none).
	Goals [][]Goal `json:"goals,omitempty"`
	Notes []string `json:"notes,omitempty"`
	Plots []Plot   `json:"plots,omitempty"`
}

// Goal is what a row promises and whether its measured value keeps the promise: Met is
// computed by the bench from the value, nil when it could not be judged (no value, or no
// baseline). Metric and Target read as one phrase, "ratio to plain veth" "≥ 0.97".
type Goal struct {
	Metric string `json:"metric"`
	Target string `json:"target"`
	Value  string `json:"value,omitempty"` // the measured value the goal was judged on
	Met    *bool  `json:"met,omitempty"`
}

// Plot is an image a bench wrote next to its results: File is relative to bench/results/
// (prio/fairness-200.png); the page copies it to docs/img/bench/<name>/.
type Plot struct {
	Title string `json:"title"`
	File  string `json:"file"`
}

// AtLeast is the goal metric ≥ min, judged on v (NaN: not judged).
func AtLeast(metric string, v, min float64) Goal {
	return judged(metric, "≥ "+Num(min), v, v >= min)
}

// AtMost is the goal metric ≤ max, judged on v (NaN: not judged).
func AtMost(metric string, v, max float64) Goal {
	return judged(metric, "≤ "+Num(max), v, v <= max)
}

// Within is the goal lo ≤ metric ≤ hi, judged on v (NaN: not judged).
func Within(metric string, v, lo, hi float64) Goal {
	return judged(metric, "within "+Num(lo)+"–"+Num(hi), v, v >= lo && v <= hi)
}

// Check is a goal that is not a number (an exact transfer, an entry kept), met if ok.
func Check(metric, target string, ok bool) Goal {
	return Goal{Metric: metric, Target: target, Value: map[bool]string{true: "yes", false: "no"}[ok], Met: &ok}
}

// Unjudged is a goal the run could not judge; why (optional) stands in for the value.
func Unjudged(metric, target, why string) Goal {
	return Goal{Metric: metric, Target: target, Value: why}
}

// In appends a unit to the goal's target and value: AtLeast("goodput", v, 1000).In("Mbit/s").
func (g Goal) In(unit string) Goal {
	g.Target += " " + unit
	if g.Met != nil {
		g.Value += " " + unit
	}
	return g
}

func judged(metric, target string, v float64, ok bool) Goal {
	if math.IsNaN(v) {
		return Goal{Metric: metric, Target: target, Value: "—"}
	}
	return Goal{Metric: metric, Target: target, Value: Num(v), Met: &ok}
}

// Num formats a goal's number: three significant digits, whole numbers from 1000 on.
func Num(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "∞"
	case math.IsInf(v, -1):
		return "−∞"
	case math.Abs(v) >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// Add appends a row; values are formatted with %v (floats with %.3g unless already strings).
func (t *Table) Add(cells ...any) {
	row := make([]string, len(cells))
	for i, c := range cells {
		switch v := c.(type) {
		case float64:
			row[i] = fmt.Sprintf("%.3g", v)
		default:
			row[i] = fmt.Sprint(v)
		}
	}
	t.Rows = append(t.Rows, row)
}

// Goal attaches goals to the last row added.
func (t *Table) Goal(goals ...Goal) {
	if len(t.Rows) == 0 {
		panic("report: Goal before any row")
	}
	for len(t.Goals) < len(t.Rows) {
		t.Goals = append(t.Goals, nil)
	}
	t.Goals[len(t.Rows)-1] = append(t.Goals[len(t.Rows)-1], goals...)
}

// RowGoals are row i's goals.
func (t *Table) RowGoals(i int) []Goal {
	if i < len(t.Goals) {
		return t.Goals[i]
	}
	return nil
}

func (t *Table) hasGoals() bool {
	return slices.ContainsFunc(t.Goals, func(g []Goal) bool { return len(g) > 0 })
}

// GoalText is how the goal column shows a row's goals.
func GoalText(gs []Goal) string {
	var s []string
	for _, g := range gs {
		s = append(s, strings.TrimSpace(g.Metric+" "+g.Target))
	}
	return strings.Join(s, "; ")
}

// MetText is how the met column shows a row's goals: met when every judged goal is, "not met"
// naming the goals missed when there are several, — when none could be judged.
func MetText(gs []Goal) string {
	var missed []string
	judged := 0
	for _, g := range gs {
		if g.Met == nil {
			continue
		}
		judged++
		if !*g.Met {
			missed = append(missed, g.Metric)
		}
	}
	switch {
	case len(gs) == 0:
		return ""
	case judged == 0:
		return "—"
	case len(missed) == 0 && judged < len(gs):
		return "met (" + strconv.Itoa(len(gs)-judged) + " not judged)"
	case len(missed) == 0:
		return "met"
	case len(gs) == 1:
		return "**not met**"
	}
	return "**not met**: " + strings.Join(missed, ", ")
}

// Markdown writes the table, its notes and links to its plots (paths relative to
// bench/results/).
func (t *Table) Markdown(w io.Writer) {
	t.markdown(w, func(file string) string { return filepath.Join("bench", "results", file) })
}

func (t *Table) markdown(w io.Writer, plotPath func(string) string) {
	fmt.Fprintf(w, "\n### %s\n\n", t.Title)
	cols := t.Columns
	goals := t.hasGoals()
	if goals {
		cols = append(slices.Clip(cols), "goal", "met")
	}
	fmt.Fprintf(w, "| %s |\n", strings.Join(cols, " | "))
	fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(cols)))
	for i, r := range t.Rows {
		cells := make([]string, 0, len(cols))
		for _, c := range r {
			cells = append(cells, strings.ReplaceAll(c, "|", `\|`))
		}
		for len(cells) < len(t.Columns) {
			cells = append(cells, "")
		}
		if goals {
			cells = append(cells, GoalText(t.RowGoals(i)), MetText(t.RowGoals(i)))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	for _, n := range t.Notes {
		fmt.Fprintf(w, "\n%s\n", n)
	}
	for _, p := range t.Plots {
		fmt.Fprintf(w, "\n![%s](%s)\n", p.Title, plotPath(p.File))
	}
}

// Result is one benchmark's output file, bench/results/<name>.json.
type Result struct {
	Name   string         `json:"name"`
	Time   time.Time      `json:"time"`
	Setup  Setup          `json:"setup"`
	Tables []*Table       `json:"tables"`
	Data   map[string]any `json:"data,omitempty"` // raw measurements
}

// Setup is the machine and the code a result was measured on.
type Setup struct {
	Kernel string `json:"kernel"`         // uname -r
	CPU    string `json:"cpu"`            // /proc/cpuinfo's model name
	Cores  int    `json:"cores"`          // CPUs the bench could run on
	Memory string `json:"memory"`         // MemTotal, "7.8 GiB"
	Go     string `json:"go"`             // the toolchain
	Commit string `json:"commit"`         // git rev-parse --short HEAD, "+dirty" with uncommitted changes
	Date   string `json:"date"`           // UTC, 2006-01-02
	Args   string `json:"args,omitempty"` // the bench program's arguments: none, its defaults
}

// Save prints the tables to stdout and writes bench/results/<name>.json (relative to the
// repository root, found from the working directory).
func Save(r Result) error {
	for _, t := range r.Tables {
		t.Markdown(os.Stdout)
	}
	return WriteJSON(r)
}

// WriteJSON writes r to bench/results/<r.Name>.json with its time and setup (when not set),
// for benchmarks that print their own tables.
func WriteJSON(r Result) error {
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
	if r.Setup == (Setup{}) {
		r.Setup = CurrentSetup(r.Time)
	}
	dir := filepath.Join(root(), "bench", "results")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, r.Name+".json"), append(data, '\n'), 0o644)
}

// CurrentSetup describes this machine and checkout, dated t.
func CurrentSetup(t time.Time) Setup {
	s := Setup{CPU: "unknown", Cores: runtime.NumCPU(), Go: runtime.Version(), Date: t.UTC().Format(time.DateOnly)}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		s.Kernel = strings.TrimSpace(string(b))
	}
	if v := procField("/proc/cpuinfo", "model name"); v != "" {
		s.CPU = v
	}
	if v := procField("/proc/meminfo", "MemTotal"); v != "" {
		if kb, err := strconv.ParseFloat(strings.TrimSuffix(v, " kB"), 64); err == nil {
			s.Memory = fmt.Sprintf("%.1f GiB", kb/(1<<20))
		}
	}
	s.Commit = Commit(root())
	s.Args = strings.Join(os.Args[1:], " ")
	return s
}

// procField is the value of the first "name: value" line of a /proc file.
func procField(file, name string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Commit is the checkout's short commit, with "+dirty" when tracked files differ from it
// (the page and its plots, which the benches do not read, aside); "unknown" outside git.
func Commit(dir string) string {
	out, err := exec.Command("git", "-C", dir, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	st, err := exec.Command("git", "-C", dir, "status", "--porcelain", "--untracked-files=no", "--",
		".", ":(exclude)docs/benchmarks.md", ":(exclude)docs/img/bench").Output()
	if err != nil || len(bytes.TrimSpace(st)) > 0 {
		c += "+dirty"
	}
	return c
}

// Root is the repository's root: the nearest directory above the working directory with a
// go.mod.
func Root() string { return root() }

func root() string {
	dir, _ := os.Getwd()
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	return dir
}

// Median of xs (0 for none).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Range is "min–max" of xs, each formatted with format ("" for none).
func Range(format string, xs []float64) string {
	if len(xs) == 0 {
		return ""
	}
	return fmt.Sprintf(format+"–"+format, slices.Min(xs), slices.Max(xs))
}
