package topo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

//go:generate go run ./schemagen ../../analytics/src/flowplane_analytics/lab_schema.json

// The shape of a topology file: the keys of each of its mappings, what each key holds, the
// values a node kind or a boolean may take, the name patterns, and the messages of these
// checks. decode checks files against these definitions, and `go generate ./internal/topo`
// writes them (SchemaJSON) to analytics/src/flowplane_analytics/lab_schema.json, from which
// flowplane-analytics validates lab topologies by the same rules as `flowplane lab up`.
// TestSchemaJSONUpToDate fails when that file lags behind.

// Value is what a key's value must be.
type Value string

const (
	ScalarValue  Value = "scalar"  // a single value (a string, a number, true or false)
	MappingValue Value = "mapping" // keys and values
	ListValue    Value = "list"    // a sequence
)

// Level is one kind of mapping in a topology file.
type Level struct {
	// Field is how messages name the mapping: NAME stands for a node's name, I and J for
	// indexes (links[0].endpoints[1]).
	Field string `json:"field"`
	// Keys are the known keys, in the order "must be a mapping with keys …" lists them (an
	// unknown key's message lists them sorted).
	Keys []string `json:"keys"`
	// Values says what each key holds.
	Values map[string]Value `json:"values"`
	// Required are the keys a mapping of this level must have.
	Required []string `json:"required"`
}

var (
	// TopLevel is the file's top mapping.
	TopLevel = Level{
		Field:    "",
		Keys:     []string{"name", "nodes", "links"},
		Values:   map[string]Value{"name": ScalarValue, "nodes": MappingValue, "links": ListValue},
		Required: []string{"nodes", "links"},
	}
	// NodeLevel is a node's settings: the value of nodes.NAME.
	NodeLevel = Level{
		Field:    "nodes.NAME",
		Keys:     []string{"kind", "xdp", "env"},
		Values:   map[string]Value{"kind": ScalarValue, "xdp": ScalarValue, "env": MappingValue},
		Required: []string{},
	}
	// LinkLevel is an element of links.
	LinkLevel = Level{
		Field: "links[I]",
		Keys:  append([]string{"endpoints", "mtu", "rate", "loss"}, ImpairmentKeys...),
		Values: map[string]Value{
			"endpoints": ListValue, "mtu": ScalarValue, "rate": ScalarValue, "loss": ScalarValue, "delay": ScalarValue,
			"jitter": ScalarValue, "distribution": ScalarValue, "reorder": ScalarValue, "duplicate": ScalarValue, "corrupt": ScalarValue,
		},
		Required: []string{"endpoints"},
	}
	// EndpointLevel is an endpoint given as a mapping (else it is a node name).
	EndpointLevel = Level{
		Field: "links[I].endpoints[J]",
		Keys:  append([]string{"node", "ipv4", "ipv6", "rate", "loss"}, ImpairmentKeys...),
		Values: map[string]Value{"node": ScalarValue, "ipv4": ScalarValue, "ipv6": ScalarValue, "rate": ScalarValue, "loss": ScalarValue, "delay": ScalarValue,
			"jitter": ScalarValue, "distribution": ScalarValue, "reorder": ScalarValue, "duplicate": ScalarValue, "corrupt": ScalarValue},
		Required: []string{"node"},
	}
)

// ImpairmentKeys are the keys of Impairment, which a link sets for both directions and an
// endpoint for what it sends.
var ImpairmentKeys = []string{"delay", "jitter", "distribution", "reorder", "duplicate", "corrupt"}

// Kinds are the node kinds; a node without kind: is the first.
var Kinds = []Kind{Host, Router}

// Booleans are the values a boolean key (xdp) takes, exactly: YAML 1.2's, as yaml.v3 reads
// them (yes, on, True are not booleans here).
var Booleans = []string{"true", "false"}

// EndpointsPerLink is how many endpoints a link has.
const EndpointsPerLink = 2

// EnvNameForbidden are the characters an env variable's name cannot hold (nor be empty).
const EnvNameForbidden = "= \t"

