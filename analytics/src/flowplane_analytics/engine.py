"""Backends: DuckDB in-process (default) or Spark (local or a cluster), both through Ibis, and
the dataset read the same way on either."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ibis
import ibis.expr.datatypes as dt
import ibis.expr.operations as ops
import ibis.expr.types as ir
import pandas as pd

ENGINES = ("duckdb", "spark")

_spark_session: Any = None


@dataclass
class Options:
    engine: str = "duckdb"
    master: str | None = None  # Spark master URL; default local[*]
    memory_limit: str | None = None  # DuckDB memory_limit, e.g. "1GB"
    temp_dir: str | None = None  # DuckDB spill directory
    threads: int | None = None
    shuffle_partitions: int | None = None  # Spark; default 8 in local mode
    spark_conf: dict[str, str] | None = None  # more Spark settings


def spark_session(
    master: str | None = None,
    shuffle_partitions: int | None = None,
    extra: dict[str, str] | None = None,
) -> Any:
    """One SparkSession per process (Spark's startup takes seconds)."""
    global _spark_session
    if _spark_session is not None:
        return _spark_session
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName("flowplane-analytics")
    if master is None and os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Started by spark-submit: its --master and --conf hold; set nothing over them.
        local = False
    else:
        master = master or os.environ.get("SPARK_MASTER") or "local[*]"
        b = b.master(master)
        local = master.startswith("local")
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # probe=… and period=… stay strings; the reader casts them (a numeric probe id stays text).
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
        "spark.sql.ansi.enabled": "false",
    }
    if local:
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions or 8)
        conf["spark.driver.memory"] = os.environ.get("FLOWPLANE_SPARK_DRIVER_MEMORY", "2g")
    elif shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    conf.update(extra or {})
    for k, v in conf.items():
        b = b.config(k, v)
    s = b.getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    _spark_session = s
    return s


def connect(opts: Options) -> Any:
    if opts.engine == "duckdb":
        con = ibis.duckdb.connect()
        raw = con.con
        if opts.memory_limit:
            raw.execute(f"SET memory_limit = '{opts.memory_limit}'")
        if opts.temp_dir:
            Path(opts.temp_dir).mkdir(parents=True, exist_ok=True)
            raw.execute(f"SET temp_directory = '{opts.temp_dir}'")
        if opts.threads:
            raw.execute(f"SET threads = {int(opts.threads)}")
        raw.execute("SET preserve_insertion_order = false")
        return con
    if opts.engine == "spark":
        return ibis.pyspark.connect(
            spark_session(opts.master, opts.shuffle_partitions, opts.spark_conf)
        )
    raise ValueError(f"engine {opts.engine!r}: want one of {', '.join(ENGINES)}")


@dataclass
class Dataset:
    """The records, normalised: samples carry small integer ids of their measurement point
    (``mp``, defined in ``mps``) and of their 5-tuple (``flow``, defined in ``flows``), so the
    heavy joins and groupings of the metrics run on integers, never on strings."""

    counters: ir.Table  # one row per (probe, period, ifname, direction), summed over FlowMonIDs
    samples: ir.Table  # (period, mp, hash, tai_ns, flow), samples of complete periods only
    mps: ir.Table  # (mp, probe, ifname, direction)
    flows: ir.Table  # (flow, src_addr, dst_addr, proto, src_port, dst_port)
    layout: str = "raw"  # "raw" (Hive-partitioned, as probes write it) or "compact"


TUPLE = ("src_addr", "dst_addr", "proto", "src_port", "dst_port")
COMPACT = "compact"  # the compacted copy of a dataset: <root>/compact/
_COMPACT_VERSION = 1

_EMPTY_SAMPLES = {
    "probe": "string",
    "period": "int64",
    "ifname": "string",
    "direction": "string",
    "hash": "int64",
    "tai_ns": "int64",
    "src_addr": "string",
    "dst_addr": "string",
    "proto": "int32",
    "src_port": "int32",
    "dst_port": "int32",
}


def _is_local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


def _local(path: str) -> Path:
    return Path(path.removeprefix("file://"))


def _read(con: Any, root: str, table: str) -> ir.Table | None:
    base = root.rstrip("/") + "/" + table
    if _is_local(root) and not any(_local(base).glob("probe=*/period=*/part-0.parquet")):
        return None
    if con.name == "duckdb":
        return con.read_parquet(
            f"{base}/probe=*/period=*/part-0.parquet", hive_partitioning=True, union_by_name=True
        )
    return con.read_parquet(base, mergeSchema="true")


def _counter_files(root: str) -> int:
    return sum(1 for _ in _local(root).glob("counters/probe=*/period=*/part-0.parquet"))


def _numbered(t: ir.Table, name: str, keys: list[str]) -> ir.Table:
    """The distinct rows of t with a dense integer id (0, 1, …) in key order."""
    d = t.select(*keys).distinct()
    return d.mutate(**{name: ibis.row_number().over(order_by=keys).cast("int32")})


