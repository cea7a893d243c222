package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/commands"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// The grammar of docs/cli.md: flowplane SUBSYSTEM [OBJECT] VERB [ARGS] [FLAGS]. These tests walk
// the tree main runs (commands.Root) and run commands in-process through it, so a new command
// that breaks the grammar fails here.

// verbs are the words a command that does something may be called (docs/cli.md, Verbs).
var verbs = []string{
	"apply", "remove", "status", // something attached persistently
	"run",        // a foreground process holding its attachment while it runs
	"up", "down", // the lab (and vnet up, a foreground network)
	"list",    // listing
	"exec",    // run a command in a place (lab node, tuned cgroup, vnet)
	"explain", // tune: which rule a connection matches
	"events",  // conntrack: the event stream
	"flush",   // conntrack: delete every entry
	"timeout", // conntrack: show or set timeouts
	"node",    // vnet: run one node of a topology
	"analyze", // altmark: passes its arguments to flowplane-analytics
}

// tools are the binary's own commands beside the subsystems (docs/cli.md, The binary).
var tools = []string{"version", "check"}

// objects are the nouns between a subsystem and its verbs.
var objects = []string{"mark", "probe", "host", "router"}

// fileFlags are the flags besides --config that take a file: not the command's configuration.
var fileFlags = []string{"token-file", "script"}

// node is a command of the tree with its place in it.
type node struct {
	cmd   *cobra.Command
	path  []string // words after the root
	depth int
}

func (n node) String() string { return strings.Join(n.path, " ") }

// walk lists every command under root but help and completion (plumbing, not subsystems).
func walk(root *cobra.Command) []node {
	var out []node
	var visit func(c *cobra.Command, path []string)
	visit = func(c *cobra.Command, path []string) {
		out = append(out, node{cmd: c, path: path, depth: len(path)})
		for _, s := range c.Commands() {
			if len(path) == 0 && (s.Name() == "help" || s.Name() == "completion") {
				continue
			}
			visit(s, append(slices.Clone(path), s.Name()))
		}
	}
	visit(root, nil)
	return out
}

// synopsis is what a Use line says about a command's arguments and flags.
type synopsis struct {
	min, max      int // positional arguments; max -1: any number
	required      []string
	flags         []string // every flag it names, without dashes
	fileArgs      []string // positional arguments that look like files
	positionalErr string
}

// parseUse reads a Use line: "exec NAME NODE -- CMD [ARG...]", "apply --config FILE [--name N]".
// Brackets mark what is optional; "..." a repeatable argument; "A|--b" alternatives (the first
// is taken); a flag's value is the next word unless the flag's bracket closes on it.
func parseUse(use string) synopsis {
	var s synopsis
	words := strings.Fields(use)[1:]
	depth := 0
	for i := 0; i < len(words); i++ {
		w := words[i]
		optional := depth > 0 || strings.HasPrefix(w, "[")
		depth += strings.Count(w, "[") - strings.Count(w, "]")
		bare := strings.Trim(w, "[]")
		if alt, _, ok := strings.Cut(bare, "|"); ok && !strings.HasPrefix(bare, "-") {
			bare = alt
		}
		switch {
		case bare == "--":
			continue
		case strings.HasPrefix(bare, "-"):
			name := strings.TrimLeft(strings.TrimRight(bare, ".…"), "-")
			if n, _, ok := strings.Cut(name, "="); ok {
				name = n
			}
			s.flags = append(s.flags, name)
			if !optional {
				s.required = append(s.required, name)
			}
			// A value follows unless the bracket closed on the flag or the next word is a flag.
			if !strings.HasSuffix(strings.TrimRight(w, ".…"), "]") && i+1 < len(words) && !strings.HasPrefix(strings.TrimLeft(words[i+1], "["), "-") {
				i++
				depth += strings.Count(words[i], "[") - strings.Count(words[i], "]")
			}
		case bare != "" && unicode.IsUpper(rune(bare[0])):
			name := strings.TrimRight(bare, ".…")
			if name != bare && s.max >= 0 {
				s.max = -1
			}
			if !optional {
				s.min++
			}
			if s.max >= 0 {
				s.max++
			}
			if regexp.MustCompile(`^(FILE|POLICY|TOPOLOGY|CONFIG|PATH)$`).MatchString(name) {
				s.fileArgs = append(s.fileArgs, name)
			}
		default:
			s.positionalErr = "unexpected word " + w
		}
	}
	return s
}

