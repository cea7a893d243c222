package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/flowplane/flowplane/bench/report"
)

// measuredKey is the results' data entry that says, by part, which commit and date its tables
// and figures come from.
const measuredKey = "measured"

// measured is where a part's tables and figures come from.
type measured struct {
	Commit string `json:"commit"`
	Date   string `json:"date"`
}

func measuredBy(s report.Setup, names []string) map[string]measured {
	m := map[string]measured{}
	for _, n := range names {
		m[n] = measured{Commit: s.Commit, Date: s.Date}
	}
	return m
}

// mergeEarlier merges a run of some parts (ran) into bench/results/reliability.json, if there is
// one (merge).
func mergeEarlier(fresh report.Result, ran []string) (report.Result, error) {
	path := filepath.Join(report.Root(), "bench", "results", "reliability.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		fresh.Data[measuredKey] = measuredBy(fresh.Setup, ran)
		return fresh, nil
	}
	if err != nil {
		return fresh, err
	}
	var earlier report.Result
	if err := json.Unmarshal(b, &earlier); err != nil {
		return fresh, fmt.Errorf("%s: %w (move it away to start afresh)", path, err)
	}
	return merge(earlier, fresh, ran), nil
}

// merge returns the earlier results with the tables and figures of the parts in ran replaced by
// fresh's (in their place; a part new to them at the end), the other parts' kept as they were.
// When the parts then come from more than one commit, the setup lists each commit with its
// parts, and every table says its own in a note (one that has one keeps it).
func merge(earlier, fresh report.Result, ran []string) report.Result {
	when := earlierMeasured(earlier)
	for _, n := range ran {
		when[n] = measured{Commit: fresh.Setup.Commit, Date: fresh.Setup.Date}
	}
	out := fresh
	out.Tables = nil
	out.Data = map[string]any{}
	for k, v := range earlier.Data {
		if k != measuredKey && !slices.Contains(ran, k) {
			out.Data[k] = v
		}
	}
	for k, v := range fresh.Data {
		out.Data[k] = v
	}
	placed := map[string]bool{}
	add := func(name string) {
		if !placed[name] {
			placed[name] = true
			for _, t := range fresh.Tables {
				if partOf(t.Title) == name {
					out.Tables = append(out.Tables, t)
				}
			}
		}
	}
	for _, t := range earlier.Tables {
		if name := partOf(t.Title); slices.Contains(ran, name) {
			add(name)
		} else {
			out.Tables = append(out.Tables, t)
		}
	}
	for _, n := range ran {
		add(n)
	}

	var order []string // the parts, in the order of their tables
	for _, t := range out.Tables {
		if n := partOf(t.Title); !slices.Contains(order, n) {
			order = append(order, n)
		}
	}
	kept := map[string]measured{}
	for _, n := range order {
		kept[n] = when[n]
	}
	out.Data[measuredKey] = kept
	out.Setup.Commit = byParts(order, kept, func(m measured) string { return m.Commit })
	out.Setup.Date = byParts(order, kept, func(m measured) string { return m.Date })
	if strings.Contains(out.Setup.Commit, "(") {
		for _, t := range out.Tables {
			if !slices.ContainsFunc(t.Notes, func(n string) bool { return measuredNote.MatchString(n) }) {
				m := kept[partOf(t.Title)]
				t.Notes = append(t.Notes, fmt.Sprintf("Measured at commit %s (%s).", m.Commit, m.Date))
			}
		}
	}
	return out
}

// measuredNote is a table's note naming the commit it was measured at.
var measuredNote = regexp.MustCompile(`^Measured at commit ([0-9a-f]+(?:\+dirty)?)`)

// earlierMeasured is where the earlier results' parts come from: their measured entry, or for
// results written before it, each table's note naming its commit, else the setup's first commit.
func earlierMeasured(r report.Result) map[string]measured {
	m := map[string]measured{}
	if raw, ok := r.Data[measuredKey]; ok {
		if b, err := json.Marshal(raw); err == nil && json.Unmarshal(b, &m) == nil {
			return m
		}
	}
	def := measured{Commit: strings.Fields(r.Setup.Commit + " unknown")[0], Date: r.Setup.Date}
	for _, t := range r.Tables {
		n := partOf(t.Title)
		if _, ok := m[n]; ok {
			continue
		}
		m[n] = def
		for _, note := range t.Notes {
			if c := measuredNote.FindStringSubmatch(note); c != nil {
				m[n] = measured{Commit: c[1], Date: r.Setup.Date}
			}
		}
	}
	return m
}

// partOf is the part whose tables' titles begin as title does ("" for none).
func partOf(title string) string {
	best := part{}
	for _, p := range parts {
		if strings.HasPrefix(title, p.title) && len(p.title) > len(best.title) {
			best = p
		}
	}
	return best.name
}

// byParts is the one value of field over the parts, or each value with its parts: "a1b2c3d
// (difftest); 4e5f6a7 (fuzz, soak)".
func byParts(order []string, m map[string]measured, field func(measured) string) string {
	var vals []string
	of := map[string][]string{}
	for _, n := range order {
		v := field(m[n])
		if _, ok := of[v]; !ok {
			vals = append(vals, v)
		}
		of[v] = append(of[v], n)
	}
	if len(vals) == 1 {
		return vals[0]
	}
	var s []string
	for _, v := range vals {
		s = append(s, fmt.Sprintf("%s (%s)", v, strings.Join(of[v], ", ")))
	}
	return strings.Join(s, "; ")
}
