"""The period records of docs/altmark-records.md: schemas, atomic writing, listing.

A dataset directory (a probe's data_dir, or what `collect` fills) holds
``counters/probe=<id>/period=<n>/part-0.parquet``, ``samples/...`` likewise, and
``jsonl/<id>/<n>.jsonl``. A period is complete when its counters file exists: it is renamed last.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import storage

SCHEMA_VERSION = 1

COUNTERS_SCHEMA = pa.schema(
    [
        ("period_ns", pa.int64()),
        ("color", pa.int32()),
        ("start_tai_ns", pa.int64()),
        ("ifname", pa.string()),
        ("ifindex", pa.int32()),
        ("direction", pa.string()),
        ("carrier", pa.string()),
        ("flowmon_id", pa.int64()),
        ("packets", pa.int64()),
        ("bytes", pa.int64()),
        ("samples", pa.int64()),
        ("hash_bits", pa.int32()),
        ("hash_ref", pa.int64()),
        ("first_tai_ns", pa.int64()),
        ("last_tai_ns", pa.int64()),
        ("mean_tai_ns", pa.int64()),
        ("malformed", pa.int64()),
        ("schema_version", pa.int32()),
    ]
)

SAMPLES_SCHEMA = pa.schema(
    [
        ("ifname", pa.string()),
        ("direction", pa.string()),
        ("flowmon_id", pa.int64()),
        ("color", pa.int32()),
        ("hash", pa.int64()),
        ("tai_ns", pa.int64()),
        ("src_addr", pa.string()),
        ("dst_addr", pa.string()),
        ("proto", pa.int32()),
        ("src_port", pa.int32()),
        ("dst_port", pa.int32()),
        ("length", pa.int32()),
    ]
)

_DEFAULTS: dict[str, Any] = {"flowmon_id": -1, "schema_version": SCHEMA_VERSION}


def _table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts) to a table of the documented schema; extra keys become extra columns
    (either side may add columns), missing documented keys take their default or null."""
    cols: dict[str, list[Any]] = {f.name: [] for f in schema}
    extra: dict[str, list[Any]] = {}
    for i, r in enumerate(rows):
        for name in cols:
            cols[name].append(r.get(name, _DEFAULTS.get(name)))
        for k, v in r.items():
            if k not in cols:
                extra.setdefault(k, [None] * i).append(v)
        for vs in extra.values():
            if len(vs) < i + 1:
                vs.append(None)
    arrays = [pa.array(cols[f.name], type=f.type) for f in schema]
    names = [f.name for f in schema]
    for k, vs in extra.items():
        if k in ("probe", "period"):  # partition columns live in the path only
            continue
        arrays.append(pa.array(vs))
        names.append(k)
    return pa.Table.from_arrays(arrays, names=names)


def counters_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    return _table(rows, COUNTERS_SCHEMA)


def samples_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    return _table(rows, SAMPLES_SCHEMA)


def partition_dir(root: Path, table: str, probe: str, period: int) -> Path:
    return Path(root) / table / f"probe={probe}" / f"period={period}"


def _part(table: str, probe: str, period: int) -> str:
    return f"{table}/probe={probe}/period={period}/part-0.parquet"


Dest = str | Path | storage.Root


def _root(root: Dest) -> storage.Root:
    return root if isinstance(root, storage.Root) else storage.Root(root)


def is_complete(root: Dest, probe: str, period: int) -> bool:
    return _root(root).exists(_part("counters", probe, period))


def write_period(
    root: Dest,
    probe: str,
    period: int,
    counters: pa.Table,
    samples: pa.Table,
    raw_json: Mapping[str, Any] | None = None,
    sync: bool = True,
) -> None:
    """Writes one probe's period: JSON Lines (if given), samples, then counters last, each
    whole (storage.Root.write: a temporary name renamed into place, or one S3 object), so a
    reader never sees a half period: a period is complete when its counters file exists. sync
    False: no fsync of local files (synthetic data, where a crash loses nothing worth keeping)."""
    r = _root(root)
    if raw_json is not None:
        line = (json.dumps(raw_json, separators=(",", ":")) + "\n").encode()
        r.write(f"jsonl/{probe}/{period}.jsonl", lambda f: f.write(line), sync)
    r.write(_part("samples", probe, period), lambda f: pq.write_table(samples, f), sync)
    r.write(_part("counters", probe, period), lambda f: pq.write_table(counters, f), sync)


def write_period_json(root: Dest, obj: Mapping[str, Any], keep_json: bool = True) -> None:
    """Writes a period given as the JSON object of GET /periods/{n}."""
    write_period(
        root,
        str(obj["probe"]),
        int(obj["period"]),
        counters_table(obj.get("counters") or []),
        samples_table(obj.get("samples") or []),
        obj if keep_json else None,
    )


def complete_periods(root: Dest, probe: str) -> list[int]:
    """The periods of probe whose counters file exists, in order (one listing)."""
    out: list[int] = []
    for rel in _root(root).files(f"counters/probe={probe}"):
        d, _, name = rel.partition("/")
        if name == "part-0.parquet" and d.startswith("period="):
            try:
                out.append(int(d.removeprefix("period=")))
            except ValueError:
                continue
    return sorted(out)


def probes(root: Dest) -> list[str]:
    return sorted(
        d.removeprefix("probe=") for d in _root(root).dirs("counters") if d.startswith("probe=")
    )


def remove_stale_temporaries(root: Dest) -> int:
    """Deletes temporary files a killed writer left (``.part-0.parquet.*.tmp``)."""
    return _root(root).remove_stale_temporaries()


def iter_rows(table: pa.Table) -> Iterable[dict[str, Any]]:
    return table.to_pylist()


def read_period_json(root: Path, probe: str, period: int) -> dict[str, Any]:
    """One complete period as the JSON object GET /periods/{n} answers (what a probe serves)."""
    c = pq.read_table(partition_dir(root, "counters", probe, period) / "part-0.parquet")
    sp = partition_dir(root, "samples", probe, period) / "part-0.parquet"
    s = pq.read_table(sp).to_pylist() if sp.exists() else []
    rows = c.to_pylist()
    first = rows[0] if rows else {}
    return {
        "schema_version": SCHEMA_VERSION,
        "probe": probe,
        "period": period,
        "period_ns": first.get("period_ns", 0),
        "color": first.get("color", 0),
        "start_tai_ns": first.get("start_tai_ns", 0),
        "counters": rows,
        "samples": s,
    }