func TestParseUse(t *testing.T) {
	t.Parallel()
	for use, want := range map[string]string{
		"exec NAME NODE -- CMD [ARG...]":                          "3 -1 [] [] []",
		"apply --config FILE [--cgroup PATH] [--name N]":          "0 0 [config] [config cgroup name] []",
		"down NAME|--all":                                         "1 1 [] [] []",
		"explain REMOTE[:PORT] [--local ADDR[:PORT]] [--json]":    "1 1 [] [local json] []",
		"exec --config FILE [-c CMD]... [--script F]":             "0 0 [config] [config c script] []",
		"run --inside IF... --outside IF... [--hook auto|xdp|tc]": "0 0 [inside outside] [inside outside hook] []",
		"timeout [NAME=DURATION...]":                              "0 -1 [] [] []",
		"up FILE":                                                 "1 1 [] [] [FILE]",
	} {
		s := parseUse(use)
		got := strings.Join([]string{itoa(s.min), itoa(s.max), "[" + strings.Join(s.required, " ") + "]", "[" + strings.Join(s.flags, " ") + "]", "[" + strings.Join(s.fileArgs, " ") + "]"}, " ")
		if got != want || s.positionalErr != "" {
			t.Errorf("parseUse(%q) = %s %s, want %s", use, got, s.positionalErr, want)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestGrammar checks the tree statically: names, help style, --json, --config, hidden aliases.
func TestGrammar(t *testing.T) {
	t.Parallel()
	fileWord := regexp.MustCompile(`(?i)\bfile\b`)
	for _, n := range walk(commands.Root()) {
		c := n.cmd
		where := "flowplane " + n.String()
		if c.Short == "" || !unicode.IsUpper([]rune(c.Short)[0]) || strings.HasSuffix(c.Short, ".") {
			t.Errorf("%s: Short %q: want a capital first letter and no trailing period", where, c.Short)
		}
		if n.depth == 0 {
			continue
		}
		if first := strings.Fields(c.Use)[0]; first != c.Name() {
			t.Errorf("%s: Use %q does not start with the command's name", where, c.Use)
		}
		forms := cli.DeprecatedForms(c)
		if c.Hidden && len(forms) == 0 {
			t.Errorf("%s: hidden, but records no deprecated spelling (only deprecated aliases are hidden)", where)
		}
		if strings.HasPrefix(c.Short, "Deprecated") && !c.Hidden {
			t.Errorf("%s: deprecated but not hidden", where)
		}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			_, deprecated := f.Annotations[cli.DeprecatedKey]
			switch {
			case deprecated && !f.Hidden:
				t.Errorf("%s --%s: deprecated but not hidden", where, f.Name)
			case f.Hidden && len(forms) == 0:
				t.Errorf("%s --%s: hidden, but the command records no deprecated spelling", where, f.Name)
			}
			if f.Hidden || c.Hidden {
				return
			}
			if strings.HasSuffix(f.Usage, ".") {
				t.Errorf("%s --%s: usage %q ends with a period", where, f.Name, f.Usage)
			}
			if f.Name != "config" && (slices.Contains([]string{"policy", "file", "topology", "config-file"}, f.Name) ||
				fileWord.MatchString(f.Usage) && !slices.Contains(fileFlags, f.Name)) {
				t.Errorf("%s --%s (%q): a file is passed as --config FILE", where, f.Name, f.Usage)
			}
			if f.Name == "config" && f.Shorthand != "" {
				t.Errorf("%s --config has the short form -%s; it has none", where, f.Shorthand)
			}
		})
		if c.Hidden {
			continue
		}
		group := c.HasAvailableSubCommands()
		switch {
		case n.depth == 1 && !group && !slices.Contains(tools, c.Name()):
			t.Errorf("%s: a subsystem must group verbs (or objects)", where)
		case n.depth == 2 && group && !slices.Contains(objects, c.Name()):
			t.Errorf("%s: %q is not an object of the grammar (%v)", where, c.Name(), objects)
		case (n.depth == 2 || n.depth == 3) && !group && !slices.Contains(verbs, c.Name()):
			t.Errorf("%s: %q is not a verb of the grammar (%v)", where, c.Name(), verbs)
		case n.depth == 3 && group, n.depth > 3:
			t.Errorf("%s: the grammar has at most SUBSYSTEM OBJECT VERB", where)
		}
		if group {
			vis := 0
			c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
				if !f.Hidden && f.Name != "help" {
					vis++
				}
			})
			if vis > 0 {
				t.Errorf("%s: a group has %d visible flags of its own; flags belong to verbs", where, vis)
			}
			if c.Use != c.Name() {
				t.Errorf("%s: a group's Use is its name alone, not %q", where, c.Use)
			}
			if sub := find(c, "apply"); sub != nil {
				if find(c, "remove") == nil {
					t.Errorf("%s: has apply but no remove", where)
				}
				if find(c, "status") == nil && find(c.Parent(), "status") == nil {
					t.Errorf("%s: has apply but no status (here or in %s)", where, c.Parent().Name())
				}
			}
			continue
		}
		if c.DisableFlagParsing {
			if c.Name() != "analyze" {
				t.Errorf("%s: only analyze passes its arguments on unparsed", where)
			}
			continue
		}
		s := parseUse(c.Use)
		if s.positionalErr != "" {
			t.Errorf("%s: Use %q: %s", where, c.Use, s.positionalErr)
		}
		if len(s.fileArgs) > 0 {
			t.Errorf("%s: Use %q takes a file as an argument; files are passed as --config FILE", where, c.Use)
		}
		for _, f := range s.flags {
			if lookup(c, f) == nil {
				t.Errorf("%s: Use %q names --%s, which the command does not have", where, c.Use, f)
			}
		}
		if c.Flags().Lookup("config") != nil && !strings.Contains(c.Use, "--config FILE") {
			t.Errorf("%s: has --config but Use %q does not show --config FILE", where, c.Use)
		}
		if c.Name() == "status" || c.Name() == "list" {
			if f := c.Flags().Lookup("json"); f == nil || f.Value.Type() != "bool" {
				t.Errorf("%s: status and list commands have --json", where)
			}
			if !strings.Contains(c.Use, "[--json]") {
				t.Errorf("%s: Use %q does not show [--json]", where, c.Use)
			}
		}
		if c.Args == nil && s.max >= 0 {
			t.Errorf("%s: no argument check, but Use %q takes at most %d argument(s)", where, c.Use, s.max)
		}
	}
}