def _raw_tables(con: Any, root: str) -> tuple[ir.Table, ir.Table]:
    """(counters summed per interface, samples) as the records hold them."""
    c = _read(con, root, "counters")
    if c is None:
        raise FileNotFoundError(f"{root}: no counters/probe=*/period=*/part-0.parquet")
    c = c.mutate(probe=c.probe.cast("string"), period=c.period.cast("int64"))
    agg = c.group_by(["probe", "period", "ifname", "direction"]).agg(
        packets=c.packets.sum(),
        bytes=c.bytes.sum(),
        hash_bits=c.hash_bits.max(),
        hash_ref=c.hash_ref.min(),
        hash_ref_max=c.hash_ref.max(),
        malformed=c.malformed.sum(),
    )
    s = _read(con, root, "samples")
    if s is None:
        s = ibis.memtable({k: [] for k in _EMPTY_SAMPLES}, schema=_EMPTY_SAMPLES)
    else:
        s = s.mutate(probe=s.probe.cast("string"), period=s.period.cast("int64"))
    return agg, s


def _complete(agg: ir.Table, s: ir.Table) -> ir.Table:
    """A samples file without its counters file is not a complete period: ignore it."""
    return s.semi_join(agg.select("probe", "period").distinct(), ["probe", "period"])


_KEY = ["probe", "ifname", "direction"]


def _normalised(s: ir.Table, mps: ir.Table, flows: ir.Table) -> ir.Table:
    """Samples as (period, mp, hash, tai_ns, flow). A left join on the 5-tuple: a sample with
    a NULL field gets a NULL flow (it then matches no other sample's 5-tuple, as a NULL field
    compares to nothing)."""
    sj = s.left_join(flows, list(TUPLE)).join(mps, _KEY)
    return sj.select(sj.period, sj.mp, sj.hash.cast("int64"), sj.tai_ns.cast("int64"), sj.flow)


def load_raw(con: Any, root: str | Path) -> Dataset:
    """The Hive-partitioned records under root, normalised (lazily: nothing runs yet)."""
    agg, s = _raw_tables(con, str(root))
    s = _complete(agg, s)
    mps = _numbered(agg.select(*_KEY).union(s.select(*_KEY)), "mp", _KEY)
    flows = _numbered(s, "flow", list(TUPLE))
    return Dataset(
        counters=agg, samples=_normalised(s, mps, flows), mps=mps, flows=flows, layout="raw"
    )


def _compact_meta(root: str) -> dict[str, Any] | None:
    f = _local(root) / COMPACT / "meta.json"
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def load_compact(con: Any, root: str | Path) -> Dataset:
    base = str(root).rstrip("/") + "/" + COMPACT

    def rd(name: str) -> ir.Table:
        if con.name == "duckdb":
            pattern = "*/*.parquet" if name == "samples" else "*.parquet"
            return con.read_parquet(f"{base}/{name}/{pattern}", hive_partitioning=False)
        return con.read_parquet(f"{base}/{name}")

    s = rd("samples")
    return Dataset(
        counters=rd("counters"),
        samples=s.select("period", "mp", "hash", "tai_ns", "flow"),
        mps=rd("mps"),
        flows=rd("flows"),
        layout="compact",
    )


def load(con: Any, root: str | Path, cache: bool = True, layout: str = "auto") -> Dataset:
    """The dataset under root (a local directory, or hdfs:// / s3a:// with Spark).

    layout "auto" reads root/compact/ when `compact` wrote it and no period was added since
    (the number of counters files is unchanged), else the Hive-partitioned records."""
    root = str(root)
    if layout == "auto":
        layout = "raw"
        if _is_local(root):
            meta = _compact_meta(root)
            if meta is not None:
                if meta.get("counter_files") == _counter_files(root):
                    layout = "compact"
                else:
                    print(
                        f"flowplane-analytics: {root}/{COMPACT} is stale (periods were added "
                        "since `compact`): reading the partitioned records",
                        file=sys.stderr,
                    )
    ds = load_compact(con, root) if layout == "compact" else load_raw(con, root)
    if con.name == "pyspark" and cache:
        # Each metric reads the counters and samples several times (both sides of the
        # matching, the hash lengths): Spark would rescan the Parquet files for each.
        ds.counters, ds.samples = ds.counters.cache(), ds.samples.cache()
    return ds


