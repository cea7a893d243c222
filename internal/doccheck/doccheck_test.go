package doccheck

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

const page = "# T\n\n## Reference\n\n| key | meaning |\n|---|---|\n| `a` | x `not-a-key` |\n| `b.c`, `d` | y \\| z |\n" +
	"| plain | no code span |\n\n```sh\n# not a heading\n| `in-fence` |\n```\n\n### Nested\n\n| `e` | under a lower heading: part of Reference |\n\n" +
	"## Other\n\n| `f` | another section |\n\nflowplane x run --dev-name --dev\n"

func TestSection(t *testing.T) {
	t.Parallel()
	p := Page{Path: "p.md", Text: page}
	sec, err := p.Section("Reference")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sec, "# not a heading") || !strings.Contains(sec, "`e`") || strings.Contains(sec, "`f`") {
		t.Errorf("section:\n%s", sec)
	}
	if _, err := p.Section("Missing"); err == nil {
		t.Error("no error for a missing heading")
	}
}

func TestKeyProblems(t *testing.T) {
	t.Parallel()
	p := Page{Path: "p.md", Text: page}
	got := TableKeys(mustSection(t, p, "Reference"))
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"a", "b.c", "d", "e"}; !slices.Equal(keys, want) {
		t.Errorf("keys %v, want %v", keys, want)
	}
	probs := p.KeyProblems("Reference", []string{"a", "b.c", "d", "g"})
	if len(probs) != 2 || !strings.Contains(probs[0], "`g` has no row") || !strings.Contains(probs[1], "`e`, which the decoder does not accept") {
		t.Errorf("problems: %q", probs)
	}
}

func TestCommandProblems(t *testing.T) {
	t.Parallel()
	root := &cobra.Command{Use: "x"}
	run := &cobra.Command{Use: "run", Run: func(*cobra.Command, []string) {}}
	run.Flags().String("dev", "", "")
	run.Flags().String("dev-n", "", "") // only --dev-name is in the page: not a mention
	run.Flags().String("hidden", "", "")
	_ = run.Flags().MarkHidden("hidden")
	old := &cobra.Command{Use: "old", Hidden: true, Run: func(*cobra.Command, []string) {}}
	stop := &cobra.Command{Use: "stop", Run: func(*cobra.Command, []string) {}}
	root.AddCommand(run, old, stop)
	probs := Page{Path: "p.md", Text: page}.CommandProblems(root)
	want := []string{"p.md: flag --dev-n of `flowplane x run` is not mentioned", "p.md: command `flowplane x stop` is not mentioned"}
	if !slices.Equal(probs, want) {
		t.Errorf("problems:\n%q\nwant\n%q", probs, want)
	}
}

func mustSection(t *testing.T, p Page, title string) string {
	t.Helper()
	s, err := p.Section(title)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