func find(c *cobra.Command, name string) *cobra.Command {
	for _, s := range c.Commands() {
		if s.Name() == name && !s.Hidden {
			return s
		}
	}
	return nil
}

func lookup(c *cobra.Command, name string) *pflag.Flag {
	if len(name) == 1 {
		return c.Flags().ShorthandLookup(name)
	}
	if f := c.Flags().Lookup(name); f != nil {
		return f
	}
	return c.InheritedFlags().Lookup(name)
}

// result is what one in-process run of the command line gave.
type result struct {
	stdout, stderr, err string
	code                int
}

// execute runs flowplane args in-process through the tree main builds, in network namespace
// ns ("" for this one).
func execute(t *testing.T, ns string, args ...string) result {
	t.Helper()
	root := commands.Root()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(""))
	root.SetArgs(args)
	run := func() error { return root.ExecuteContext(context.Background()) }
	var err error
	if ns != "" {
		if nerr := nsrun.Do(ns, func() error { err = run(); return nil }); nerr != nil {
			t.Fatal(nerr)
		}
	} else {
		err = run()
	}
	r := result{stdout: out.String(), stderr: errb.String()}
	if err != nil {
		r.err, r.code = err.Error(), cli.ExitCode(err)
	}
	return r
}

// labNetns is a network namespace of the test's own when it runs as root (commands then
// cannot see or touch this one's state), else "" (and nothing can be changed anyway).
func labNetns(t *testing.T) string {
	if os.Geteuid() != 0 {
		return ""
	}
	return testenv.Netns(t)
}

