// Package docscheck holds a subsystem's manual page to its code, for the subsystems' tests
// (internal/<subsystem>/docs_test.go): every key the configuration decoder accepts is in the
// page's configuration reference, every key there is one the decoder accepts, and every command
// and flag of the subsystem's command tree is in the page.
//
// The configuration reference is the section under the page's first heading whose text starts
// with "Configuration" (or another title, ReadSection), down to the next heading of the same or
// a higher level. A key is
// documented when it is a code span in the first cell of a table row there (`| \`key\` | …`; a
// cell may name several, `| \`tos\`, \`tclass\` |`). A key inside a mapping-valued key is written
// PARENT.KEY (`allow.ports`, `keepalive.idle`); Qualify builds those names.
package docscheck

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/flowplane/flowplane/internal/topo"
)

// Page is a manual page read for checking.
type Page struct {
	Path string
	Text string
	// Keys are the code spans in the first cells of the configuration reference's tables.
	Keys map[string]bool
}

var (
	heading  = regexp.MustCompile(`^(#{1,6})\s+(.*)$`)
	codeSpan = regexp.MustCompile("`([^`]+)`")
)

// Read reads the page at path (relative to the test's package directory, e.g.
// "../../docs/prio.md") and collects its configuration reference's keys. It fails the test if
// the page has no configuration section or no table in it.
func Read(t testing.TB, path string) *Page {
	t.Helper()
	return ReadSection(t, path, "Configuration")
}

// ReadSection is Read with the reference under the first heading starting with title (a page
// with two formats has two references).
func ReadSection(t testing.TB, path, title string) *Page {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read the manual page: %v", err)
	}
	p := &Page{Path: path, Text: string(data), Keys: map[string]bool{}}
	level, rows := 0, 0
	fence := false
	for _, line := range strings.Split(p.Text, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			switch {
			case level == 0 && strings.HasPrefix(m[2], title):
				level = len(m[1])
			case level > 0 && len(m[1]) <= level:
				level = -1 // past the section
			}
			continue
		}
		if level <= 0 || !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.Trim(cells[1], " -:") == "" {
			continue // a separator row
		}
		spans := codeSpan.FindAllStringSubmatch(cells[1], -1)
		for _, s := range spans {
			p.Keys[s[1]] = true
		}
		rows += len(spans)
	}
	if level == 0 {
		t.Fatalf("%s: no heading starting with %q: the configuration reference goes there", path, title)
	}
	if rows == 0 {
		t.Fatalf("%s: the %q section has no table whose first column names keys (| `key` | …)", path, title)
	}
	return p
}

// Qualify is keys as the page names the keys of a mapping-valued key: parent.key.
func Qualify(parent string, keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = parent + "." + k
	}
	return out
}

// CheckKeys checks that the configuration reference documents exactly the keys the decoder
// knows: each of known (already qualified) is a row, no two are spelt alike (two levels with one
// key name need Qualify), and every key the tables name is one of them.
func (p *Page) CheckKeys(t testing.TB, known ...[]string) {
	t.Helper()
	all := map[string]bool{}
	for _, ks := range known {
		for _, k := range ks {
			if all[k] {
				t.Errorf("key %q is known at two levels: qualify one (docscheck.Qualify) so the page can tell them apart", k)
			}
			all[k] = true
		}
	}
	for _, k := range sorted(all) {
		if !p.Keys[k] {
			t.Errorf("%s: configuration key %q is not documented: add a row | `%s` | … | to a table of the Configuration section (type, default, unit, limits, meaning)", p.Path, k, k)
		}
	}
	for _, k := range sorted(p.Keys) {
		if !all[k] {
			t.Errorf("%s: the Configuration section's tables name %q, which the decoder does not accept (a stale row, or a first cell that is not a key)", p.Path, k)
		}
	}
}

// CheckCommands checks that every visible command of the tree under root appears in the page by
// its path without the binary's name ("prio host apply"), and every visible flag as --name.
// Hidden commands and flags are the deprecated spellings: docs/cli.md lists them.
func (p *Page) CheckCommands(t testing.TB, root *cobra.Command) {
	t.Helper()
	var walk func(c *cobra.Command, path string)
	walk = func(c *cobra.Command, path string) {
		t.Helper()
		if c.Hidden {
			return
		}
		if !strings.Contains(p.Text, path) {
			t.Errorf("%s: command %q is not in the page", p.Path, path)
		}
		check := func(f *pflag.Flag) {
			t.Helper()
			if f.Name == "help" || f.Hidden {
				return
			}
			if !strings.Contains(p.Text, "--"+f.Name) {
				t.Errorf("%s: flag --%s of %q is not in the page", p.Path, f.Name, path)
			}
		}
		c.Flags().VisitAll(check)
		c.PersistentFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub, path+" "+sub.Name())
		}
	}
	walk(root, root.Name())
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TopologyPaths are the keys of the topology format (internal/topo's levels, which lab and vnet
// share) as the manuals' references write them: each behind its mapping's path, with [] for a
// list's element (name, nodes.NAME.kind, links[].rate, links[].endpoints[].ipv4).
func TopologyPaths() []string {
	var keys []string
	for _, l := range []topo.Level{topo.TopLevel, topo.NodeLevel, topo.LinkLevel, topo.EndpointLevel} {
		path := strings.NewReplacer("[I]", "[]", "[J]", "[]").Replace(l.Field)
		if path == "" {
			keys = append(keys, l.Keys...)
			continue
		}
		keys = append(keys, Qualify(path, l.Keys)...)
	}
	return keys
}
