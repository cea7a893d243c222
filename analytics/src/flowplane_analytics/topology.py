"""Measurement-point graphs: from a lab topology (internal/lab's YAML, docs/lab.md) or from an
explicit graph file.

A measurement point (MP) is (probe, ifname, direction): direction ``in`` counts packets arriving
on the interface (tcx ingress), ``out`` packets leaving it (tcx egress). Its id is the string
``probe:ifname:direction``. The MP graph has a directed link wherever a packet seen at one MP
can next be seen at another: across a wire from an ``out`` MP to the peer's ``in`` MP, and
inside a router from each ``in`` MP to every other interface's ``out`` MP.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import networkx as nx
import yaml

from . import topocheck


@dataclass(frozen=True, order=True)
class Point:
    probe: str
    ifname: str
    direction: str  # "in", "out", or "" for an abstract point of a graph file

    @property
    def id(self) -> str:
        if not self.ifname and not self.direction:
            return self.probe
        return f"{self.probe}:{self.ifname}:{self.direction}"

    @staticmethod
    def parse(s: str) -> Point:
        parts = str(s).split(":")
        if len(parts) == 3 and parts[2] in ("in", "out"):
            return Point(parts[0], parts[1], parts[2])
        return Point(str(s), "", "")


@dataclass
class Network:
    """An MP graph with, for lab topologies, what is needed to draw and alias it."""

    graph: nx.DiGraph
    name: str = ""
    # ifname aliases: the probe records the kernel name (fp<tag>-eth0); the topology says eth0.
    aliases: dict[str, list[str]] = field(default_factory=dict)
    node_graph: nx.Graph | None = None  # lab nodes and links, for drawing
    routes: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    lab_links: list[tuple[str, str, str, str]] = field(default_factory=list)  # a, ifa, b, ifb
    hosts: list[str] = field(default_factory=list)

    def points(self) -> list[Point]:
        return sorted(self.graph.nodes)

    def ifname_aliases(self, p: Point) -> list[str]:
        return [p.ifname, *self.aliases.get(p.ifname, [])] if p.ifname else [p.ifname]


class TopologyError(ValueError):
    """A topology or graph file that cannot be used: every problem found, one per line
    (``FILE:LINE: FIELD: message``)."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


