package config

import (
	"errors"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestWalkerErrors(t *testing.T) {
	t.Parallel()
	schema := func(c *Collector, data string) {
		root := c.Root([]byte(data), "give name and nodes")
		if root == nil {
			return
		}
		c.EachKey(root, "", []string{"name", "nodes"}, func(key string, v *yaml.Node) {
			if key == "name" {
				if s, ok := c.Scalar(v, "name"); ok && s == "warn" {
					c.Warn(v.Line, "name", "a name that warns")
				}
				return
			}
			if v.Kind != yaml.MappingNode {
				c.EachKey(v, "nodes", []string{"kind"}, nil)
				return
			}
			for i := 0; i+1 < len(v.Content); i += 2 {
				f := Join("nodes", v.Content[i].Value)
				c.EachKey(v.Content[i+1], f, []string{"kind"}, func(_ string, kv *yaml.Node) { c.Scalar(kv, Join(f, "kind")) })
			}
		})
	}
	for _, tc := range []struct {
		name, src string
		want      []string // the errors, in order; nil: none
	}{
		{"valid", "name: x\nnodes:\n  a: {kind: host}\n  b:\n", nil},
		{"empty", "", []string{"f.yaml: the file is empty; give name and nodes"}},
		{"not yaml", "name: [", []string{"f.yaml:1: not valid YAML: did not find expected node content"}},
		// yaml.v3 counts its parser errors' lines from 0, its scanner errors' from 1: both are
		// the file's line here, where the unclosed bracket or the bad character is.
		{"unclosed flow sequence", "a: 1\nb: 2\nc: 3\nd: [1, 2\n", []string{"f.yaml:4: not valid YAML: did not find expected ',' or ']'"}},
		{"unclosed flow mapping", "a: 1\nb: {x: 1\nc: 3\n", []string{"f.yaml:2: not valid YAML: did not find expected ',' or '}'"}},
		{"unclosed on the first line", "a: [1, 2\nb: 1\n", []string{"f.yaml:1: not valid YAML: did not find expected ',' or ']'"}},
		{"sequence item in a mapping", "a: 1\nb: 2\n- c\n", []string{"f.yaml:3: not valid YAML: did not find expected key"}},
		{"scanner error", "a: 1\nb: 2\nc: @x\n", []string{"f.yaml:3: not valid YAML: found character that cannot start any token"}},
		{"tab", "a: 1\nb: 2\nc: 3\n\td: 4\n", []string{"f.yaml:4: not valid YAML: found a tab character that violates indentation"}},
		{"item in a nested mapping", "a: 1\nb:\n  x: 1\n  y: 2\n  - z\n", []string{"f.yaml:5: not valid YAML: did not find expected key"}},
		{"unclosed, then more lines", "x: 0\na: [1,\n  2\nb: 3\n", []string{"f.yaml:2: not valid YAML: did not find expected ',' or ']'"}},
		{"unclosed on line 1, then more lines", "a: [1,\nb: 1\nc: 2\nd: 3\ne: 4\n", []string{"f.yaml:1: not valid YAML: did not find expected ',' or ']'"}},
		{"unclosed, then a comment and a blank line", "a: 1\nb: [1,\n# c\n\n", []string{"f.yaml:2: not valid YAML: did not find expected node content"}},
		{"unclosed quote", "a: \"abc\nb: 1\nc: 2\nd: 3\n", []string{"f.yaml:1: not valid YAML: found unexpected end of stream"}},
		{"carriage returns only", "a: 1\rb: 2\r- c\r", []string{"f.yaml:3: not valid YAML: did not find expected key"}},
		{"CRLF, no final newline", "a: 1\r\nb: 2\r\n- c", []string{"f.yaml:3: not valid YAML: did not find expected key"}},
		{"far down", strings.Repeat("k: v\n", 3000) + "z: \x01\n", []string{"f.yaml:3001: not valid YAML: control characters are not allowed"}},
		{"unclosed at the end", "a: 1\nb: [\n", []string{"f.yaml:2: not valid YAML: did not find expected node content"}},
		{"top not a mapping", "- a\n- b\n", []string{"f.yaml:1: the top level must be a mapping with keys name, nodes"}},
		{"unknown key lists the known, sorted", "nodes: {}\nnmae: x\n", []string{`f.yaml:2: nmae: unknown key "nmae"; known keys here: name, nodes`}},
		{"key twice", "name: a\nname: b\n", []string{`f.yaml:2: name: key "name" given twice`}},
		{"scalar wanted", "name: [a, b]\n", []string{"f.yaml:1: name: must be a single value"}},
		{"null is not a value", "name:\n", []string{"f.yaml:1: name: must be a single value"}},
		{"nested field path", "nodes:\n  a:\n    kind: {x: 1}\n", []string{"f.yaml:3: nodes.a.kind: must be a single value"}},
		{"nested not a mapping", "nodes: 3\n", []string{"f.yaml:1: nodes: nodes must be a mapping with keys kind"}},
		{"every error at once", "name: [a]\nnodes:\n  a: {knd: 1}\n  b: {kind: [c]}\nextra: 1\n", []string{
			"f.yaml:1: name: must be a single value",
			`f.yaml:3: nodes.a.knd: unknown key "knd"; known keys here: kind`,
			"f.yaml:4: nodes.b.kind: must be a single value",
			`f.yaml:5: extra: unknown key "extra"; known keys here: name, nodes`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Collector{File: "f.yaml"}
			schema(c, tc.src)
			err := c.Err()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("unexpected errors:\n%v", err)
				}
				return
			}
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("error %v is not Errors", err)
			}
			if got := strings.Split(err.Error(), "\n"); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("errors:\n%s\nwant:\n%s", err, strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestWarningsAreNotErrors(t *testing.T) {
	t.Parallel()
	c := &Collector{File: "f.yaml"}
	root := c.Root([]byte("name: warn\n"), "")
	c.EachKey(root, "", []string{"name"}, func(_ string, v *yaml.Node) { c.Warn(v.Line, "name", "%s is odd", v.Value) })
	if c.Err() != nil || len(c.Warnings) != 1 || c.Warnings[0] != "f.yaml:1: name: warn is odd" {
		t.Errorf("err %v, warnings %q", c.Err(), c.Warnings)
	}
}

func TestErrorFormat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		e    Error
		want string
	}{
		{Error{File: "a.yaml", Msg: "m"}, "a.yaml: m"},
		{Error{File: "a.yaml", Line: 3, Msg: "m"}, "a.yaml:3: m"},
		{Error{File: "a.yaml", Line: 3, Field: "x.y", Msg: "m"}, "a.yaml:3: x.y: m"},
		{Error{File: "a.yaml", Field: "x", Msg: "m"}, "a.yaml: x: m"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.e, got, tc.want)
		}
	}
}

func TestHasKeyAndJoin(t *testing.T) {
	t.Parallel()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("a: 1\nb: 2\n"), &doc); err != nil {
		t.Fatal(err)
	}
	m := doc.Content[0]
	if !HasKey(m, "b") || HasKey(m, "c") || HasKey(m, "1") {
		t.Errorf("HasKey wrong on %v", m.Content)
	}
	if Join("", "a") != "a" || Join("a", "b") != "a.b" || Join("links[0]", "rate") != "links[0].rate" {
		t.Error("Join")
	}
}
