package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/flowplane/flowplane/bench/report"
)

// TestMerge: a run of one part replaces that part's tables and figures in results written
// before the measured entry existed, keeps the others', and says which commit each comes from.
func TestMerge(t *testing.T) {
	earlier := report.Result{
		Name:  "reliability",
		Setup: report.Setup{Commit: "1111111 (difftest, verifier); 2222222 (the others)", Date: "2026-11-26"},
		Tables: []*report.Table{
			{Title: "conntrack against nf_conntrack on random conversations"},
			{Title: "Verifier budget"},
			{Title: "altmark-api: 50 clients", Notes: []string{"Measured at commit 2222222 (before its merge), on a busy machine."}},
			{Title: "altmark-api: the probe process under the load", Notes: []string{"Measured at commit 2222222."}},
			{Title: "soak: traffic and records", Notes: []string{"Measured at commit 3333333."}},
		},
		Data: map[string]any{"difftest": "old", "verifier": "v", "altmark-api": "a", "soak": "s"},
	}
	fresh := report.Result{
		Name:   "reliability",
		Setup:  report.Setup{Commit: "4444444", Date: "2026-11-27"},
		Tables: []*report.Table{{Title: "conntrack against nf_conntrack on random conversations", Notes: []string{"new"}}},
		Data:   map[string]any{"difftest": "new"},
	}
	out := merge(earlier, fresh, []string{"difftest"})
	var titles []string
	for _, tb := range out.Tables {
		titles = append(titles, tb.Title)
	}
	if len(out.Tables) != 5 || out.Tables[0].Notes[0] != "new" || out.Tables[4].Title != "soak: traffic and records" {
		t.Fatalf("tables %q", titles)
	}
	if out.Data["difftest"] != "new" || out.Data["verifier"] != "v" || out.Data["soak"] != "s" {
		t.Errorf("data %v", out.Data)
	}
	want := "4444444 (difftest); 1111111 (verifier); 2222222 (altmark-api); 3333333 (soak)"
	if out.Setup.Commit != want {
		t.Errorf("commit %q, want %q", out.Setup.Commit, want)
	}
	if !slices.Contains(out.Tables[0].Notes, "Measured at commit 4444444 (2026-11-27).") ||
		!slices.Contains(out.Tables[1].Notes, "Measured at commit 1111111 (2026-11-26).") ||
		len(out.Tables[2].Notes) != 1 {
		t.Errorf("notes %q", [][]string{out.Tables[0].Notes, out.Tables[1].Notes, out.Tables[2].Notes})
	}
	// Merged again: the measured entry now says where each part comes from.
	again := merge(out, report.Result{Setup: report.Setup{Commit: "5555555", Date: "2026-11-28"},
		Tables: []*report.Table{{Title: "soak: the flowplane processes"}}, Data: map[string]any{"soak": "s2"}}, []string{"soak"})
	if !strings.HasPrefix(again.Setup.Commit, "4444444 (difftest); 1111111 (verifier); 2222222 (altmark-api); 5555555 (soak)") ||
		len(again.Tables) != 5 || again.Data["difftest"] != "new" || again.Data["soak"] != "s2" {
		t.Errorf("merged again: %q, %d tables, data %v", again.Setup.Commit, len(again.Tables), again.Data)
	}
}
