"""Backends: DuckDB in-process (default) or Spark (local or a cluster), both through Ibis, and
the dataset read the same way on either."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ibis
import ibis.expr.datatypes as dt
import ibis.expr.operations as ops
import ibis.expr.types as ir
import pandas as pd

from . import filecheck, sparkcds, storage
from .filecheck import BadFile, BadFilesError

ENGINES = ("duckdb", "spark")

_spark_session: Any = None
_auto_partitions = False  # the session's shuffle partitions are ours to size (size_shuffles)
SHUFFLE_BYTES = 16 << 20  # Parquet bytes read per shuffle partition
# Below this much local Parquet, Spark's JVMs compile with C1 only (-XX:TieredStopAtLevel=1): a
# short run ends before C2's faster code repays the CPU its compiler takes from the tasks (on
# the bench's 2 cores C1 wins at 10⁶ samples, 9 MiB compacted, and loses at 10⁷, 86 MiB; the
# limit lies between the two, below where their timings cross).
C1_MAX_BYTES = 16 << 20


@dataclass
class Options:
    engine: str = "duckdb"
    master: str | None = None  # Spark master URL; default local[*]
    memory_limit: str | None = None  # DuckDB memory_limit, e.g. "1GB"
    temp_dir: str | None = None  # DuckDB spill directory
    threads: int | None = None
    shuffle_partitions: int | None = None  # Spark; default: sized to the data
    spark_conf: dict[str, str] | None = None  # more Spark settings


DEBUG_ENV = "FLOWPLANE_ANALYTICS_DEBUG"  # set: Python tracebacks and Spark's own logs


class EngineError(Exception):
    """The engine cannot run with these settings (no Java, a bad master URL or DuckDB setting):
    bad input, said in one line."""


def debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


_MASTER_RE = re.compile(
    r"local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?|local-cluster\[[1-9]\d*,[1-9]\d*,[1-9]\d*\]"
    r"|spark://[^/\s,:]+:\d+(,[^/\s,:]+:\d+)*|yarn|k8s://\S+"
)


def check_master(master: str) -> None:
    """ValueError unless master is a Spark master URL."""
    if not _MASTER_RE.fullmatch(master):
        raise ValueError(
            f"--master {master!r}: not a Spark master URL; want local[*], local[N], "
            "spark://HOST:PORT, yarn or k8s://https://HOST:PORT"
        )


_JAVA_HINT = (
    "pyspark 4 needs Java 17 or newer: install it (Debian/Ubuntu: apt-get install "
    "openjdk-17-jre-headless, which `make setup` does) and set JAVA_HOME or put java on PATH, "
    "or use --engine duckdb"
)


def check_java() -> str:
    """The java the Spark launcher will start (JAVA_HOME's, else PATH's), checked to be there
    and at least Java 17; EngineError if not."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH (JAVA_HOME unset)"
        raise EngineError(f"--engine spark: {where}; {_JAVA_HINT}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineError(f"--engine spark: {java} -version failed ({e}); {_JAVA_HINT}") from e
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m:
        major = int(m[1]) if m[1] != "1" else int(m[2] or 0)  # "1.8.0" is Java 8
        if major < 17:
            raise EngineError(f"--engine spark: {java} is Java {major}; {_JAVA_HINT}")
    return java


def short_error(e: BaseException) -> str:
    """One line of an exception: a JVM exception's own message rather than py4j's wrapper and
    the Java stack."""
    java = getattr(e, "java_exception", None)
    text = str(java) if java is not None else str(e)
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    line = lines[0] if lines else type(e).__name__
    return line if len(line) <= 300 else line[:297] + "…"


_LOG4J = Path(__file__).with_name("spark-log4j2.properties")


_AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def jvm_environment(env: dict[str, str]) -> dict[str, str]:
    """env as Spark's JVMs need it on this machine. Where its own host name does not resolve (a
    minimal container or chroot whose /etc/hosts lacks it), the JVM's InetAddress.getLocalHost
    fails, and Spark with it: they get the loopback (SPARK_LOCAL_IP, SPARK_LOCAL_HOSTNAME, unless
    set) and no AWS keys, which make Spark look the host name up to say where keys came from;
    the keys reach S3A through the session's configuration (storage) instead."""
    try:
        socket.getaddrinfo(socket.gethostname(), None)  # IPv4 or IPv6, as the JVM looks it up
        return env
    except OSError:
        out = {k: v for k, v in env.items() if k not in _AWS_KEYS}
        out.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        out.setdefault("SPARK_LOCAL_HOSTNAME", "localhost")
        return out


@contextlib.contextmanager
def _environment(env: dict[str, str] | None) -> Iterator[None]:
    """os.environ is env inside (None: unchanged); after, what this changed is put back, and
    what others set meanwhile (PySpark, as its JVM starts) is kept."""
    if env is None:
        yield
        return
    changed = {
        k: os.environ.get(k) for k in set(os.environ) | set(env) if os.environ.get(k) != env.get(k)
    }
    for k in changed:
        if k in env:
            os.environ[k] = env[k]
        else:
            del os.environ[k]
    try:
        yield
    finally:
        for k, v in changed.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def spark_session(
    master: str | None = None,
    shuffle_partitions: int | None = None,
    extra: dict[str, str] | None = None,
    small_input: bool = False,
) -> Any:
    """One SparkSession per process (Spark's startup takes seconds). Spark's own logging is
    off (its errors reach the caller as exceptions, said in one line) unless
    FLOWPLANE_ANALYTICS_DEBUG is set. small_input: the session reads less than C1_MAX_BYTES,
    so its JVMs compile with C1 only."""
    global _spark_session
    if _spark_session is not None:
        return _spark_session
    if importlib.util.find_spec("pyspark") is None:
        raise EngineError(
            "--engine spark needs pyspark: pip install 'flowplane-analytics[spark]' "
            "(and Java 17 or newer), or use --engine duckdb"
        )
    global _auto_partitions
    submitted = master is None and bool(os.environ.get("PYSPARK_GATEWAY_PORT"))
    if not submitted:
        if master is None and os.environ.get("SPARK_MASTER"):
            try:
                check_master(os.environ["SPARK_MASTER"])
            except ValueError as e:
                raise EngineError(f"$SPARK_MASTER: {e}") from e
        java = check_java()
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName("flowplane-analytics")
    if submitted:
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
        # Ibis's in-memory tables (cluster membership, aliases) go to the JVM and results come
        # back as Arrow batches: no Python worker process on any executor, no row pickling.
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
    }
    cds = None
    if not submitted:
        # The throughput collector: G1's concurrent threads take a core from the tasks on a
        # small machine, and a batch job has no pause to keep short.
        gc = "-XX:+UseParallelGC"
        # The driver JVM starts with logging off: no WARN lines, no Java stack traces.
        log = "" if debug() else f"-Dlog4j2.configurationFile=file:{_LOG4J}"
        jit = "-XX:TieredStopAtLevel=1" if small_input else ""
        cds = sparkcds.plan(java, master)
        conf["spark.executor.extraJavaOptions"] = " ".join(filter(None, [gc, jit, cds.executor]))
        conf["spark.driver.extraJavaOptions"] = " ".join(filter(None, [gc, jit, log, cds.driver]))
    if local:
        conf["spark.driver.memory"] = os.environ.get("FLOWPLANE_SPARK_DRIVER_MEMORY", "2g")
    if shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    jars = storage.spark_jars()
    if jars and not submitted:  # S3A (hadoop-aws and the AWS SDK), for s3:// datasets
        conf["spark.jars"] = ",".join(jars)
    conf.update(extra or {})
    for k, v in conf.items():
        b = b.config(k, v)
    here = not submitted and (
        local or master.startswith(("spark://127.0.0.1:", "spark://localhost:"))
    )
    try:
        with _environment(jvm_environment(dict(os.environ)) if here else None):
            s = b.getOrCreate()  # the driver's JVM takes this process's environment as it starts
    except Exception as e:
        where = master or "from spark-submit"
        raise EngineError(
            f"--engine spark: could not start a Spark session (master {where}): "
            f"{short_error(e)}; check --master, and that Java 17+ runs (JAVA_HOME)"
        ) from e
    s.sparkContext.setLogLevel("ERROR" if debug() else "OFF")
    if cds is not None:
        sparkcds.finish_at_exit(cds, getattr(s.sparkContext._gateway, "proc", None))
    _auto_partitions = "spark.sql.shuffle.partitions" not in conf and not (
        submitted and s.conf.get("spark.sql.shuffle.partitions") != "200"
    )
    _spark_session = s
    return s


