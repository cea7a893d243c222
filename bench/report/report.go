// Package report prints benchmark results as markdown tables and saves them as JSON under
// bench/results/, so every benchmark reports the same way.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Table is one markdown table.
type Table struct {
	Title   string     `json:"title"`
	Columns []string   `json:"columns"`
	Rows    [][]string `json:"rows"`
	Notes   []string   `json:"notes,omitempty"`
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

// Markdown writes the table.
func (t *Table) Markdown(w io.Writer) {
	fmt.Fprintf(w, "\n### %s\n\n", t.Title)
	fmt.Fprintf(w, "| %s |\n", strings.Join(t.Columns, " | "))
	fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(t.Columns)))
	for _, r := range t.Rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
	for _, n := range t.Notes {
		fmt.Fprintf(w, "\n%s\n", n)
	}
}

// Result is one benchmark's output file.
type Result struct {
	Name   string         `json:"name"`
	Time   time.Time      `json:"time"`
	Tables []*Table       `json:"tables"`
	Data   map[string]any `json:"data,omitempty"` // raw measurements
}

// Save prints the tables to stdout and writes bench/results/<name>.json (relative to the
// repository root, found from the working directory).
func Save(r Result) error {
	r.Time = time.Now().UTC()
	for _, t := range r.Tables {
		t.Markdown(os.Stdout)
	}
	return WriteJSON(r.Name, r)
}

// WriteJSON writes v to bench/results/<name>.json, for benchmarks that print their own tables.
func WriteJSON(name string, v any) error {
	dir := filepath.Join(root(), "bench", "results")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".json"), append(data, '\n'), 0o644)
}

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
