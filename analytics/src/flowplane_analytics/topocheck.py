"""Checking a topology file's shape, every problem with its line, before it is used.

A lab topology is checked by the rules `flowplane lab up` applies, read from
``lab_schema.json``: the keys of each mapping, what each key holds, the node kinds and boolean
values, the name patterns, and the messages. That file is written by ``go generate
./internal/topo`` from internal/topo's definitions, the ones the Go decoder checks with, so the
two cannot drift apart (internal/topo's TestSchemaJSONUpToDate fails when the file lags behind,
and internal/topo/testdata/shape_cases.yaml holds files both checkers must answer identically).
The messages read ``FILE:LINE: FIELD: message``, as Go's. What only the lab itself uses (rates,
impairments, MTUs, addresses) is left to `flowplane lab up`: the analytics never read it.

A graph file (``links:`` of measurement points, with ``name:`` and ``points:``) has rules of its
own, reported the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

NULL_TAG = "tag:yaml.org,2002:null"
GRAPH_KEYS = ("name", "links", "points")
GRAPH_LINK_KEYS = ("from", "to")


@cache
def schema() -> dict[str, Any]:
    """lab_schema.json, shipped in the package."""
    text = resources.files(__package__).joinpath("lab_schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def _go_quote(s: str) -> str:
    """Go's %q of a string (strconv.Quote)."""
    out = ['"']
    esc = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n"}
    esc |= {"\r": "\\r", "\t": "\\t", "\v": "\\v"}
    for c in s:
        if c in esc:
            out.append(esc[c])
        elif c.isprintable():
            out.append(c)
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    out.append('"')
    return "".join(out)


def go_format(template: str, *args: Any) -> str:
    """A message template of the schema filled as Go's fmt fills %q, %s and %v."""
    it = iter(args)

    def fill(m: re.Match[str]) -> str:
        verb = m.group(1)
        if verb == "%":
            return "%"
        v = next(it)
        return _go_quote(str(v)) if verb == "q" else str(v)

    return re.sub(r"%([qsv%])", fill, template)