def connect(opts: Options, src: Source | None = None) -> Any:
    """A connection to the engine; EngineError for settings it refuses. src: the dataset it
    will read, when known first (Spark sizes its JVMs' compilation to it). Spark's session is
    one per process: only the src given when it starts counts."""
    if opts.engine == "duckdb":
        import duckdb

        con = ibis.duckdb.connect()
        raw = con.con
        if opts.memory_limit:
            try:
                if "'" in opts.memory_limit:
                    raise duckdb.InvalidInputException(opts.memory_limit)
                raw.execute(f"SET memory_limit = '{opts.memory_limit}'")
            except duckdb.Error as e:
                raise EngineError(
                    f"--memory-limit {opts.memory_limit!r}: not a memory size; write e.g. 2GB, "
                    "512MB or 50%"
                ) from e
        if opts.temp_dir:
            try:
                Path(opts.temp_dir).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise EngineError(
                    f"--temp-dir {opts.temp_dir}: cannot create it: {e.strerror or e}"
                ) from e
            raw.execute("SET temp_directory = ?", [opts.temp_dir])
        if opts.threads:
            raw.execute(f"SET threads = {int(opts.threads)}")
        raw.execute("SET preserve_insertion_order = false")
        return con
    if opts.engine == "spark":
        # The session first: it says what is missing (pyspark, Java) before ibis's backend,
        # which needs pyspark, is imported.
        small = src is not None and src.size is not None and src.size < C1_MAX_BYTES
        session = spark_session(opts.master, opts.shuffle_partitions, opts.spark_conf, small)
        return _broadcast_memtables(ibis.pyspark.connect(session))
    raise ValueError(f"engine {opts.engine!r}: want one of {', '.join(ENGINES)}")


