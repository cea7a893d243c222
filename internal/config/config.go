// Package config reads YAML configuration files by walking yaml.v3's node tree, so that every
// problem is reported with its line and field, unknown keys list the known ones, and a whole
// file's problems come out at once instead of the first.
package config

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Error is one problem in a file: where it is and how to fix it.
type Error struct {
	File  string
	Line  int    // 0 when the problem is the file as a whole
	Field string // path of the key, e.g. links[1].rate
	Msg   string
}

func (e Error) Error() string {
	where := e.File
	if e.Line > 0 {
		where = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Field == "" {
		return where + ": " + e.Msg
	}
	return where + ": " + e.Field + ": " + e.Msg
}

// Errors is every problem found in one file.
type Errors []Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Collector gathers the errors and warnings of one file.
type Collector struct {
	File     string
	Errs     Errors
	Warnings []string // accepted, but worth saying: "file:line: field: message"
}

// Warn records something accepted that the user should know.
func (c *Collector) Warn(line int, field, format string, args ...any) {
	c.Warnings = append(c.Warnings, Error{File: c.File, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)}.Error())
}

// Add records a problem at line in field.
func (c *Collector) Add(line int, field, format string, args ...any) {
	c.Errs = append(c.Errs, Error{File: c.File, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// Err returns the errors as an error, or nil if there are none.
func (c *Collector) Err() error {
	if len(c.Errs) == 0 {
		return nil
	}
	return c.Errs
}

// Root parses data and returns its top node, or nil after recording why there is none.
func (c *Collector) Root(data []byte, what string) *yaml.Node {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		line, msg := syntaxError(err, data)
		c.Add(line, "", "not valid YAML: %s", msg)
		return nil
	}
	if len(doc.Content) == 0 {
		c.Add(0, "", "the file is empty; %s", what)
		return nil
	}
	return doc.Content[0]
}

// yamlParserProblems are the messages of yaml.v3's parser errors, whose "line N" counts from 0
// (and is left out for the first line), where its scanner errors count from 1; the line is
// where the construct the parser gave up on begins.
var yamlParserProblems = []string{
	"did not find expected ',' or ']'", "did not find expected ',' or '}'",
	"did not find expected '-' indicator", "did not find expected <document start>",
	"did not find expected <stream-start>", "did not find expected key",
	"did not find expected node content", "found duplicate %TAG directive",
	"found duplicate %YAML directive", "found incompatible YAML document", "found undefined tag handle",
}

// yamlOpen are the errors of a construct left open to the end of the file (a flow collection,
// a quoted string): the line to fix is where it opens.
var yamlOpen = []string{"did not find expected ',' or ']'", "did not find expected ',' or '}'", "found unexpected end of stream"}

var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// syntaxError splits yaml.v3's syntax error into the line (1-based; 0 when unknown) and the
// message. yaml.v3 names where the enclosing construct begins (a tab is reported on the line
// above it, an item in a mapping on the mapping's first key; nothing on line 1), so the line is
// found again from the file: for a construct left open, the line after the last that the file
// parses up to; for any other error, the first line up to which the file fails with it.
func syntaxError(err error, data []byte) (int, string) {
	m := yamlLine.FindStringSubmatch(err.Error())
	if m == nil {
		return 0, err.Error()
	}
	line, _ := strconv.Atoi(m[1])
	msg := m[2]
	text := strings.ReplaceAll(strings.ReplaceAll(string(data), "\r\n", "\n"), "\r", "\n")
	lines := strings.SplitAfter(strings.TrimSuffix(text, "\n"), "\n")
	if slices.Contains(yamlParserProblems, msg) {
		line = min(line+1, len(lines)) // at the end of the file the parser points past it
	}
	parse := func(n int) error {
		var doc yaml.Node
		return yaml.Unmarshal([]byte(strings.Join(lines[:n], "")), &doc)
	}
	same := func(n int) bool {
		sm := yamlLine.FindStringSubmatch(fmt.Sprint(parse(n)))
		return sm != nil && sm[2] == msg
	}
	if slices.Contains(yamlOpen, msg) {
		if len(lines) > maxBackward {
			return line, msg
		}
		for n := len(lines) - 1; n >= 0; n-- {
			if parse(n) == nil {
				return n + 1, msg
			}
		}
		return line, msg
	}
	if !same(len(lines)) {
		return line, msg
	}
	return sort.Search(len(lines), func(i int) bool { return same(i + 1) }) + 1, msg
}

// maxBackward is the longest file searched backward for an open construct (each step parses the
// file up to a line again: quadratic); a longer one gets yaml.v3's line.
const maxBackward = 2000

// EachKey calls fn for each key of mapping v, reporting keys not in known and keys given twice.
// A null value ("h1:" with nothing after it) is an empty mapping.
func (c *Collector) EachKey(v *yaml.Node, field string, known []string, fn func(key string, v *yaml.Node)) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return
	}
	if v.Kind != yaml.MappingNode {
		name := field
		if name == "" {
			name = "the top level"
		}
		c.Add(v.Line, field, "%s must be a mapping with keys %s", name, strings.Join(known, ", "))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k := v.Content[i]
		f := Join(field, k.Value)
		if !slices.Contains(known, k.Value) {
			sorted := slices.Clone(known)
			sort.Strings(sorted)
			c.Add(k.Line, f, "unknown key %q; known keys here: %s", k.Value, strings.Join(sorted, ", "))
			continue
		}
		if seen[k.Value] {
			c.Add(k.Line, f, "key %q given twice", k.Value)
			continue
		}
		seen[k.Value] = true
		fn(k.Value, v.Content[i+1])
	}
}

// Scalar returns v's value, recording an error if v is not a single value.
func (c *Collector) Scalar(v *yaml.Node, field string) (string, bool) {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		c.Add(v.Line, field, "must be a single value")
		return "", false
	}
	return v.Value, true
}

// Bool returns v as a boolean: true, yes or on; false, no or off (any case). Anything else
// (1, t, maybe) is recorded as an error.
func (c *Collector) Bool(v *yaml.Node, field string) (bool, bool) {
	s, ok := c.Scalar(v, field)
	if !ok {
		return false, false
	}
	switch strings.ToLower(s) {
	case "true", "yes", "on":
		return true, true
	case "false", "no", "off":
		return false, true
	}
	c.Add(v.Line, field, "%q is not true or false; write true, yes or on, or false, no or off", s)
	return false, false
}

// HasKey reports whether mapping v has key.
func HasKey(v *yaml.Node, key string) bool {
	for i := 0; i+1 < len(v.Content); i += 2 {
		if v.Content[i].Value == key {
			return true
		}
	}
	return false
}

// KeyLine is the line of key in mapping v, or v's own line when v has no such key: an error
// about a key's value in the context of others points at the key.
func KeyLine(v *yaml.Node, key string) int {
	for i := 0; i+1 < len(v.Content); i += 2 {
		if v.Content[i].Value == key {
			return v.Content[i].Line
		}
	}
	return v.Line
}

// Join appends key to a field path.
func Join(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}
