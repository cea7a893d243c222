"""RFC 9342 clustering of a measurement-point graph.

A cluster is the smallest set of links for which "packets in = packets out" holds: group the
links that share a start node, then join the groups that share an end node (repeated until no
two groups share one). Its input MPs are the start nodes of its links and its output MPs the end
nodes (a point that is both cancels out). Directions are kept apart by construction: an MP is
one direction of one interface, so the two directions of a wire are two clusters.

A super-cluster is the union of clusters: Σ of their losses, with the points internal to it
(an output of one member and an input of another) cancelled. The whole network is the
super-cluster of all clusters: its inputs are the MPs no link reaches (ingress) and its outputs
those no link leaves (egress).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import networkx as nx

from .topology import Network, Point

E2E = "e2e"


@dataclass(frozen=True)
class Cluster:
    id: str
    links: tuple[tuple[Point, Point], ...]
    inputs: tuple[Point, ...]
    outputs: tuple[Point, ...]
    label: str = ""

    @property
    def points(self) -> tuple[Point, ...]:
        return tuple(sorted({*self.inputs, *self.outputs}))


def _io(links: Iterable[tuple[Point, Point]]) -> tuple[tuple[Point, ...], tuple[Point, ...]]:
    starts = {a for a, _ in links}
    ends = {b for _, b in links}
    return tuple(sorted(starts - ends)), tuple(sorted(ends - starts))


def _label(inputs: Sequence[Point], outputs: Sequence[Point]) -> str:
    nodes = {p.probe for p in (*inputs, *outputs)}
    if len(nodes) == 1:
        return f"node {next(iter(nodes))}"
    if len(inputs) == 1 and len(outputs) == 1:
        return f"{inputs[0].id} → {outputs[0].id}"
    ins = sorted({p.probe for p in inputs})
    outs = sorted({p.probe for p in outputs})
    return f"{','.join(ins)} → {','.join(outs)}"


def clusterize(graph: nx.DiGraph) -> list[Cluster]:
    """The RFC 9342 partition of graph's links into clusters, ordered by their first input and
    numbered C1, C2, …"""
    links = sorted(graph.edges)
    parent = list(range(len(links)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)

    # Step 1: links with the same start node form a group.
    first_by_start: dict[Point, int] = {}
    for i, (a, _) in enumerate(links):
        union(i, first_by_start.setdefault(a, i))
    # Step 2: groups with an end node in common are joined (union-find makes it transitive).
    first_by_end: dict[Point, int] = {}
    for i, (_, b) in enumerate(links):
        union(i, first_by_end.setdefault(b, i))
    groups: dict[int, list[tuple[Point, Point]]] = {}
    for i, link in enumerate(links):
        groups.setdefault(find(i), []).append(link)
    raw = []
    for ls in groups.values():
        ins, outs = _io(ls)
        raw.append((ins, outs, tuple(ls)))
    raw.sort(key=lambda r: (r[0], r[1]))
    return [
        Cluster(f"C{i + 1}", ls, ins, outs, _label(ins, outs))
        for i, (ins, outs, ls) in enumerate(raw)
    ]


def super_cluster(cid: str, members: Sequence[Cluster], label: str = "") -> Cluster:
    links = tuple(sorted({link for c in members for link in c.links}))
    ins, outs = _io(links)
    return Cluster(cid, links, ins, outs, label or "+".join(c.id for c in members))


def network_cluster(clusters: Sequence[Cluster]) -> Cluster:
    """End to end: the super-cluster of every cluster."""
    return super_cluster(E2E, clusters, "end to end")


def resolve(net: Network, supers: Sequence[str] = (), e2e: bool = True) -> list[Cluster]:
    """The clusters of net, then the super-clusters asked for (each "C1+C2+…", named S1, S2, …),
    then end to end."""
    cs = clusterize(net.graph)
    by_id = {c.id: c for c in cs}
    out = list(cs)
    for i, spec in enumerate(supers):
        ids = [s.strip() for s in spec.replace(",", "+").split("+") if s.strip()]
        missing = [s for s in ids if s not in by_id]
        if missing:
            raise ValueError(f"super-cluster {spec!r}: no cluster {', '.join(missing)}")
        out.append(super_cluster(f"S{i + 1}", [by_id[s] for s in ids], "+".join(ids)))
    if e2e and cs:
        out.append(network_cluster(cs))
    return out


def cluster_of_link(clusters: Sequence[Cluster]) -> dict[tuple[Point, Point], str]:
    return {link: c.id for c in clusters if c.id.startswith("C") for link in c.links}