// TestUsageErrorsAtEveryLevel: a bad flag, an unknown subcommand, a wrong number of arguments
// and missing required flags exit 2 everywhere in the tree, hidden aliases included. Only
// bogus input is given, which every command refuses before acting.
func TestUsageErrorsAtEveryLevel(t *testing.T) {
	ns := labNetns(t)
	const bogus = "fpgrammar-bogus"
	check := func(want string, args ...string) {
		t.Helper()
		r := execute(t, ns, args...)
		if r.code != 2 || !strings.Contains(r.err, want) {
			t.Errorf("flowplane %s: exit %d, %q; want exit 2 and %q", strings.Join(args, " "), r.code, r.err, want)
		}
	}
	for _, n := range walk(commands.Root()) {
		c := n.cmd
		if c.DisableFlagParsing {
			continue // analyze: its arguments are flowplane-analytics's
		}
		check("unknown flag: --"+bogus, append(slices.Clone(n.path), "--"+bogus)...)
		if c.HasSubCommands() {
			check(`unknown command "`+bogus+`"`, append(slices.Clone(n.path), bogus)...)
			continue
		}
		s := parseUse(c.Use)
		args := func(k int) []string {
			a := slices.Clone(n.path)
			for range k {
				a = append(a, bogus)
			}
			return a
		}
		if s.max >= 0 {
			check("", args(s.max+3)...)
		}
		if s.min > 0 {
			check("", args(s.min-1)...)
		}
		if len(s.required) > 0 {
			check("", args(s.min)...)
		}
	}
}

