package docscheck

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"
)

const page = "# x\n\n| `before` | not in the section |\n\n## Configuration\n\n```\n| `fenced` | a code block |\n```\n\n" +
	"| key | type |\n|---|---|\n| `a` | int |\n| `b.c`, `b.d` | two names |\n\n### Nested\n\n| `e` | still in |\n\n" +
	"## Counters\n\n| `after` | past the section |\n\nflowplane x run --flag\n"

func write(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "page.md")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestReadKeys: only first cells of tables under the Configuration heading (its subsections
// included, code blocks excluded) count, several spans per cell.
func TestReadKeys(t *testing.T) {
	p := Read(t, write(t, page))
	want := []string{"a", "b.c", "b.d", "e"}
	if got := sorted(p.Keys); len(got) != len(want) || got[0] != "a" || got[1] != "b.c" || got[2] != "b.d" || got[3] != "e" {
		t.Fatalf("keys %v, want %v", got, want)
	}
}

// TestChecksFail: a missing key, an unknown one, a missing command and a missing flag fail.
func TestChecksFail(t *testing.T) {
	p := Read(t, write(t, page))
	for name, check := range map[string]func(tb testing.TB){
		"missing key": func(tb testing.TB) { p.CheckKeys(tb, []string{"a", "e", "z"}, Qualify("b", []string{"c", "d"})) },
		"unknown key": func(tb testing.TB) { p.CheckKeys(tb, []string{"a", "e"}, Qualify("b", []string{"c"})) },
		"twice":       func(tb testing.TB) { p.CheckKeys(tb, []string{"a", "e", "a"}, Qualify("b", []string{"c", "d"})) },
		"command": func(tb testing.TB) {
			x := &cobra.Command{Use: "x"}
			x.AddCommand(&cobra.Command{Use: "stop"})
			p.CheckCommands(tb, x)
		},
		"flag": func(tb testing.TB) {
			x, run := &cobra.Command{Use: "x"}, &cobra.Command{Use: "run"}
			run.Flags().Bool("other", false, "")
			x.AddCommand(run)
			p.CheckCommands(tb, x)
		},
	} {
		rec := &recorder{TB: t}
		check(rec)
		if !rec.failed {
			t.Errorf("%s: the check passed", name)
		}
	}
	ok := &recorder{TB: t}
	p.CheckKeys(ok, []string{"a", "e"}, Qualify("b", []string{"c", "d"}))
	x, run := &cobra.Command{Use: "x"}, &cobra.Command{Use: "run"}
	run.Flags().Bool("flag", false, "")
	x.AddCommand(run)
	p.CheckCommands(ok, x)
	if ok.failed {
		t.Error("a page that documents everything failed the checks")
	}
}

// recorder is a testing.TB whose Errorf only records that it was called.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Helper()               {}