def compact(
    con: Any, root: str | Path, periods_per_part: int = 100, row_group_size: int = 1 << 20
) -> dict[str, Any]:
    """Writes root/compact/: the normalised tables of the partitioned records, in a few large
    files: counters summed per interface, the dictionaries of points (``mps``) and 5-tuples
    (``flows``), and the samples as integer columns, one part per `periods_per_part`
    consecutive periods (``samples/chunk=N/``), ordered by period. Part by part, so memory
    stays bounded whatever the size. Rebuilt from scratch each time; until it is re-run after
    new periods arrive, `load` ignores it."""
    root = str(root)
    if not _is_local(root):
        raise ValueError(f"{root}: compact writes local datasets only")
    n_files = _counter_files(root)
    agg, s_all = _raw_tables(con, root)
    # The complete (probe, period)s, once: each part then reads only its own files.
    done = ibis.memtable(
        con.execute(agg.select("probe", "period").distinct()),
        schema={"probe": "string", "period": "int64"},
    )
    s = s_all.semi_join(done, ["probe", "period"])
    final = _local(root) / COMPACT
    tmp = _local(root) / f".{COMPACT}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    def write(t: ir.Table, rel: str) -> None:
        d = tmp / rel
        if con.name == "duckdb":
            d.mkdir(parents=True)
            con.to_parquet(t, d / "part-0.parquet", row_group_size=row_group_size)
        else:
            con.to_parquet(t, str(d))

    # The dictionaries, from one pass over the samples (a few thousand distinct rows).
    sch = s.select(*_KEY, *TUPLE).schema()
    seen = con.execute(s.select(*_KEY, *TUPLE).distinct())
    seen_c = con.execute(agg.select(*_KEY).distinct())
    keys = ibis.memtable(
        pd.concat([seen_c, seen[_KEY]], ignore_index=True).drop_duplicates(),
        schema={k: sch[k] for k in _KEY},
    )
    tuples = ibis.memtable(seen[list(TUPLE)].drop_duplicates(), schema={k: sch[k] for k in TUPLE})
    write(_numbered(keys, "mp", _KEY), "mps")
    write(_numbered(tuples, "flow", list(TUPLE)), "flows")
    c = agg
    # DuckDB sums BIGINT into HUGEINT, which Parquet stores as DOUBLE: keep the sums int64
    # (ops.Cast directly: Value.cast skips a cast to the type Ibis already believes it has).
    c = c.mutate(
        **{k: ops.Cast(c[k], to=dt.int64).to_expr() for k in ("packets", "bytes", "malformed")}
    )
    write(c.order_by(["period", *_KEY]), "counters")
    mps, flows = _read_dir(con, tmp / "mps"), _read_dir(con, tmp / "flows")
    periods = sorted({int(p) for p in con.execute(done)["period"]})
    for i in range(0, len(periods), periods_per_part):
        first, last = periods[i], periods[min(i + periods_per_part, len(periods)) - 1]
        d = done.filter((done.period >= first) & (done.period <= last))
        part = s_all.filter((s_all.period >= first) & (s_all.period <= last))
        part = part.semi_join(d, ["probe", "period"])
        write(_normalised(part, mps, flows).order_by(["period", "mp"]), f"samples/chunk={i:09d}")
    if not periods:
        write(_normalised(s, mps, flows), "samples/chunk=000000000")
    meta = {"version": _COMPACT_VERSION, "counter_files": n_files}
    (tmp / "meta.json").write_text(json.dumps(meta))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return meta


def _read_dir(con: Any, d: Path) -> ir.Table:
    if con.name == "duckdb":
        return con.read_parquet(f"{d}/*.parquet", hive_partitioning=False)
    return con.read_parquet(str(d))


def restrict(ds: Dataset, first: int, last: int) -> Dataset:
    """The dataset's periods first..last (inclusive)."""

    def f(t: ir.Table) -> ir.Table:
        return t.filter((t.period >= first) & (t.period <= last))

    return Dataset(
        counters=f(ds.counters),
        samples=f(ds.samples),
        mps=ds.mps,
        flows=ds.flows,
        layout=ds.layout,
    )


AUTO_BATCH = 100


def execute_by_periods(
    con: Any, ds: Dataset, build: Callable[[Dataset], ir.Table], batch: int | None
) -> pd.DataFrame:
    """build(ds) executed, in one query (batch 0) or in queries of `batch` consecutive periods
    each, concatenated in period order. Every metric is per period, so the answer is the same;
    smaller queries keep a large dataset's joins and sorts in memory. batch None: DuckDB on
    the compact layout runs AUTO_BATCH periods per query (half the time of one query at 10⁸
    samples, where one query spills), anything else one query."""
    if batch is None:
        batch = AUTO_BATCH if con.name == "duckdb" and ds.layout == "compact" else 0
    if not batch:
        return con.execute(build(ds))
    ps = con.execute(ds.counters.select("period").distinct().order_by("period"))["period"]
    ps = [int(p) for p in ps]
    if not ps:
        return con.execute(build(ds))
    parts = []
    for i in range(0, len(ps), batch):
        chunk = ps[i : i + batch]
        parts.append(con.execute(build(restrict(ds, chunk[0], chunk[-1]))))
    df = pd.concat(parts, ignore_index=True)
    return df.astype(parts[0].dtypes.to_dict()) if len(parts[0]) else df