def _broadcast_memtables(con: Any) -> Any:
    """Ibis's in-memory tables (cluster membership, aliases: a few hundred rows) registered
    through Arrow and with a broadcast hint, so that every join of the samples with one is a
    broadcast join whatever Spark estimates (without Arrow such a table was an RDD of pickled
    rows that Spark could not size: a shuffle of the samples per join, and a Python worker per
    executor)."""
    from decimal import Decimal

    from ibis.backends.pyspark.datatypes import PySparkSchema
    from pyspark.sql.functions import broadcast

    def hinted(op: ops.InMemoryTable) -> None:
        # as Ibis's own registration, with the hint
        data = op.data.to_frame()
        if dec := [n for n, t in op.schema.items() if t.is_decimal()]:
            data = data.assign(**{c: data[c].map(Decimal) for c in dec})
        schema = PySparkSchema.from_ibis(op.schema)
        df = con._session.createDataFrame(data, schema=schema, verifySchema=False)
        broadcast(df).createOrReplaceTempView(op.name)

    con._register_in_memory_table = hinted
    return con


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


def _read(con: Any, root: str, table: str, files: list[str] | None = None) -> ir.Table | None:
    """The table's Hive-partitioned files: all of them, or only `files` (some were skipped)."""
    base = storage.for_engine(root, "duckdb" if con.name == "duckdb" else "spark")
    base = base.rstrip("/") + "/" + table
    if files is not None:
        if not files:
            return None
        if con.name == "duckdb":
            return con.read_parquet(files, hive_partitioning=True, union_by_name=True)
        df = (
            con._session.read.option("basePath", base).option("mergeSchema", "true").parquet(*files)
        )
        name = ibis.util.gen_name("read_parquet")
        df.createOrReplaceTempView(name)
        return con.table(name)
    if _is_local(root) and not any(_local(base).glob(filecheck.RAW_GLOB)):
        return None
    if con.name == "duckdb":
        return con.read_parquet(
            f"{base}/{filecheck.RAW_GLOB}", hive_partitioning=True, union_by_name=True
        )
    return con.read_parquet(base, mergeSchema="true")


