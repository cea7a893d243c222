"""Pictures: the measurement-point graph coloured by cluster, loss over periods, delays."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import networkx as nx
import pandas as pd

from .clusters import Cluster
from .topology import Network, Point


def _positions(net: Network) -> dict[Point, tuple[float, float]]:
    pts = net.points()
    if net.node_graph is None:
        lay = nx.spring_layout(net.graph.to_undirected(), seed=7)
        return {p: (float(xy[0]), float(xy[1])) for p, xy in lay.items()}
    node_pos = nx.spring_layout(net.node_graph, seed=7, iterations=200)
    pos: dict[Point, tuple[float, float]] = {}
    for p in pts:
        x, y = node_pos[p.probe]
        peer = None
        for a, b, d in net.node_graph.edges(p.probe, data=True):
            if d["ifaces"].get(p.probe) == p.ifname:
                peer = b if a == p.probe else a
        if peer is None:
            pos[p] = (x, y)
            continue
        px, py = node_pos[peer]
        dx, dy = px - x, py - y
        norm = math.hypot(dx, dy) or 1.0
        ux, uy = dx / norm, dy / norm
        # in and out MPs of an interface sit side by side toward the peer.
        side = 0.025 if p.direction == "in" else -0.025
        pos[p] = (x + 0.12 * ux - side * uy, y + 0.12 * uy + side * ux)
    return pos


def graph_png(net: Network, clusters: Sequence[Cluster], path: str | Path) -> None:
    """Links (MP graph edges) coloured by their cluster; lab nodes drawn underneath."""
    pos = _positions(net)
    fig, ax = plt.subplots(figsize=(11, 8))
    if net.node_graph is not None:
        npos = nx.spring_layout(net.node_graph, seed=7, iterations=200)
        nx.draw_networkx_edges(net.node_graph, npos, ax=ax, edge_color="#dddddd", width=8)
        routers = [n for n, d in net.node_graph.nodes(data=True) if d.get("kind") == "router"]
        hosts = [n for n in net.node_graph.nodes if n not in routers]
        nx.draw_networkx_nodes(
            net.node_graph,
            npos,
            nodelist=routers,
            ax=ax,
            node_size=1400,
            node_color="#eeeeee",
            edgecolors="#999999",
        )
        nx.draw_networkx_nodes(
            net.node_graph,
            npos,
            nodelist=hosts,
            ax=ax,
            node_size=500,
            node_color="#ffffff",
            edgecolors="#999999",
            node_shape="s",
        )
        nx.draw_networkx_labels(net.node_graph, npos, ax=ax, font_size=9)
    base = [c for c in clusters if c.id.startswith("C")]
    cmap = plt.get_cmap("tab20")
    handles = []
    for i, c in enumerate(base):
        colour = cmap(i % 20)
        nx.draw_networkx_edges(
            net.graph,
            pos,
            edgelist=list(c.links),
            ax=ax,
            edge_color=[colour],
            width=1.6,
            arrows=True,
            arrowsize=9,
            connectionstyle="arc3,rad=0.08",
            label=f"{c.id} {c.label}",
        )
    nx.draw_networkx_nodes(net.graph, pos, ax=ax, node_size=18, node_color="#333333")
    ax.legend(
        handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False
    )
    ax.set_title(f"{net.name or 'network'}: {len(base)} clusters (RFC 9342)")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def loss_png(loss: pd.DataFrame, path: str | Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for cid, g in loss.groupby("cluster"):
        g = g.sort_values("period")
        ax.plot(g["period"], g["loss"], marker=".", label=str(cid))
    ax.set_xlabel("period")
    ax.set_ylabel("lost packets")
    ax.set_title("loss per cluster and period (Σ in − Σ out)")
    ax.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def delay_png(delays: pd.DataFrame, path: str | Path, clusters: Sequence[str]) -> None:
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for cid in clusters:
        d = delays.loc[delays["cluster"] == cid, "delay_ns"] / 1000.0
        if len(d):
            ax.hist(d, bins=50, histtype="step", label=str(cid))
    ax.set_xlabel("delay (µs)")
    ax.set_ylabel("matched samples")
    ax.set_title("delay distribution of matched samples")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
