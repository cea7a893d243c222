"""Backends: DuckDB in-process (default) or Spark (local or a cluster), both through Ibis, and
the dataset read the same way on either."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ibis
import ibis.expr.types as ir

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
    counters: ir.Table  # one row per (probe, period, ifname, direction), summed over FlowMonIDs
    samples: ir.Table  # samples of complete periods only
    raw_counters: ir.Table


def _is_local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


def _read(con: Any, root: str, table: str) -> ir.Table | None:
    base = root.rstrip("/") + "/" + table
    if _is_local(root):
        local = Path(base.removeprefix("file://"))
        if not any(local.glob("probe=*/period=*/part-0.parquet")):
            return None
    if con.name == "duckdb":
        return con.read_parquet(
            f"{base}/probe=*/period=*/part-0.parquet", hive_partitioning=True, union_by_name=True
        )
    return con.read_parquet(base, mergeSchema="true")


def load(con: Any, root: str | Path, cache: bool = True) -> Dataset:
    """The dataset under root (a local directory, or hdfs:// / s3a:// with Spark)."""
    root = str(root)
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
        s = ibis.memtable(
            {
                "probe": [],
                "period": [],
                "ifname": [],
                "direction": [],
                "hash": [],
                "tai_ns": [],
                "src_addr": [],
                "dst_addr": [],
                "proto": [],
                "src_port": [],
                "dst_port": [],
            },
            schema={
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
            },
        )
    else:
        s = s.mutate(probe=s.probe.cast("string"), period=s.period.cast("int64"))
    # A samples file without its counters file is not a complete period: ignore it.
    complete = agg.select("probe", "period").distinct()
    s = s.semi_join(complete, ["probe", "period"])
    if con.name == "pyspark" and cache:
        # Each metric reads the counters and samples several times (both sides of the
        # matching, the hash lengths): Spark would rescan the Parquet files for each.
        agg, s = agg.cache(), s.cache()
    return Dataset(counters=agg, samples=s, raw_counters=c)
