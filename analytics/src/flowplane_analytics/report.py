"""`report`: one HTML page with the tables and the plots (images embedded)."""

from __future__ import annotations

import base64
import html
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from . import draw
from .clusters import Cluster
from .metrics import describe_gap, period_gaps
from .output import readable_order
from .topology import Network

CSS = """body{font-family:sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:right}th{background:#f4f4f4}.alarm{background:#fdd}h2{margin-top:1.5em}"""


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" style="max-width:100%">'


def _table(df: pd.DataFrame, max_rows: int = 500) -> str:
    if not len(df):
        return "<p>(no rows)</p>"
    shown = readable_order(df).head(max_rows)
    rows = []
    for _, r in shown.iterrows():
        cls = ' class="alarm"' if str(r.get("alarm", "") or "") else ""
        cells = "".join(f"<td>{html.escape('-' if pd.isna(v) else str(v))}</td>" for v in r)
        rows.append(f"<tr{cls}>{cells}</tr>")
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    more = f"<p>… {len(df) - max_rows} more rows</p>" if len(df) > max_rows else ""
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>{more}"


def write(
    path: str | Path,
    net: Network,
    clusters: Sequence[Cluster],
    loss: pd.DataFrame,
    missing: pd.DataFrame,
    delay: pd.DataFrame,
    delays: pd.DataFrame,
    title: str = "altmark report",
) -> None:
    with tempfile.TemporaryDirectory() as td:
        t = Path(td)
        draw.graph_png(net, clusters, t / "graph.png")
        draw.loss_png(loss, t / "loss.png")
        shown = ["e2e", *[c.id for c in clusters if c.id != "e2e"][:5]]
        draw.delay_png(delays, t / "delay.png", shown)
        cl = pd.DataFrame(
            [
                {
                    "cluster": c.id,
                    "label": c.label,
                    "inputs": " ".join(p.id for p in c.inputs),
                    "outputs": " ".join(p.id for p in c.outputs),
                    "links": len(c.links),
                }
                for c in clusters
            ]
        )
        alarms = loss[loss["alarm"] != ""]
        gaps = [html.escape(describe_gap(g)) for g in period_gaps(loss["period"])]
        totals = (
            loss[loss["alarm"] == ""]
            .groupby("cluster", as_index=False)[["in_packets", "out_packets", "loss"]]
            .sum()
        )
        body = [
            f"<h1>{html.escape(title)}</h1>",
            f"<p>{loss['period'].nunique()} periods, {len(clusters)} clusters. Alarms: "
            f"{len(alarms)} (cluster, period) rows"
            + (f", {len(gaps)} gap{'s' if len(gaps) > 1 else ''} in the periods" if gaps else "")
            + ".</p>",
            "<h2>Clusters</h2>",
            _img(t / "graph.png"),
            _table(cl),
            "<h2>Alarms</h2>",
            *[f'<p class="alarm">{g}</p>' for g in gaps],
            _table(alarms),
            _table(missing),
            "<h2>Loss over the periods without alarms</h2>",
            _table(totals),
            _img(t / "loss.png"),
            "<h2>Loss per period and cluster</h2>",
            _table(loss),
            "<h2>Delay</h2>",
            _img(t / "delay.png"),
            _table(delay),
        ]
    Path(path).write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>"
    )