// TestDeprecatedSpellings: every old spelling still works as before, prints exactly the one
// notice line on stderr, and is exercised here (a new one must be added to the table). The
// inputs are ones each command refuses or only reads, so nothing changes.
func TestDeprecatedSpellings(t *testing.T) {
	ns := labNetns(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tuneDC := filepath.Join(repo, "examples/tune-dc.yaml")
	marker := filepath.Join(repo, "examples/marker-dscp.yaml")
	vnetLine := filepath.Join(repo, "internal/vnet/testdata/line.yaml")
	const nocg = "/fpgrammar-nosuch-cgroup"
	forms := registered(t)
	seen := map[string]bool{}
	for _, c := range []struct {
		old      string // as the notice names it
		oldArgs  []string
		newArgs  []string
		inNetns  bool // acts on network-namespace state: run in the test's namespace
		otherErr bool // the error names the command, which differs
	}{
		{"lab up FILE", []string{"lab", "up", missing}, []string{"lab", "up", "--config", missing}, false, false},
		{"tune apply POLICY", []string{"tune", "--name", "fpgrammar", "apply", missing}, []string{"tune", "--name", "fpgrammar", "apply", "--config", missing}, false, false},
		{"tune run", []string{"tune", "run", "--cgroup", nocg, "--", "true"}, []string{"tune", "exec", "--cgroup", nocg, "--", "true"}, false, false},
		{"tune explain --policy FILE", []string{"tune", "explain", "198.18.1.2:443", "--policy", tuneDC}, []string{"tune", "explain", "198.18.1.2:443", "--config", tuneDC}, false, false},
		{"conntrack stats", []string{"conntrack", "stats"}, []string{"conntrack", "status"}, true, false},
		{"conntrack unpin", []string{"conntrack", "unpin", "fpgrammar-bogus"}, []string{"conntrack", "remove", "fpgrammar-bogus"}, true, true},
		{"prio host --cgroup PATH --policy FILE", []string{"prio", "host", "--cgroup", nocg, "--policy", missing}, []string{"prio", "host", "apply", "--cgroup", nocg, "--config", missing}, true, false},
		{"prio host apply --policy FILE", []string{"prio", "host", "apply", "--cgroup", nocg, "--policy", missing}, []string{"prio", "host", "apply", "--cgroup", nocg, "--config", missing}, true, false},
		{"prio router --dev IF --rate R --policy FILE", []string{"prio", "router", "--dev", "fpgrammar0", "--rate", "10mbit", "--policy", missing}, []string{"prio", "router", "apply", "--dev", "fpgrammar0", "--rate", "10mbit", "--config", missing}, true, false},
		{"prio router apply --policy FILE", []string{"prio", "router", "apply", "--dev", "fpgrammar0", "--rate", "10mbit", "--policy", missing}, []string{"prio", "router", "apply", "--dev", "fpgrammar0", "--rate", "10mbit", "--config", missing}, true, false},
		{"prio remove --dev IF", []string{"prio", "remove", "--dev", "fpgrammar0"}, []string{"prio", "router", "remove", "--dev", "fpgrammar0"}, true, false},
		{"prio remove --host NAME", []string{"prio", "remove", "--host", "fpgrammar"}, []string{"prio", "host", "remove", "--name", "fpgrammar"}, true, false},
		{"altmark mark --dev IF --config FILE", []string{"altmark", "mark", "--dev", "fpgrammar0", "--config", missing}, []string{"altmark", "mark", "apply", "--dev", "fpgrammar0", "--config", missing}, true, false},
		{"altmark mark --check --config FILE", []string{"altmark", "mark", "--check", "--config", marker}, []string{"altmark", "mark", "apply", "--check", "--config", marker}, true, false},
		{"altmark mark --remove --dev IF", []string{"altmark", "mark", "--remove", "--dev", "fpgrammar0"}, []string{"altmark", "mark", "remove", "--dev", "fpgrammar0"}, true, false},
		{"altmark probe --config FILE", []string{"altmark", "probe", "--config", missing}, []string{"altmark", "probe", "run", "--config", missing}, true, false},
		{"vnet up FILE", []string{"vnet", "up", missing}, []string{"vnet", "up", "--config", missing}, false, false},
		{"vnet node FILE", []string{"vnet", "node", missing, "--name", "r1"}, []string{"vnet", "node", "--config", missing, "--name", "r1"}, false, false},
		{"vnet exec FILE", []string{"vnet", "exec", vnetLine, "-c", "r1 routes"}, []string{"vnet", "exec", "--config", vnetLine, "-c", "r1 routes"}, false, false},
	} {
		t.Run(c.old, func(t *testing.T) {
			where := ""
			if c.inNetns {
				where = ns
			}
			o, n := execute(t, where, c.oldArgs...), execute(t, where, c.newArgs...)
			repl := forms[c.old]
			notice := `flowplane: "` + c.old + `" is deprecated; use "` + repl + `"` + "\n"
			if repl == "" || o.stderr != notice {
				t.Errorf("flowplane %s: stderr %q, want the one line %q", strings.Join(c.oldArgs, " "), o.stderr, notice)
			}
			if strings.Contains(n.stderr, "deprecated") {
				t.Errorf("flowplane %s: %q", strings.Join(c.newArgs, " "), n.stderr)
			}
			if o.code != n.code || o.stdout != n.stdout || !c.otherErr && o.err != n.err {
				t.Errorf("old and new spellings differ:\n  %s: exit %d, %q, %q\n  %s: exit %d, %q, %q",
					strings.Join(c.oldArgs, " "), o.code, o.err, o.stdout, strings.Join(c.newArgs, " "), n.code, n.err, n.stdout)
			}
			seen[c.old] = true
		})
	}
	for old, repl := range forms {
		if !seen[old] {
			t.Errorf("deprecated spelling %q (use %q) is not exercised by this test: add it to the table", old, repl)
		}
		// The replacement names visible commands.
		words := []string{}
		for _, w := range strings.Fields(repl) {
			if w == "" || strings.HasPrefix(w, "-") || unicode.IsUpper(rune(w[0])) {
				break
			}
			words = append(words, w)
		}
		c, rest, err := commands.Root().Find(words)
		if err != nil || len(rest) > 0 || c.Hidden || c.HasAvailableSubCommands() {
			t.Errorf("deprecated %q: its replacement %q is no visible command", old, repl)
		}
	}
	// lab ls is a plain alias of list: no notice.
	if r := execute(t, "", "lab", "ls", "--json"); r.stderr != "" || r.code != execute(t, "", "lab", "list", "--json").code {
		t.Errorf("lab ls: exit %d, stderr %q", r.code, r.stderr)
	}
}

// registered is every deprecated spelling the tree records: old → replacement.
func registered(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range walk(commands.Root()) {
		for old, repl := range cli.DeprecatedForms(n.cmd) {
			if prev, dup := out[old]; dup && prev != repl {
				t.Errorf("%q is deprecated for both %q and %q", old, prev, repl)
			}
			out[old] = repl
		}
	}
	return out
}
