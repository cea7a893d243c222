package topo

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const schemaFile = "../../analytics/src/flowplane_analytics/lab_schema.json"

// The analytics' copy of the schema is generated: it must be what the generator writes now.
func TestSchemaJSONUpToDate(t *testing.T) {
	t.Parallel()
	want, err := SchemaJSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatalf("%v; run `go generate ./internal/topo`", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what internal/topo/schemagen writes; run `go generate ./internal/topo`", schemaFile)
	}
}

type shapeCase struct {
	Name string   `yaml:"name"`
	YAML string   `yaml:"yaml"`
	Want []string `yaml:"want"`
}

// The cases the analytics' checker must answer exactly as Go does (see the file's comment).
func TestShapeCases(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("testdata/shape_cases.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cases []shapeCase
	if err := yaml.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 20 {
		t.Fatalf("only %d cases read", len(cases))
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(c.YAML))
			if err == nil {
				t.Fatal("no error")
			}
			if got := err.Error(); got != strings.Join(c.Want, "\n") {
				t.Errorf("got:\n%s\nwant:\n%s", got, strings.Join(c.Want, "\n"))
			}
		})
	}
}

// The levels' Values and Required say what decode does: a value of the wrong shape under each
// key is an error at that key (not an unknown key), each level rejects an unknown key, and a
// mapping without a required key is an error naming it.
func TestSchemaMatchesDecode(t *testing.T) {
	t.Parallel()
	// Each level inside a valid topology: the mapping's text replaces MAP, its field path.
	levels := []struct {
		level Level
		doc   string
		field string
	}{
		{TopLevel, "MAP", ""},
		{NodeLevel, "nodes: {a: MAP, b: {}}\nlinks: [{endpoints: [a, b]}]", "nodes.a"},
		{LinkLevel, "nodes: {a: {}, b: {}}\nlinks: [MAP]", "links[0]"},
		{EndpointLevel, "nodes: {a: {}, b: {}}\nlinks: [{endpoints: [MAP, b]}]", "links[0].endpoints[0]"},
	}
	valid := map[string]string{ // a good value of each key, to build the rest of a mapping
		"name": "x", "nodes": "{a: {}, b: {}}", "links": "[{endpoints: [a, b]}]", "endpoints": "[a, b]", "node": "a",
	}
	wrong := map[Value]string{ScalarValue: "[1]", MappingValue: "[1]", ListValue: "{x: 1}"}
	mapping := func(keys map[string]string) string {
		var parts []string
		for k, v := range keys {
			parts = append(parts, k+": "+v)
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	errsOf := func(t *testing.T, doc string) Errors {
		t.Helper()
		_, err := Parse("s.yaml", []byte(doc))
		var es Errors
		if err != nil && !errors.As(err, &es) {
			t.Fatalf("%q: %v", doc, err)
		}
		return es
	}
	for _, l := range levels {
		if len(l.level.Keys) != len(l.level.Values) {
			t.Errorf("%s: %d keys, %d values", l.level.Field, len(l.level.Keys), len(l.level.Values))
		}
		base := map[string]string{}
		for _, k := range l.level.Required {
			base[k] = valid[k]
		}
		if es := errsOf(t, strings.Replace(l.doc, "MAP", mapping(base), 1)); len(es) > 0 {
			t.Fatalf("%s with its required keys only: %v", l.level.Field, es)
		}
		for _, k := range l.level.Keys {
			m := map[string]string{}
			for kk, v := range base {
				m[kk] = v
			}
			m[k] = wrong[l.level.Values[k]]
			field := k
			if l.field != "" {
				field = l.field + "." + k
			}
			found := false
			for _, e := range errsOf(t, strings.Replace(l.doc, "MAP", mapping(m), 1)) {
				if strings.Contains(e.Msg, "unknown key") {
					t.Errorf("%s: known key reported unknown: %v", field, e)
				}
				found = found || e.Field == field
			}
			if !found {
				t.Errorf("%s: a value that is not a %s gave no error there", field, l.level.Values[k])
			}
		}
		m := map[string]string{"nosuchkey": "1"}
		for kk, v := range base {
			m[kk] = v
		}
		es := errsOf(t, strings.Replace(l.doc, "MAP", mapping(m), 1))
		if len(es) != 1 || !strings.Contains(es[0].Msg, `unknown key "nosuchkey"`) {
			t.Errorf("%s: unknown key: %v", l.level.Field, es)
		}
		for _, k := range l.level.Required {
			m := map[string]string{}
			for kk, v := range base {
				if kk != k {
					m[kk] = v
				}
			}
			want := k
			if l.field != "" {
				want = l.field + "." + k
			}
			found := false
			for _, e := range errsOf(t, strings.Replace(l.doc, "MAP", mapping(m), 1)) {
				found = found || (e.Field == want && strings.HasPrefix(e.Msg, "missing"))
			}
			if !found {
				t.Errorf("%s: required, but its absence is no error", want)
			}
		}
	}
	for _, k := range Kinds {
		if es := errsOf(t, fmt.Sprintf("nodes: {a: {kind: %s}, b: {}}\nlinks: [{endpoints: [a, b]}]", k)); len(es) > 0 {
			t.Errorf("kind %s: %v", k, es)
		}
	}
	for _, b := range Booleans {
		if es := errsOf(t, fmt.Sprintf("nodes: {a: {xdp: %s}, b: {}}\nlinks: [{endpoints: [a, b]}]", b)); len(es) > 0 {
			t.Errorf("xdp: %s: %v", b, es)
		}
	}
}