def _go_regexp(pattern: str) -> re.Pattern[str]:
    """A Go regexp anchored with ^…$ as a Python one ($ must not match before a newline)."""
    if pattern.endswith("$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def line(n: Node) -> int:
    return n.start_mark.line + 1


def is_null(n: Node) -> bool:
    return isinstance(n, ScalarNode) and n.tag == NULL_TAG


def key_name(k: Node) -> str:
    """A mapping key as Go's yaml.v3 Node.Value holds it ("" for a non-scalar key)."""
    return k.value if isinstance(k, ScalarNode) else ""


def has_key(n: Node, key: str) -> bool:
    return isinstance(n, MappingNode) and any(key_name(k) == key for k, _ in n.value)


def join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


class Collector:
    """The problems of one file, formatted as internal/config's Error."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.errs: list[str] = []

    def add(self, at: int, field: str, msg: str) -> None:
        where = f"{self.file}:{at}" if at > 0 else self.file
        self.errs.append(f"{where}: {field}: {msg}" if field else f"{where}: {msg}")

    def each_key(
        self, n: Node, field: str, known: Sequence[str], fn: Callable[[str, Node], None]
    ) -> None:
        """fn for each key of mapping n; unknown keys and keys given twice are reported, a null
        (``h1:`` with nothing after it) is an empty mapping (internal/config's EachKey)."""
        if is_null(n):
            return
        if not isinstance(n, MappingNode):
            name = field or "the top level"
            self.add(line(n), field, f"{name} must be a mapping with keys {', '.join(known)}")
            return
        seen: set[str] = set()
        for k, v in n.value:
            name = key_name(k)
            f = join(field, name)
            if name not in known:
                self.add(
                    line(k),
                    f,
                    f"unknown key {_go_quote(name)}; known keys here: {', '.join(sorted(known))}",
                )
                continue
            if name in seen:
                self.add(line(k), f, f"key {_go_quote(name)} given twice")
                continue
            seen.add(name)
            fn(name, v)

    def scalar(self, n: Node, field: str) -> str | None:
        if not isinstance(n, ScalarNode) or n.tag == NULL_TAG:
            self.add(line(n), field, "must be a single value")
            return None
        return n.value


def check_lab(file: str, root: Node) -> list[str]:
    """The problems of a lab topology, in the order `flowplane lab up` reports them: the
    file's shape first; the endpoints and node names only once the shape is right."""
    sc = schema()
    lv = sc["levels"]
    msg = sc["messages"]
    el = Collector(file)
    name_re = _go_regexp(sc["name_pattern"])
    node_re = _go_regexp(sc["node_name_pattern"])
    nodes: list[tuple[str, int]] = []  # (name, line)
    links: list[tuple[int, list[tuple[str, int]] | None]] = []  # (line, endpoints)

    def scalar_keys(level: str, field: str, fn: Callable[[str, str, Node], None]) -> Callable:
        """A key callback that first checks the values the level says are single values."""

        def each(key: str, v: Node) -> None:
            if lv[level]["values"][key] == "scalar":
                s = el.scalar(v, join(field, key))
                if s is None:
                    return
                fn(key, s, v)
            else:
                fn(key, "", v)

        return each

    def decode_nodes(v: Node) -> None:
        if not isinstance(v, MappingNode):
            el.add(line(v), "nodes", msg["nodes_type"])
            return
        for k, val in v.value:
            name = key_name(k)
            field = "nodes." + name
            nodes.append((name, line(k)))
            if not node_re.match(name):
                el.add(line(k), field, go_format(msg["node_name"], name))

            def node_key(key: str, s: str, kv: Node, field: str = field) -> None:
                if key == "kind" and s not in sc["kinds"]:
                    el.add(line(kv), field + ".kind", go_format(msg["kind"], s))
                elif key == "xdp" and s not in sc["booleans"]:
                    el.add(line(kv), field + ".xdp", go_format(msg["boolean"], s))
                elif key == "env":
                    decode_env(kv, field + ".env")

            el.each_key(val, field, lv["node"]["keys"], scalar_keys("node", field, node_key))
        if not v.value:
            el.add(line(v), "nodes", msg["nodes_empty"])

    def decode_env(v: Node, field: str) -> None:
        if not isinstance(v, MappingNode):
            el.add(line(v), field, msg["env_type"])
            return
        for k, val in v.value:
            name = key_name(k)
            if name == "" or any(c in name for c in sc["env_name_forbidden"]):
                el.add(line(k), field, go_format(msg["env_name"], name))
                continue
            el.scalar(val, field + "." + name)

    def decode_links(v: Node) -> None:
        if not isinstance(v, SequenceNode):
            el.add(line(v), "links", msg["links_type"])
            return
        for i, lnk in enumerate(v.value):
            field = f"links[{i}]"
            ends: list[list[tuple[str, int]] | None] = [None]

            def link_key(key: str, s: str, kv: Node, field: str = field, ends: list = ends) -> None:
                if key == "endpoints":
                    ends[0] = decode_endpoints(kv, field + ".endpoints")

            el.each_key(lnk, field, lv["link"]["keys"], scalar_keys("link", field, link_key))
            if isinstance(lnk, MappingNode) and not has_key(lnk, "endpoints"):
                el.add(line(lnk), field + ".endpoints", msg["endpoints_missing"])
            links.append((line(lnk), ends[0]))

    def decode_endpoints(v: Node, field: str) -> list[tuple[str, int]] | None:
        if not isinstance(v, SequenceNode) or len(v.value) != sc["endpoints_per_link"]:
            el.add(line(v), field, msg["endpoints_type"])
            return None
        ends = []
        for j, ev in enumerate(v.value):
            f = f"{field}[{j}]"
            if isinstance(ev, ScalarNode):
                ends.append((ev.value, line(ev)))
                continue
            node = [""]

            def endpoint_key(key: str, s: str, kv: Node, node: list = node) -> None:
                if key == "node":
                    node[0] = s

            el.each_key(ev, f, lv["endpoint"]["keys"], scalar_keys("endpoint", f, endpoint_key))
            if node[0] == "" and isinstance(ev, MappingNode) and not has_key(ev, "node"):
                el.add(line(ev), f + ".node", msg["endpoint_node"])
            ends.append((node[0], line(ev)))
        return ends

    def top_key(key: str, s: str, v: Node) -> None:
        if key == "name" and not name_re.match(s):
            el.add(line(v), "name", go_format(msg["name"], s))
        elif key == "nodes":
            decode_nodes(v)
        elif key == "links":
            decode_links(v)

    el.each_key(root, "", lv["top"]["keys"], scalar_keys("top", "", top_key))
    if isinstance(root, MappingNode):
        for key in lv["top"]["required"]:
            if not has_key(root, key):
                el.add(line(root), key, msg[f"{key}_missing"])
    if el.errs:
        return el.errs
    # As internal/topo's build: each node once, each endpoint a node, no link to itself.
    known: list[str] = []
    for name, at in nodes:
        if name in known:
            el.add(at, "nodes." + name, go_format(msg["node_twice"], name))
            continue
        known.append(name)
    for i, (at, ends) in enumerate(links):
        if ends is None or len(ends) != sc["endpoints_per_link"]:
            continue
        field = f"links[{i}].endpoints"
        ok = True
        for j, (node, eat) in enumerate(ends):
            if node not in known:
                el.add(eat, f"{field}[{j}]", go_format(msg["unknown_node"], node, ", ".join(known)))
                ok = False
        if ok and ends[0][0] == ends[1][0]:
            el.add(at, field, go_format(msg["self_link"], ends[0][0]))
    return el.errs


def check_graph(file: str, root: Node) -> list[str]:
    """The problems of a graph file: name, links ([FROM, TO] or {from, to}) and points."""
    el = Collector(file)
    want_link = "want [FROM, TO] or {from: FROM, to: TO}, two measurement points"

    def top(key: str, v: Node) -> None:
        if key == "name":
            el.scalar(v, "name")
            return
        if not isinstance(v, SequenceNode):
            el.add(line(v), key, f"must be a list of measurement points ({key}: [...])")
            return
        for i, item in enumerate(v.value):
            f = f"{key}[{i}]"
            if key == "points":
                el.scalar(item, f)
            elif isinstance(item, SequenceNode):
                if len(item.value) != 2:
                    el.add(line(item), f, want_link)
                ends = [el.scalar(p, f"{f}[{j}]") for j, p in enumerate(item.value)]
                self_link(item, f, ends)
            elif isinstance(item, MappingNode):
                el.each_key(item, f, GRAPH_LINK_KEYS, lambda k, pv, f=f: el.scalar(pv, join(f, k)))
                for k in GRAPH_LINK_KEYS:
                    if not has_key(item, k):
                        el.add(line(item), join(f, k), f"missing; {want_link}")
                given = {key_name(k): plain(v) for k, v in item.value}  # a key twice: one
                self_link(item, f, [given[k] for k in GRAPH_LINK_KEYS if k in given])
            else:
                el.add(line(item), f, want_link)

    def self_link(item: Node, f: str, ends: list[Any]) -> None:
        if len(ends) == 2 and ends[0] is not None and ends[0] == ends[1]:
            el.add(line(item), f, f"a link from {ends[0]} to itself; {want_link}")

    el.each_key(root, "", GRAPH_KEYS, top)
    return el.errs


def plain(n: Node) -> Any:
    """A composed node as Python values, every scalar as the text written (as Go reads it:
    ``no`` stays "no", ``01`` stays "01"), a null as None."""
    if isinstance(n, MappingNode):
        return {key_name(k): plain(v) for k, v in n.value}
    if isinstance(n, SequenceNode):
        return [plain(v) for v in n.value]
    return None if is_null(n) else n.value


def compose(file: str, text: str) -> Node | None:
    """The YAML node tree of text; ValueError with the line of a syntax error."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{file}:{mark.line + 1}" if mark else file
        what = e.problem or "syntax error"
        ctx = f" ({e.context}" + (f" on line {e.context_mark.line + 1})" if e.context_mark else ")")
        raise ValueError(f"{where}: not valid YAML: {what}{ctx if e.context else ''}") from e
    except yaml.YAMLError as e:
        raise ValueError(f"{file}: not valid YAML: {e}") from e
