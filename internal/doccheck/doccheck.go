// Package doccheck holds a subsystem's manual (docs/*.md) to its code, for the subsystems'
// tests: every key a configuration decoder accepts has a row in the page's configuration
// reference, that reference names no key the decoder does not know, and every visible command
// and flag of the subsystem's command tree appears in the page.
package doccheck

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/flowplane/flowplane/internal/topo"
)

// Page is a manual's text.
type Page struct {
	Path string
	Text string
}

// Read reads the manual at path.
func Read(path string) (Page, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Page{}, err
	}
	return Page{Path: path, Text: string(b)}, nil
}

var heading = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)

// Section returns the lines under the heading whose text is title, up to the next heading of
// the same or a higher level; lines inside fenced code blocks are never headings.
func (p Page) Section(title string) (string, error) {
	var out []string
	level := 0
	fence := false
	for _, line := range strings.Split(p.Text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
		}
		if m := heading.FindStringSubmatch(line); m != nil && !fence {
			switch {
			case level == 0 && m[2] == title:
				level = len(m[1])
				continue
			case level > 0 && len(m[1]) <= level:
				return strings.Join(out, "\n"), nil
			}
		}
		if level > 0 {
			out = append(out, line)
		}
	}
	if level == 0 {
		return "", fmt.Errorf("%s has no heading %q", p.Path, title)
	}
	return strings.Join(out, "\n"), nil
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// TableKeys returns what the tables of text define: the code spans in the first cell of each
// table row (`key`, or `a`, `b` for a row that defines two).
func TableKeys(text string) map[string]bool {
	keys := map[string]bool{}
	fence := false
	for _, line := range strings.Split(text, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(t, "|") {
			continue
		}
		first, _, _ := strings.Cut(strings.ReplaceAll(t[1:], `\|`, "\x00"), "|")
		for _, m := range codeSpan.FindAllStringSubmatch(first, -1) {
			keys[m[1]] = true
		}
	}
	return keys
}

// KeyProblems compares the keys the tables under the heading title define with want, the keys
// the decoder accepts: one message per key missing from the tables and per key the tables
// define that the decoder does not know.
func (p Page) KeyProblems(title string, want []string) []string {
	sec, err := p.Section(title)
	if err != nil {
		return []string{err.Error()}
	}
	have := TableKeys(sec)
	var probs []string
	for _, k := range want {
		if !have[k] {
			probs = append(probs, fmt.Sprintf("%s, %q: key `%s` has no row (| `%s` | … |)", p.Path, title, k, k))
		}
	}
	var extra []string
	for k := range have {
		if !slices.Contains(want, k) {
			extra = append(extra, k)
		}
	}
	slices.Sort(extra)
	for _, k := range extra {
		probs = append(probs, fmt.Sprintf("%s, %q: a row documents `%s`, which the decoder does not accept", p.Path, title, k))
	}
	return probs
}

// Prefixed returns keys with prefix in front of each: the paths a nested mapping's keys have
// in the reference table (ipfix.collector, interfaces[].name).
func Prefixed(prefix string, keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = prefix + k
	}
	return out
}

// TopologyPaths are the keys of the topology format (internal/topo's levels) as the manuals'
// references write them: each behind its mapping's path, with [] for a list's element
// (name, nodes.NAME.kind, links[].rate, links[].endpoints[].ipv4).
func TopologyPaths() []string {
	var keys []string
	for _, l := range []topo.Level{topo.TopLevel, topo.NodeLevel, topo.LinkLevel, topo.EndpointLevel} {
		prefix := strings.NewReplacer("[I]", "[]", "[J]", "[]").Replace(l.Field)
		if prefix != "" {
			prefix += "."
		}
		keys = append(keys, Prefixed(prefix, l.Keys)...)
	}
	return keys
}

// CommandProblems lists the visible commands and flags of root's tree that the page does not
// mention: a command as "flowplane PATH" (PATH its words from root down), a flag as --name.
// Hidden and deprecated commands and flags, and cobra's help, are left out.
func (p Page) CommandProblems(root *cobra.Command) []string {
	var probs []string
	var walk func(c *cobra.Command, path string)
	walk = func(c *cobra.Command, path string) {
		if c.Hidden || c.Deprecated != "" {
			return
		}
		if path != "" {
			path += " "
		}
		path += c.Name()
		if !c.HasAvailableSubCommands() && !strings.Contains(p.Text, "flowplane "+path) {
			probs = append(probs, fmt.Sprintf("%s: command `flowplane %s` is not mentioned", p.Path, path))
		}
		seen := map[string]bool{}
		visit := func(f *pflag.Flag) {
			if f.Hidden || f.Deprecated != "" || f.Name == "help" || seen[f.Name] {
				return
			}
			seen[f.Name] = true
			if !mentions(p.Text, "--"+f.Name) {
				probs = append(probs, fmt.Sprintf("%s: flag --%s of `flowplane %s` is not mentioned", p.Path, f.Name, path))
			}
		}
		c.Flags().VisitAll(visit)
		c.PersistentFlags().VisitAll(visit)
		for _, sub := range c.Commands() {
			walk(sub, path)
		}
	}
	walk(root, "")
	return probs
}

// mentions reports whether text has flag as a whole word: not as the start of a longer flag.
func mentions(text, flag string) bool {
	for i := 0; ; {
		j := strings.Index(text[i:], flag)
		if j < 0 {
			return false
		}
		end := i + j + len(flag)
		if end == len(text) || !isFlagChar(text[end]) {
			return true
		}
		i = end
	}
}

func isFlagChar(b byte) bool {
	return b == '-' || b == '_' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
}