def _fnv32a(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def lab_tag(lab: str) -> str:
    """internal/lab's interface-name tag: the lab name, or for names longer than 5 characters
    its first 3 characters and 2 hex digits of its FNV-1a hash."""
    if len(lab) <= 5:
        return lab
    return lab[:3] + f"{_fnv32a(lab.encode()) & 0xFF:02x}"


def lab_ifname(lab: str, iface: str) -> str:
    return f"fp{lab_tag(lab)}-{iface}"


WANT = "want a lab topology (nodes:, links:; docs/lab.md) or a graph file (links: of points)"


def _is_lab(root: Any) -> bool:
    """A lab topology has nodes:, or links whose elements have endpoints: (a graph file's are
    pairs of points)."""
    if topocheck.has_key(root, "nodes"):
        return True
    for k, v in root.value:
        if topocheck.key_name(k) == "links" and isinstance(v, yaml.SequenceNode):
            return any(topocheck.has_key(item, "endpoints") for item in v.value)
    return False


def load(path: str | Path, probe_hosts: bool = False) -> Network:
    """A lab topology (has ``nodes``) or an explicit graph file (has ``links`` of MP ids, YAML or
    JSON; or GraphML). probe_hosts: a lab's hosts are probed too (their links become
    clusters). TopologyError naming the file (and line) of every problem: a lab topology is
    checked by the rules of `flowplane lab up` (topocheck)."""
    file = str(path)
    path = Path(path)
    if path.suffix.lower() == ".graphml":
        return _load_graphml(file, path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TopologyError(f"{file}: not a text file ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise TopologyError(f"{file}: cannot read the topology: {e.strerror or e}") from e
    try:
        root = topocheck.compose(file, text)
    except ValueError as e:
        raise TopologyError(str(e)) from e
    if root is None or topocheck.is_null(root):
        raise TopologyError(f"{file}: the file is empty; {WANT}")
    if not isinstance(root, yaml.MappingNode):
        raise TopologyError(
            f"{file}:{topocheck.line(root)}: the top level is not a mapping; {WANT}"
        )
    if _is_lab(root):
        errs = topocheck.check_lab(file, root)
        if errs:
            raise TopologyError(errs)
        return lab_network(topocheck.plain(root), default_name=path.stem, probe_hosts=probe_hosts)
    if topocheck.has_key(root, "links"):
        errs = topocheck.check_graph(file, root)
        if errs:
            raise TopologyError(errs)
        doc = topocheck.plain(root)
        links = []
        for link in doc["links"]:
            if isinstance(link, dict):
                link = [link.get("from"), link.get("to")]
            links.append((str(link[0]), str(link[1])))
        return graph_network(links, points=doc.get("points"), name=doc.get("name") or path.stem)
    keys = ", ".join(sorted(topocheck.key_name(k) for k, _ in root.value)) or "none"
    raise TopologyError(
        f"{file}:{topocheck.line(root)}: neither nodes: nor links: (keys here: {keys}); {WANT}"
    )


def _load_graphml(file: str, path: Path) -> Network:
    try:
        g = nx.read_graphml(path)
    except OSError as e:
        raise TopologyError(f"{file}: cannot read the topology: {e.strerror or e}") from e
    except Exception as e:  # ElementTree's ParseError, NetworkXError, a bad attribute type
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TopologyError(f"{file}: not a GraphML file ({first})") from e
    # networkx reads an <edge> without a source or target as one to a node called "None"
    for e in ElementTree.parse(path).iter():
        if e.tag.rpartition("}")[2] == "edge" and not (e.get("source") and e.get("target")):
            given = " ".join(f'{k}="{v}"' for k, v in e.attrib.items())
            lacks = " and ".join(k for k in ("source", "target") if not e.get(k))
            raise TopologyError(
                f"{file}: <edge {given}> has no {lacks}; give every edge a source and a target"
            )
    loops = sorted(str(a) for a, b in g.edges() if a == b)
    if loops:
        raise TopologyError(
            f"{file}: an edge from {loops[0]} to itself; an edge joins two measurement points"
        )
    return graph_network([(str(a), str(b)) for a, b in g.edges()], name=path.stem)


def graph_network(
    links: Iterable[tuple[str, str]], points: Iterable[str] | None = None, name: str = ""
) -> Network:
    g = nx.DiGraph()
    for p in points or []:
        g.add_node(Point.parse(p))
    for a, b in links:
        g.add_edge(Point.parse(a), Point.parse(b))
    return Network(graph=g, name=name)


def _endpoint(e: Any) -> str:
    if isinstance(e, dict):
        return str(e.get("node"))
    return str(e)


def lab_network(
    doc: dict[str, Any], default_name: str = "lab", probe_hosts: bool = False
) -> Network:
    """The MP graph of a lab topology with a probe on every router interface (and on every host
    interface if probe_hosts). Interfaces are eth0, eth1, … in the order of the node's links, as
    internal/topo names them."""
    name = str(doc.get("name") or default_name)
    nodes = doc.get("nodes") or {}
    if not isinstance(nodes, dict):
        raise TopologyError("nodes: want a mapping name → settings")
    kinds = {str(n): str((s or {}).get("kind", "host")) for n, s in nodes.items()}
    probed = {n for n, k in kinds.items() if k == "router" or probe_hosts}
    ifaces: dict[str, list[str]] = {n: [] for n in kinds}
    lab_links: list[tuple[str, str, str, str]] = []
    for i, link in enumerate(doc.get("links") or []):
        if link is None:
            continue  # `- ` with nothing: `flowplane lab up` ignores it too
        ends = [_endpoint(e) for e in link.get("endpoints", [])]
        if len(ends) != 2 or any(e not in kinds for e in ends):
            raise TopologyError(f"links[{i}].endpoints: want two known nodes, got {ends}")
        a, b = ends
        ia = f"eth{len(ifaces[a])}"
        ifaces[a].append(ia)
        ib = f"eth{len(ifaces[b])}"
        ifaces[b].append(ib)
        lab_links.append((a, ia, b, ib))
    g = nx.DiGraph()
    for n in sorted(probed):
        for i in ifaces[n]:
            g.add_node(Point(n, i, "in"))
            g.add_node(Point(n, i, "out"))
        if kinds[n] == "router":
            for a in ifaces[n]:
                for b in ifaces[n]:
                    if a != b:
                        g.add_edge(Point(n, a, "in"), Point(n, b, "out"))
    for a, ia, b, ib in lab_links:
        if a in probed and b in probed:
            g.add_edge(Point(a, ia, "out"), Point(b, ib, "in"))
            g.add_edge(Point(b, ib, "out"), Point(a, ia, "in"))
    ng = nx.Graph()
    for n, k in kinds.items():
        ng.add_node(n, kind=k)
    for a, ia, b, ib in lab_links:
        ng.add_edge(a, b, ifaces={a: ia, b: ib})
    aliases = {i: [lab_ifname(name, i)] for n in kinds for i in ifaces[n]}
    hosts = [n for n, k in kinds.items() if k != "router"]
    return Network(
        graph=g,
        name=name,
        aliases=aliases,
        node_graph=ng,
        routes=_routes(ng, kinds, lab_links),
        lab_links=lab_links,
        hosts=hosts,
    )


def _routes(
    ng: nx.Graph, kinds: dict[str, str], lab_links: list[tuple[str, str, str, str]]
) -> dict[tuple[str, str], list[str]]:
    """Shortest paths (fewest hops) between hosts where only routers forward; ties go to the
    link listed first, as internal/lab routes."""
    order = {frozenset((a, b)): i for i, (a, _, b, _) in enumerate(lab_links)}
    hosts = [n for n, k in kinds.items() if k != "router"]
    routes: dict[tuple[str, str], list[str]] = {}
    for src in hosts:
        # BFS over routers only, exploring links in file order.
        prev: dict[str, str | None] = {src: None}
        frontier = [src]
        while frontier:
            nxt: list[str] = []
            for u in frontier:
                if u != src and kinds[u] != "router":
                    continue
                for v in sorted(ng.neighbors(u), key=lambda v, u=u: order[frozenset((u, v))]):
                    if v not in prev:
                        prev[v] = u
                        nxt.append(v)
            frontier = nxt
        for dst in hosts:
            if dst == src or dst not in prev:
                continue
            path = [dst]
            while prev[path[-1]] is not None:
                path.append(prev[path[-1]])  # type: ignore[arg-type]
            routes[(src, dst)] = path[::-1]
    return routes


def path_points(net: Network, nodes: list[str]) -> list[Point]:
    """The MPs a packet passes on a node path (hosts have none unless probed)."""
    assert net.node_graph is not None
    out: list[Point] = []
    for i, n in enumerate(nodes):
        if not any(p.probe == n for p in net.graph.nodes):
            continue
        if i > 0:
            out.append(Point(n, net.node_graph.edges[nodes[i - 1], n]["ifaces"][n], "in"))
        if i < len(nodes) - 1:
            out.append(Point(n, net.node_graph.edges[n, nodes[i + 1]]["ifaces"][n], "out"))
    return out


def to_json(net: Network) -> str:
    return json.dumps(
        {"name": net.name, "links": [[a.id, b.id] for a, b in sorted(net.graph.edges)]}, indent=1
    )