def _records_state(root: str) -> tuple[int, str]:
    """(the number of counters files, a digest of every record file under root: its path, size
    and modification time). A compacted copy built from other records (a period added,
    rewritten or removed) is stale, whatever the number of files."""
    d = _local(root)
    h = hashlib.sha256()
    n = {}
    for t in filecheck.RAW_TABLES:
        files = sorted((d / t).glob(filecheck.RAW_GLOB))
        n[t] = len(files)
        for p in files:
            st = p.stat()
            h.update(f"{p.relative_to(d)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return n["counters"], h.hexdigest()


def _numbered(t: ir.Table, name: str, keys: list[str]) -> ir.Table:
    """The distinct rows of t with a dense integer id (0, 1, …) in key order."""
    d = t.select(*keys).distinct()
    return d.mutate(**{name: ibis.row_number().over(order_by=keys).cast("int32")})


def _raw_tables(con: Any, src: Source) -> tuple[ir.Table, ir.Table]:
    """(counters summed per interface, samples) as the records hold them."""
    root = src.root
    c = _read(con, root, "counters", src.counters)
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
    s = _read(con, root, "samples", src.samples)
    if s is None:
        s = ibis.memtable({k: [] for k in _EMPTY_SAMPLES}, schema=_EMPTY_SAMPLES)
    else:
        s = s.mutate(probe=s.probe.cast("string"), period=s.period.cast("int64"))
    return agg, s


def _duration(ns: int) -> str:
    """ns as the probes' configuration writes a period: 500ms, 1s, 2m."""
    units = (("h", 3_600_000_000_000), ("m", 60_000_000_000), ("s", 10**9), ("ms", 10**6))
    for unit, size in units:
        if ns and ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"


def check_one_period_length(con: Any, src: Source) -> None:
    """EngineError when the raw records hold more than one period length (records of two
    measurements in one directory): their period numbers are ⌊TAI / L⌋ for different L, so no
    metric can put them side by side."""
    c = _read(con, src.root, "counters", src.counters)
    if c is None:
        return
    c = c.mutate(probe=c.probe.cast("string"))
    df = con.execute(c.select("period_ns", "probe").distinct())
    if df["period_ns"].nunique() < 2:
        return
    lengths = []
    for ns, g in sorted(df.groupby("period_ns")):
        probes = sorted(map(str, g["probe"]))
        what = f"probe {probes[0]}" if len(probes) == 1 else f"probes {', '.join(probes[:5])}"
        lengths.append(f"{_duration(int(ns))} ({what}{' …' if len(probes) > 5 else ''})")
    raise EngineError(
        f"{src.root}: the records hold {len(lengths)} period lengths: {'; '.join(lengths)}; "
        "a metric needs one: keep each measurement's records in a directory of its own"
    )


def _complete(agg: ir.Table, s: ir.Table) -> ir.Table:
    """A samples file without its counters file is not a complete period: ignore it."""
    return s.semi_join(agg.select("probe", "period").distinct(), ["probe", "period"])


MP_KEY = [  # a measurement point: its probe, interface and direction
    "probe",
    "ifname",
    "direction",
]


def _normalised(s: ir.Table, mps: ir.Table, flows: ir.Table) -> ir.Table:
    """Samples as (period, mp, hash, tai_ns, flow). A left join on the 5-tuple: a sample with
    a NULL field gets a NULL flow (it then matches no other sample's 5-tuple, as a NULL field
    compares to nothing)."""
    sj = s.left_join(flows, list(TUPLE)).join(mps, MP_KEY)
    return sj.select(sj.period, sj.mp, sj.hash.cast("int64"), sj.tai_ns.cast("int64"), sj.flow)


def load_raw(con: Any, root: str | Path | Source) -> Dataset:
    """The Hive-partitioned records under root, normalised (lazily: nothing runs yet)."""
    src = root if isinstance(root, Source) else Source(str(root), "raw")
    agg, s = _raw_tables(con, src)
    s = _complete(agg, s)
    mps = _numbered(agg.select(*MP_KEY).union(s.select(*MP_KEY)), "mp", MP_KEY)
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


SKIP_HINT = "remove it or pass --skip-bad-files"
SKIP_HINT_MANY = "remove them or pass --skip-bad-files"


@dataclass
class Source:
    """Where a dataset is read from: decided, and its local files checked, before an engine
    starts (`locate`)."""

    root: str
    layout: str  # "raw" or "compact"
    # raw layout with files skipped: the files to read (None: every file, by their pattern)
    counters: list[str] | None = None
    samples: list[str] | None = None
    skipped: list[BadFile] = field(default_factory=list)

    @property
    def local(self) -> bool:
        return _is_local(self.root)

    def files(self) -> list[Path]:
        """The local Parquet files this source reads."""
        if not self.local:
            return []
        root = _local(self.root)
        if self.layout == "compact":
            return [p for ps in filecheck.compact_files(root / COMPACT).values() for p in ps]
        if self.counters is not None:
            return [Path(p) for p in [*self.counters, *(self.samples or [])]]
        rf = filecheck.raw_files(root)
        return [*rf.paths("counters"), *rf.paths("samples")]

    @functools.cached_property
    def size(self) -> int | None:
        """Bytes of the local Parquet files this source reads; None for a remote dataset."""
        if not self.local:
            return None
        return sum(f.stat().st_size for f in self.files() if f.exists())

    def hint(self) -> str:
        if self.layout == "compact":
            return f"rerun `flowplane-analytics compact --data {self.root}`, or pass --layout raw"
        return SKIP_HINT


def _note(msg: str) -> None:
    print(f"flowplane-analytics: {msg}", file=sys.stderr)


def locate(
    root: str | Path,
    layout: str = "auto",
    skip_bad: bool = False,
    known_bad: Sequence[BadFile] = (),
) -> Source:
    """The dataset under root, checked: FileNotFoundError when there is none, BadFilesError
    naming the files an engine could not read. skip_bad: leave those out instead, each
    probe's period with a bad counters or samples file as if it had not been recorded (so the
    metrics flag its points as missing), and say so on stderr.

    layout "auto" reads root/compact/ when `compact` wrote it from the records there now (no
    record file added, removed or rewritten since), else the Hive-partitioned records.
    known_bad: files found bad otherwise (filecheck.deep_check), treated as those found here."""
    root = str(root)
    known = {b.path: b.problem for b in known_bad}
    if not _is_local(root):
        return Source(root, "compact" if layout == "compact" else "raw")
    d = _local(root)
    if not d.exists():
        raise FileNotFoundError(f"{root}: no such directory")
    if not d.is_dir():
        raise NotADirectoryError(f"{root}: not a directory (want a dataset: counters/, samples/)")
    chosen = layout
    if layout == "auto":
        chosen = "raw"
        meta = _compact_meta(root)
        if meta is not None:
            if meta.get("records") == _records_state(root)[1]:
                chosen = "compact"
            else:
                why = "the records changed since" if "records" in meta else "written by an older"
                _note(
                    f"{root}/{COMPACT} is stale ({why} `compact`): "
                    f"reading the partitioned records; rerun `flowplane-analytics compact "
                    f"--data {root}`"
                )
    if chosen == "compact":
        src = Source(root, "compact")
        if not (d / COMPACT).is_dir():
            raise FileNotFoundError(
                f"{root}/{COMPACT}: no compacted copy; run `flowplane-analytics compact "
                f"--data {root}` first, or pass --layout raw"
            )
        bad = filecheck.check_compact(d / COMPACT)
        bad += [
            BadFile(p, problem) for p, problem in known.items() if p.startswith(f"{d / COMPACT}/")
        ]
        if bad and not (skip_bad and layout == "auto"):
            raise BadFilesError(bad, src.hint())
        if not bad:
            skipped = (_compact_meta(root) or {}).get("skipped") or []
            if skipped and not skip_bad:
                n = len(skipped)
                what = f"{n} bad record file" + ("s" if n > 1 else "")
                listed = skipped[0] + (", …" if n > 1 else "")
                raise BadFilesError(
                    [BadFile(f"{root}/{COMPACT}", f"built leaving out {what} ({listed})")],
                    "pass --skip-bad-files to read it so, or fix them and rerun `compact`",
                )
            for f in skipped:
                _note(f"skipped {root}/{f} (left out when `compact` ran)")
            return src
        for b in bad:
            _note(f"not using the compacted copy ({b}): reading the partitioned records")
    rf = filecheck.raw_files(d)
    if not rf.files["counters"]:
        raise FileNotFoundError(f"{root}: no counters/{filecheck.RAW_GLOB}")
    bad = filecheck.check_raw(rf)
    seen = {b.path for b in bad}
    bad += [
        BadFile(str(p), known[str(p)], probe, period)
        for t in filecheck.RAW_TABLES
        for p, probe, period in rf.files[t]
        if str(p) in known and str(p) not in seen
    ]
    if not bad:
        return Source(root, "raw")
    if not skip_bad:
        raise BadFilesError(bad, SKIP_HINT if len(bad) == 1 else SKIP_HINT_MANY)
    gone = {(b.probe, b.period) for b in bad}
    keep = {
        t: [str(p) for p, probe, period in rf.files[t] if (probe, period) not in gone]
        for t in filecheck.RAW_TABLES
    }
    for b in bad:
        _note(f"skipped {b}; probe {b.probe}'s period {b.period} is read as not recorded")
    if not keep["counters"]:
        raise FileNotFoundError(
            f"{root}: no readable counters file (all {len(rf.files['counters'])} skipped)"
        )
    return Source(root, "raw", keep["counters"], keep["samples"], bad)


def load(
    con: Any,
    root: str | Path | Source,
    cache: bool = True,
    layout: str = "auto",
    skip_bad: bool = False,
) -> Dataset:
    """The dataset under root (a local directory or s3://BUCKET/PREFIX), located and
    checked by `locate` unless root is a Source already; raw records of two period lengths are
    an EngineError (check_one_period_length)."""
    src = root if isinstance(root, Source) else locate(root, layout, skip_bad)
    if storage.is_s3(src.root):
        if con.name == "duckdb":
            storage.duckdb_register(con.con)
        else:
            storage.spark_register(con._session)
    if src.layout == "raw":
        check_one_period_length(con, src)
    if con.name == "pyspark":
        size_shuffles(con._session, src)
    ds = load_compact(con, src.root) if src.layout == "compact" else load_raw(con, src)
    if con.name == "pyspark" and cache:
        # Each metric reads the counters and samples several times (both sides of the
        # matching, the hash lengths): Spark would rescan the Parquet files for each.
        ds.counters, ds.samples = ds.counters.cache(), ds.samples.cache()
    return ds


def size_shuffles(session: Any, src: Source) -> None:
    """Spark's shuffle partitions sized to a local dataset (one per SHUFFLE_BYTES of Parquet
    read, at least the default parallelism, at most 200) unless they were set (--conf,
    Options.shuffle_partitions): Spark's default of 200 is as many tasks per shuffle for a few
    megabytes. Adaptive execution then coalesces small ones further. A remote dataset keeps
    the default."""
    if not _auto_partitions or src.size is None:
        return
    n = max(session.sparkContext.defaultParallelism, -(-src.size // SHUFFLE_BYTES))
    session.conf.set("spark.sql.shuffle.partitions", str(min(n, 200)))


def compact(
    con: Any,
    root: str | Path | Source,
    periods_per_part: int = 100,
    row_group_size: int = 1 << 20,
    skip_bad: bool = False,
) -> dict[str, Any]:
    """Writes root/compact/: the normalised tables of the partitioned records, in a few large
    files: counters summed per interface, the dictionaries of points (``mps``) and 5-tuples
    (``flows``), and the samples as integer columns, one part per `periods_per_part`
    consecutive periods (``samples/chunk=N/``), ordered by period. Part by part, so memory
    stays bounded whatever the size. Rebuilt from scratch each time; until it is re-run after
    the records change, `load` ignores it. Bad record files: as `locate` (skip_bad: left out,
    and listed in meta.json's "skipped", so that reading the copy says so)."""
    if isinstance(root, Source):
        src = root
    else:
        if not _is_local(str(root)):
            raise ValueError(f"{root}: compact writes local datasets only")
        src = locate(root, "raw", skip_bad)
    root = src.root
    if con.name == "pyspark":
        size_shuffles(con._session, src)
    n_files, state = _records_state(root)
    check_one_period_length(con, src)
    agg, s_all = _raw_tables(con, src)
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
    try:
        meta = _compact_into(con, agg, s_all, s, done, tmp, periods_per_part, row_group_size)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed run leaves nothing behind
        raise
    meta["counter_files"], meta["records"] = n_files, state
    if src.skipped:
        meta["skipped"] = [str(Path(b.path).relative_to(_local(root))) for b in src.skipped]
    (tmp / "meta.json").write_text(json.dumps(meta))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return meta


def _compact_into(
    con: Any,
    agg: ir.Table,
    s_all: ir.Table,
    s: ir.Table,
    done: ir.Table,
    tmp: Path,
    periods_per_part: int,
    row_group_size: int,
) -> dict[str, Any]:
    """compact's work: the tables written under tmp."""

    def write(t: ir.Table, rel: str) -> None:
        d = tmp / rel
        if con.name == "duckdb":
            d.mkdir(parents=True)
            con.to_parquet(t, d / "part-0.parquet", row_group_size=row_group_size)
        else:
            con.to_parquet(t, str(d))

    # The dictionaries, from one pass over the samples (a few thousand distinct rows).
    sch = s.select(*MP_KEY, *TUPLE).schema()
    seen = con.execute(s.select(*MP_KEY, *TUPLE).distinct())
    seen_c = con.execute(agg.select(*MP_KEY).distinct())
    keys = ibis.memtable(
        pd.concat([seen_c, seen[MP_KEY]], ignore_index=True).drop_duplicates(),
        schema={k: sch[k] for k in MP_KEY},
    )
    tuples = ibis.memtable(seen[list(TUPLE)].drop_duplicates(), schema={k: sch[k] for k in TUPLE})
    write(_numbered(keys, "mp", MP_KEY), "mps")
    write(_numbered(tuples, "flow", list(TUPLE)), "flows")
    c = agg
    # DuckDB sums BIGINT into HUGEINT, which Parquet stores as DOUBLE: keep the sums int64
    # (ops.Cast directly: Value.cast skips a cast to the type Ibis already believes it has).
    c = c.mutate(
        **{k: ops.Cast(c[k], to=dt.int64).to_expr() for k in ("packets", "bytes", "malformed")}
    )
    write(c.order_by(["period", *MP_KEY]), "counters")
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
    return {"version": _COMPACT_VERSION}


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


def execute(con: Any, expr: ir.Table) -> pd.DataFrame:
    """expr's answer as a DataFrame. On Spark a final ORDER BY on columns is done here, in
    pandas, on the answer: Spark sorts with a range shuffle that first runs the whole query
    once more to sample its keys (a metric's answer is small next to its input)."""
    op = expr.op()
    if con.name != "pyspark" or not isinstance(op, ops.Sort):
        return _nullable_integers(con.execute(expr), expr)
    keys = [k.arg for k in op.keys]
    if not all(isinstance(k, ops.Field) and k.rel == op.parent for k in keys):
        return _nullable_integers(con.execute(expr), expr)
    df = _nullable_integers(con.execute(op.parent.to_expr()), expr)
    for k in reversed(op.keys):  # stable sorts, last key first: each NULL placed as asked
        df = df.sort_values(
            k.arg.name,
            ascending=k.ascending,
            na_position="first" if k.nulls_first else "last",
            kind="stable",
        )
    return df.reset_index(drop=True)


def _nullable_integers(df: pd.DataFrame, expr: ir.Table) -> pd.DataFrame:
    """df with its integer columns that hold NULLs as pandas' nullable Int64, on every engine:
    DuckDB hands them back as Python objects, Spark as floats (35228.0), so the same table
    would print differently."""
    for name, t in expr.schema().items():
        if t.is_integer() and name in df and df[name].dtype.kind not in "iu":
            df[name] = df[name].astype("Int64")
    return df


# Samples per query when DuckDB runs a compacted dataset in batches of periods: one query up to
# about 10^7 samples, where a batch's planning and scans would cost more than they save; beyond,
# a query's grouping and window sort stay within a few hundred megabytes, where DuckDB's hash
# tables run faster per sample than at twice the size.
AUTO_BATCH_SAMPLES = 8_000_000


def execute_by_periods(
    con: Any, ds: Dataset, build: Callable[[Dataset], ir.Table], batch: int | None
) -> pd.DataFrame:
    """build(ds) executed, in one query (batch 0) or in queries of `batch` consecutive periods
    each, concatenated in period order. Every metric is per period, so the answer is the same;
    smaller queries keep a large dataset's joins and sorts in memory. batch None: DuckDB on
    the compact layout runs as many periods per query as hold about AUTO_BATCH_SAMPLES samples
    (half the time of one query at 10⁸ samples, where one query spills), anything else one
    query."""
    auto = batch is None and con.name == "duckdb" and ds.layout == "compact"
    if not batch and not auto:
        return execute(con, build(ds))
    ps = con.execute(ds.counters.select("period").distinct().order_by("period"))["period"]
    ps = [int(p) for p in ps]
    if not ps:
        return execute(con, build(ds))
    if auto:  # the compact layout's sample count is in its Parquet footers: no scan
        n = int(con.execute(ds.samples.count()))
        batch = max(1, AUTO_BATCH_SAMPLES * len(ps) // max(n, 1))
    parts = []
    for i in range(0, len(ps), batch):
        chunk = ps[i : i + batch]
        parts.append(execute(con, build(restrict(ds, chunk[0], chunk[-1]))))
    df = pd.concat(parts, ignore_index=True)
    if not len(parts[0]):
        return df
    # The first part's types (an empty part's columns come back as objects), except that an
    # integer column with a NULL in any part is nullable.
    types = {
        c: "Int64" if t.kind in "iu" and df[c].isna().any() else t
        for c, t in parts[0].dtypes.items()
    }
    return df.astype(types)
