from __future__ import annotations

import random
from pathlib import Path

import networkx as nx
import pytest

from flowplane_analytics import clusters, topology
from flowplane_analytics.topology import Point

DATA = Path(__file__).parent / "data"
EXAMPLES = Path(__file__).parents[2] / "examples"


def ids(pts):
    return [p.id for p in pts]


def naive(graph: nx.DiGraph) -> set[frozenset]:
    """RFC 9342's two steps taken literally: group links by start node, then merge any two
    groups with an end node in common until none do."""
    groups: dict = {}
    for a, b in graph.edges:
        groups.setdefault(a, set()).add((a, b))
    gs = [set(g) for g in groups.values()]
    merged = True
    while merged:
        merged = False
        for i in range(len(gs)):
            for j in range(i + 1, len(gs)):
                if {b for _, b in gs[i]} & {b for _, b in gs[j]}:
                    gs[i] |= gs.pop(j)
                    merged = True
                    break
            if merged:
                break
    return {frozenset(g) for g in gs}


def test_rfc_style_example():
    net = topology.load(DATA / "rfc_example.yaml")
    cs = clusters.resolve(net)
    got = {c.id: (ids(c.inputs), ids(c.outputs), len(c.links)) for c in cs}
    assert got == {
        "C1": (["1"], ["2", "3"], 2),
        "C2": (["2", "3", "6"], ["4", "5"], 4),
        "C3": (["4"], ["7"], 1),
        "C4": (["5"], ["8", "9"], 2),
        "e2e": (["1", "6"], ["7", "8", "9"], 9),
    }


def test_every_link_in_exactly_one_cluster_and_matches_naive():
    rnd = random.Random(3)
    for _ in range(30):
        g = nx.gnp_random_graph(14, 0.15, seed=rnd.randrange(1 << 30), directed=True)
        dg = nx.DiGraph((Point(str(a), "", ""), Point(str(b), "", "")) for a, b in g.edges)
        cs = clusters.clusterize(dg)
        links = [lk for c in cs for lk in c.links]
        assert sorted(links) == sorted(dg.edges)
        assert {frozenset(c.links) for c in cs} == naive(dg)


def test_lab_topology_clusters():
    net = topology.load(DATA / "lab6.yaml")
    # 6 routers with 3+3+4+3+2+3 = 18 interfaces, two MPs each.
    assert len(net.graph.nodes) == 36
    cs = clusters.resolve(net, ["C1+C2"])
    by = {c.id: c for c in cs}
    # A router with 3 or more interfaces is one cluster (every in reaches every other out);
    # a 2-interface router is two, one per direction; a wire direction is one.
    r3 = [c for c in cs if c.label == "node r3"]
    assert len(r3) == 1 and len(r3[0].inputs) == 4 and len(r3[0].outputs) == 4
    r5 = [c for c in cs if c.label == "node r5"]
    assert len(r5) == 2 and all(len(c.inputs) == 1 and len(c.outputs) == 1 for c in r5)
    wires = [c for c in cs if "→" in c.label and c.id.startswith("C")]
    assert len(wires) == 2 * 6  # six router-router wires, both directions
    # The super-cluster of r1 and its wire to r3 has r3's in point as an output.
    assert by["C2"].label == "r1:eth2:out → r3:eth0:in"
    assert ids(by["S1"].outputs) == ["r1:eth0:out", "r1:eth1:out", "r3:eth0:in"]
    e2e = by["e2e"]
    assert all(p.probe in {"r1", "r2", "r5", "r6"} for p in e2e.points)
    assert len(e2e.inputs) == len(e2e.outputs) == 6


@pytest.mark.parametrize("name", ["demo.yaml", "vnet-ring.yaml"])
def test_example_topologies(name):
    net = topology.load(EXAMPLES / name)
    cs = clusters.clusterize(net.graph)
    assert sorted(lk for c in cs for lk in c.links) == sorted(net.graph.edges)
    assert {frozenset(c.links) for c in cs} == naive(net.graph)


def test_lab_ifname_tag():
    # internal/lab's tag: short names as they are, long ones 3 characters + 2 hex digits.
    assert topology.lab_ifname("demo", "eth0") == "fpdemo-eth0"
    # The value internal/lab's IfName gives (FNV-1a of the name, low byte in hex).
    assert topology.lab_ifname("abcdefgh", "eth0") == "fpabc8d-eth0"


def test_bad_super_cluster():
    net = topology.load(DATA / "rfc_example.yaml")
    with pytest.raises(ValueError, match="no cluster C9"):
        clusters.resolve(net, ["C1+C9"])


def test_graphml_and_json_graph_files(tmp_path):
    yaml_net = topology.load(DATA / "rfc_example.yaml")
    g = nx.DiGraph()
    g.add_edges_from((a.id, b.id) for a, b in yaml_net.graph.edges)
    nx.write_graphml(g, tmp_path / "ex.graphml")
    (tmp_path / "ex.json").write_text(topology.to_json(yaml_net))
    want = [(c.inputs, c.outputs) for c in clusters.resolve(yaml_net)]
    for f in ("ex.graphml", "ex.json"):
        net = topology.load(tmp_path / f)
        assert [(c.inputs, c.outputs) for c in clusters.resolve(net)] == want