// The messages of the shape checks; %q and %s are filled as fmt does.
const (
	msgEmpty            = "a topology needs nodes and links (see docs/lab.md)"
	msgNodesType        = "must be a mapping of node name to its settings, e.g. {h1: {}, r1: {kind: router}}"
	msgNodesMissing     = "missing; list the hosts and routers, e.g. nodes: {h1: {}, r1: {kind: router}}"
	msgNodesEmpty       = "no nodes; a topology needs at least two"
	msgNodeName         = "node name %q must be 1-15 lowercase letters, digits or dashes, starting with a letter"
	msgNodeTwice        = "node %q defined twice"
	msgBoolean          = "%q is not a boolean; write true or false"
	msgEnvType          = "must be a mapping of variable name to value"
	msgEnvName          = "%q is not a variable name"
	msgLinksType        = "must be a list of links, e.g. [{endpoints: [h1, r1]}]"
	msgLinksMissing     = "missing; list the links, e.g. links: [{endpoints: [h1, r1]}]"
	msgEndpointsType    = "must list exactly two endpoints, e.g. [h1, r1] or [{node: h1, ipv4: 198.18.1.1/24}, …]"
	msgEndpointsMissing = "missing; name the two nodes the link joins, e.g. endpoints: [h1, r1]"
	msgEndpointNodeMiss = "missing; name the node this endpoint is on"
	msgUnknownNode      = "unknown node %q; nodes are: %s"
	msgSelfLink         = "both endpoints are %q; a link joins two different nodes"
)

// msgKind is the message for a kind not in Kinds: "unknown kind %q; use host or router".
var msgKind = "unknown kind %q; use " + orList(Kinds)

func orList[T ~string](vs []T) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

func isKind(s string) bool {
	for _, k := range Kinds {
		if string(k) == s {
			return true
		}
	}
	return false
}

// Schema is what SchemaJSON writes: everything above, for a checker in another language.
type Schema struct {
	Comment          string            `json:"comment"`
	Levels           map[string]Level  `json:"levels"` // top, node, link, endpoint
	Kinds            []Kind            `json:"kinds"`
	Booleans         []string          `json:"booleans"`
	EndpointsPerLink int               `json:"endpoints_per_link"`
	EnvNameForbidden string            `json:"env_name_forbidden"`
	NamePattern      string            `json:"name_pattern"`      // the topology's name: key (Go regexp syntax)
	NodeNamePattern  string            `json:"node_name_pattern"` // a node's name
	Messages         map[string]string `json:"messages"`
}

// LabSchema returns the shape of a topology file.
func LabSchema() Schema {
	return Schema{
		Comment: "Generated by `go generate ./internal/topo` (internal/topo/schema.go): the shape of a lab " +
			"topology (docs/lab.md) that `flowplane lab up` checks. Do not edit; change the Go definitions.",
		Levels: map[string]Level{
			"top": TopLevel, "node": NodeLevel, "link": LinkLevel, "endpoint": EndpointLevel,
		},
		Kinds:            Kinds,
		Booleans:         Booleans,
		EndpointsPerLink: EndpointsPerLink,
		EnvNameForbidden: EnvNameForbidden,
		NamePattern:      nameRE.String(),
		NodeNamePattern:  nodeNameRE.String(),
		Messages: map[string]string{
			"empty":             msgEmpty,
			"nodes_type":        msgNodesType,
			"nodes_missing":     msgNodesMissing,
			"nodes_empty":       msgNodesEmpty,
			"node_name":         msgNodeName,
			"node_twice":        msgNodeTwice,
			"kind":              msgKind,
			"boolean":           msgBoolean,
			"env_type":          msgEnvType,
			"env_name":          msgEnvName,
			"links_type":        msgLinksType,
			"links_missing":     msgLinksMissing,
			"endpoints_type":    msgEndpointsType,
			"endpoints_missing": msgEndpointsMissing,
			"endpoint_node":     msgEndpointNodeMiss,
			"unknown_node":      msgUnknownNode,
			"self_link":         msgSelfLink,
			"name":              nameMessage(),
		},
	}
}

// nameMessage is ValidName's message as a template (%q for the name), taken from ValidName
// itself so the two cannot differ.
func nameMessage() string {
	const probe = "\x00"
	err := ValidName(probe)
	if err == nil {
		panic("topo: ValidName accepts a NUL")
	}
	return strings.Replace(err.Error(), strconv.Quote(probe), "%q", 1)
}

// SchemaJSON is LabSchema as the indented JSON `go generate` writes.
func SchemaJSON() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(LabSchema()); err != nil {
		return nil, fmt.Errorf("topo: schema: %w", err)
	}
	return b.Bytes(), nil
}
