"""altmark analytics scale benchmark: DuckDB, Spark local mode and a 2-worker Spark standalone
cluster on synthetic records.

Generates datasets of 102 measurement points (bench/analytics/ring17.yaml: 17 routers in a
ring, 272 host pairs) × 1,000 periods, with 23, 230 or 2,300 packets per host pair and period
(about 10⁶, 10⁷ and 10⁸ samples), in the layout probes write (one Parquet file per probe,
period and table: 34,000 files). Then, each in a fresh process:

1. `compact` (DuckDB): the records rewritten into <dataset>/compact/ (a few large files,
   integer columns, samples ordered by period), timed on its own;
2. loss + delay on DuckDB, on Spark local mode and on a standalone cluster (a master and 2
   workers of 1 core, started for the run as `flowplane-analytics cluster up` does), reading
   compact/; Spark local then runs them once more in its session (below 5×10⁷ samples), to
   show its cost once the JVM is warm;

and prints a markdown table: time per stage, samples/s, peak resident memory, the ratio to
DuckDB, the growth against the smallest size, and whether the engines gave identical answers,
with the goals of docs/altmark-analytics.md, met or not. It writes
bench/results/analytics.json in the shape every bench writes (bench/report: name, time, setup,
tables with their goals, data). Not a test: numbers depend on the machine and its load.

Environment: BENCH_PACKETS=23,230 (sizes; add 2300 for 10⁸ samples), BENCH_PERIODS=1000,
BENCH_ENGINES=duckdb,spark,standalone, BENCH_DATA=DIR (default bench/results/analytics-data,
kept between runs and reused), BENCH_DUCKDB_MEMORY=1GB (DuckDB memory_limit; it spills beyond
it), BENCH_DUCKDB_THREADS=2, BENCH_SPARK_MEMORY=4g (local mode's driver; each standalone
executor has half), BENCH_SPARK_MAX_SAMPLES=200000000 (larger sizes run on DuckDB only),
BENCH_BATCH_PERIODS (periods per query; default: the CLI's, sized by samples on DuckDB, one
query on Spark),
BENCH_REMEASURE=0 (reuse the timings of an earlier run kept under BENCH_DATA: lets sizes be
measured in separate runs and tabulated together; or a list of the stages to measure again,
e.g. BENCH_REMEASURE=duckdb).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TOPO = HERE / "ring17.yaml"


def generate(root: Path, packets: int, periods: int) -> dict:
    from flowplane_analytics import synth, topology

    meta = root / "meta.json"
    if meta.exists():
        return json.loads(meta.read_text())
    net = topology.load(TOPO)
    spec = synth.Spec(
        periods=periods,
        packets=packets,
        hash_bits=6,
        grow_prob=0.1,
        jitter_ns=20_000,
        loss_prob={lk: 0.002 for lk in net.graph.edges},
        seed=packets,
    )
    t = time.time()
    truth = synth.generate(net, spec, root)
    m = {
        "periods": periods,
        "packets": packets,
        "samples": truth.samples,
        "points": len(net.graph.nodes),
        "files": 2 * len(list((root / "counters").glob("*/*"))),
        "drops": sum(truth.drops.values()),
        "gen_s": round(time.time() - t, 1),
    }
    meta.write_text(json.dumps(m))
    return m


def _spark_memory() -> int:
    """Spark's memory in MB (BENCH_SPARK_MEMORY, default 4g): local mode's driver memory, the
    standalone cluster's executor memory summed over its two workers."""
    v = os.environ.get("BENCH_SPARK_MEMORY", "4g").lower()
    return int(v[:-1]) * 1024 if v.endswith("g") else int(v.removesuffix("m"))


def _opts(engine_name: str, out: str):
    from flowplane_analytics import engine

    spark: dict[str, str] = {}
    master = None
    if engine_name == "spark":
        os.environ["FLOWPLANE_SPARK_DRIVER_MEMORY"] = f"{_spark_memory()}m"
    elif engine_name == "standalone":
        master = os.environ["BENCH_SPARK_MASTER"]
        spark = {
            "spark.executor.memory": f"{_spark_memory() // 2}m",
            "spark.driver.memory": "1g",
        }
    return engine.Options(
        engine="duckdb" if engine_name == "duckdb" else "spark",
        master=master,
        memory_limit=os.environ.get("BENCH_DUCKDB_MEMORY", "1GB"),
        temp_dir=str(Path(out).parent / "spill"),
        threads=int(os.environ.get("BENCH_DUCKDB_THREADS", "2")),
        spark_conf=spark,
    )


def _peak_mb() -> float:
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (rss_kb + _descendants_hwm_kb()) / 1024  # + Spark's JVM, a child process


def compact(root: str, out: str) -> None:
    """`compact` in this (fresh) process, on DuckDB."""
    from flowplane_analytics import engine

    t0 = time.time()
    engine.compact(engine.connect(_opts("duckdb", out)), root)
    Path(out + ".json").write_text(
        json.dumps({"compact_s": time.time() - t0, "peak_mb": _peak_mb()})
    )


# Spark local runs loss + delay a second time in its session below this many samples.
WARM_MAX_SAMPLES = 50_000_000


def measure(engine_name: str, root: str, out: str) -> None:
    """One engine, one dataset, in this (fresh) process: loss + delay, then peak memory."""
    from flowplane_analytics import clusters, engine, metrics, topology

    net = topology.load(TOPO)
    cs = clusters.resolve(net)
    t0 = time.time()
    # Located before the session, as the CLI does: Spark sizes its JVMs' compilation to it.
    src = engine.locate(root, "compact")
    con = engine.connect(_opts(engine_name, out), src)
    t1 = time.time()
    ds = engine.load(con, src, cache=False)
    m, a = metrics.membership(net, cs)
    b = os.environ.get("BENCH_BATCH_PERIODS")
    batch = int(b) if b else None  # None: the default (DuckDB: sized by samples)

    def run(metric):  # a metric function (metrics.loss, metrics.delay): its answer
        return engine.execute_by_periods(con, ds, lambda d: metric(d, m, a), batch)

    loss = run(metrics.loss)
    t2 = time.time()
    delay = run(metrics.delay)
    t3 = time.time()
    k = ["period", "cluster"]
    loss.sort_values(k).reset_index(drop=True).to_parquet(out + ".loss.parquet")
    delay.sort_values(k).reset_index(drop=True).to_parquet(out + ".delay.parquet")
    peak = _peak_mb()
    res = {"start_s": t1 - t0, "loss_s": t2 - t1, "delay_s": t3 - t2, "peak_mb": peak}
    if (
        engine_name == "spark"
        and int(con.execute(ds.samples.count())) < WARM_MAX_SAMPLES
    ):
        # The same two queries again in this session: what a long-lived session (a notebook,
        # a service) pays once the JVM has loaded, compiled and generated their code.
        t4 = time.time()
        run(metrics.loss)
        run(metrics.delay)
        res["again_s"] = time.time() - t4
    if engine_name != "duckdb":
        engine.spark_session().stop()
    Path(out + ".json").write_text(json.dumps(res))


def _descendants_hwm_kb() -> int:
    """Sum of VmHWM (peak RSS) of every process descending from this one."""
    parent: dict[int, int] = {}
    hwm: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            status = (d / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        parent[int(d.name)] = int(fields.get("PPid", "0"))
        hwm[int(d.name)] = int(fields.get("VmHWM", "0 kB").split()[0])
    me, total = os.getpid(), 0
    for pid in parent:
        p = pid
        while p and p != me:
            p = parent.get(p, 0)
        if p == me and pid != me:
            total += hwm.get(pid, 0)
    return total


def identical(a: str, b: str) -> bool:
    import pandas as pd

    for part in ("loss", "delay"):
        x = pd.read_parquet(f"{a}.{part}.parquet")
        y = pd.read_parquet(f"{b}.{part}.parquet")
        try:
            pd.testing.assert_frame_equal(x, y, check_dtype=False, check_exact=True)
        except AssertionError:
            return False
    return True


def num(v: float) -> str:
    """A goal's number as bench/report formats it (Num)."""
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def at_most(metric: str, v: float, limit: float) -> dict:
    """The goal metric ≤ limit, judged on v (bench/report's AtMost)."""
    return {
        "metric": metric,
        "target": f"≤ {num(limit)}",
        "value": num(v),
        "met": v <= limit,
    }


def check(metric: str, target: str, ok: bool) -> dict:
    """A goal that is met or not (bench/report's Check)."""
    return {
        "metric": metric,
        "target": target,
        "value": "yes" if ok else "no",
        "met": ok,
    }


def _out(*cmd: str) -> str:
    try:
        return subprocess.run(
            cmd, check=False, cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return ""


def setup(when: datetime) -> dict:
    """The machine and checkout, as bench/report's CurrentSetup records them."""

    def field(file: str, name: str) -> str:
        for line in Path(file).read_text().splitlines():
            k, _, v = line.partition(":")
            if k.strip() == name:
                return v.strip()
        return ""

    commit = _out("git", "rev-parse", "--short", "HEAD") or "unknown"
    dirty = _out(
        "git",
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        ":(exclude)docs/benchmarks.md",
        ":(exclude)docs/img/bench",
    )
    if commit != "unknown" and dirty:
        commit += "+dirty"
    mem = field("/proc/meminfo", "MemTotal").removesuffix(" kB")
    return {
        "kernel": platform.release(),
        "cpu": field("/proc/cpuinfo", "model name") or "unknown",
        "cores": len(os.sched_getaffinity(0)),
        "memory": f"{int(mem) / (1 << 20):.1f} GiB" if mem else "",
        "go": _out("go", "env", "GOVERSION") or "unknown",
        "commit": commit,
        "date": when.strftime("%Y-%m-%d"),
    }


def met_text(gs: list[dict]) -> str:
    """The met column for a row's goals (bench/report's MetText)."""
    judged = [g for g in gs if g.get("met") is not None]
    missed = [g["metric"] for g in judged if not g["met"]]
    if not gs:
        return ""
    if not judged:
        return "—"
    if missed:
        return "**not met**" if len(gs) == 1 else "**not met**: " + ", ".join(missed)
    if len(judged) < len(gs):
        return f"met ({len(gs) - len(judged)} not judged)"
    return "met"


def markdown(t: dict) -> str:
    """The table as bench/report's Table.Markdown prints it."""
    cols = list(t["columns"])
    goals = t.get("goals", [])
    if any(goals):
        cols += ["goal", "met"]
    out = [
        f"\n### {t['title']}\n",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for i, row in enumerate(t["rows"]):
        cells = list(row)
        if any(goals):
            gs = goals[i] if i < len(goals) else []
            cells += [
                "; ".join(f"{g['metric']} {g['target']}" for g in gs),
                met_text(gs),
            ]
        out.append("| " + " | ".join(cells) + " |")
    for n in t.get("notes", []):
        out.append(f"\n{n}")
    return "\n".join(out)


def _run(*args: str) -> None:
    subprocess.run(
        [sys.executable, __file__, *args],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        measure(*sys.argv[2:5])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "compact":
        compact(*sys.argv[2:4])
        return 0
    sizes = [int(x) for x in os.environ.get("BENCH_PACKETS", "23,230").split(",")]
    periods = int(os.environ.get("BENCH_PERIODS", "1000"))
    engines = os.environ.get("BENCH_ENGINES", "duckdb,spark,standalone").split(",")
    data = Path(
        os.environ.get("BENCH_DATA", REPO / "bench" / "results" / "analytics-data")
    )
    spark_max = int(os.environ.get("BENCH_SPARK_MAX_SAMPLES", "200000000"))
    rm = os.environ.get("BENCH_REMEASURE", "1")
    redo = (
        {"compact", *engines}
        if rm == "1"
        else set()
        if rm == "0"
        else set(rm.split(","))
    )
    with _cluster(data, engines):
        results = [_size(data, k, periods, engines, redo, spark_max) for k in sizes]
    _tabulate(results, periods, engines, spark_max)
    return 0


@contextlib.contextmanager
def _cluster(data: Path, engines: list[str]) -> Iterator[None]:
    """The 2-worker standalone cluster (`flowplane-analytics cluster up`, 1 core and half of
    BENCH_SPARK_MEMORY each) while the sizes are measured, when its rows are asked for."""
    from flowplane_analytics import sparkcluster

    if "standalone" not in engines:
        yield
        return
    d = data / "fpspark-cluster"
    mem = f"{_spark_memory() // 2 + 512}m"
    c = sparkcluster.up(d, workers=2, cores=1, memory=mem)
    os.environ["BENCH_SPARK_MASTER"] = c.master
    try:
        yield
    finally:
        sparkcluster.down(d)


def _size(
    data: Path, k: int, periods: int, engines: list[str], redo: set[str], spark_max: int
) -> dict:
    """One dataset: generated (once), compacted and measured on each engine."""
    name = f"k{k}-p{periods}"
    root = data / name
    meta = generate(root, k, periods)
    row = {**meta}
    out = str(data / f"{name}-compact")
    if "compact" in redo or not Path(out + ".json").exists():
        _run("compact", str(root), out)
    row["compact"] = json.loads(Path(out + ".json").read_text())
    for eng in engines:
        if eng != "duckdb" and meta["samples"] > spark_max:
            continue
        out = str(data / f"{name}-{eng}")
        if eng in redo or not Path(out + ".json").exists():
            if eng != "duckdb":
                _cds_recorded(root, data)
            _run("measure", eng, str(root), out)
        row[eng] = json.loads(Path(out + ".json").read_text())
    for eng in engines:
        if eng != "duckdb" and "duckdb" in row and eng in row:
            row[f"identical_{eng}"] = identical(
                str(data / f"{name}-duckdb"), str(data / f"{name}-{eng}")
            )
    print(f"bench: {meta['samples']:,} samples done", file=sys.stderr)
    return row


def _cds_recorded(root: Path, data: Path) -> None:
    """Spark's class-data-sharing archive (engine: sparkcds), recorded before any Spark run is
    timed, by an untimed one as a user's first Spark command records it: the timed runs map it."""
    from flowplane_analytics import engine, sparkcds

    archive = sparkcds.archive_path(engine.check_java())
    if archive is not None and not archive.exists():
        _run("measure", "spark", str(root), str(data / "cds-recording"))


def _tabulate(
    results: list[dict], periods: int, engines: list[str], spark_max: int
) -> None:
    from flowplane_analytics.engine import AUTO_BATCH_SAMPLES, C1_MAX_BYTES

    table: dict = {
        "title": (
            "analytics: loss + delay on DuckDB, Spark local mode and a 2-worker Spark "
            "standalone cluster, after compact"
        ),
        "columns": [
            "samples",
            "stage",
            "s",
            "samples/s",
            "peak MB (process + JVM)",
            "time / DuckDB",
            "time / smallest",
        ],
        "rows": [],
        "goals": [],
        "notes": [
            (
                f"{results[0]['points']} measurement points × {periods} periods; the records "
                f"as probes write them: {results[0]['files']:,} files per dataset. DuckDB "
                f"{os.environ.get('BENCH_DUCKDB_THREADS', '2')} threads, memory_limit "
                f"{os.environ.get('BENCH_DUCKDB_MEMORY', '1GB')}, queries of about "
                f"{AUTO_BATCH_SAMPLES:,} samples at most (batches of periods; one query below "
                "that); each stage in a fresh process."
            ),
            (
                "Spark: local mode `local[*]` (2 cores), driver memory "
                f"{_spark_memory()} MB; standalone: `flowplane-analytics cluster up` on this "
                "machine, a master and 2 workers of 1 core each, one executor per worker of "
                f"{_spark_memory() // 2} MB, driver (client mode) 1 GB. Both: shuffle partitions "
                "sized to the data (one per 16 MiB of Parquet read, adaptive execution on), "
                "Arrow transfers, one query per metric, JVMs with the throughput collector "
                "(-XX:+UseParallelGC) that map Spark's class-data-sharing archive (recorded "
                "by an untimed run first, as a user's first Spark command records it) and "
                f"compile with C1 only below {C1_MAX_BYTES >> 20} MiB of Parquet read "
                "(-XX:TieredStopAtLevel=1). Peak MB is this process and its children: for the "
                "standalone rows the driver only (the executors are the workers' children)."
            ),
            (
                '"The same again in its session": Spark local runs loss + delay a second time '
                "in the session it measured them in (datasets below "
                f"{WARM_MAX_SAMPLES:,} samples), against DuckDB's one run; no goal."
            ),
        ],
    }

    def row(cells: list[str], goals: list[dict] | None = None) -> None:
        table["rows"].append(cells)
        table["goals"].append(goals or [])

    base: dict[str, float] = {}
    for r in results:
        n = r["samples"]
        c = r["compact"]
        base.setdefault("compact", c["compact_s"])
        row(
            [
                f"{n:,}",
                "compact (DuckDB, once per dataset)",
                f"{c['compact_s']:.1f}",
                f"{n / c['compact_s']:,.0f}",
                f"{c['peak_mb']:.0f}",
                "",
                f"{c['compact_s'] / base['compact']:.1f}",
            ]
        )
        for eng in engines:
            if eng not in r:
                row(
                    [
                        f"{n:,}",
                        f"{eng}: not run (BENCH_SPARK_MAX_SAMPLES={spark_max:,})",
                    ]
                    + [""] * 5
                )
                continue
            m = r[eng]
            t = m["loss_s"] + m["delay_s"]
            base.setdefault(eng, t)
            d = r.get("duckdb")
            ratio = f"{t / (d['loss_s'] + d['delay_s']):.1f}" if d else ""
            goals = []
            if eng == "duckdb" and n >= 10**8:
                # The scale goal: 10⁸ samples analysed within a minute.
                goals.append(at_most("loss + delay, s", t, 60))
            if eng == "spark" and d and n < 10**8:
                goals.append(
                    at_most("time / DuckDB", t / (d["loss_s"] + d["delay_s"]), 3)
                )
            if eng == "spark" and n >= 10**8:
                goals.append(at_most("loss + delay, s", t, 600))
            if eng == "standalone" and "spark" in r:
                local = r["spark"]["loss_s"] + r["spark"]["delay_s"]
                goals.append(at_most("time / Spark local", t / local, 1.5))
            if f"identical_{eng}" in r:
                goals.append(
                    check(
                        "loss and delay tables",
                        "identical to DuckDB's",
                        r[f"identical_{eng}"],
                    )
                )
            row(
                [
                    f"{n:,}",
                    f"{eng}: loss {m['loss_s']:.1f} s + delay {m['delay_s']:.1f} s",
                    f"{t:.1f}",
                    f"{n / t:,.0f}",
                    f"{m['peak_mb']:.0f}",
                    ratio,
                    f"{t / base[eng]:.1f}",
                ],
                goals,
            )
            if "again_s" in m:
                a = m["again_s"]
                row(
                    [
                        f"{n:,}",
                        f"{eng}: the same again in its session (JVM warm)",
                        f"{a:.1f}",
                        f"{n / a:,.0f}",
                        "",
                        f"{a / (d['loss_s'] + d['delay_s']):.1f}" if d else "",
                        "",
                    ]
                )
    knobs = [
        f"{k}={os.environ[k]}"
        for k in (
            "BENCH_PACKETS",
            "BENCH_PERIODS",
            "BENCH_ENGINES",
            "BENCH_DUCKDB_MEMORY",
            "BENCH_DUCKDB_THREADS",
            "BENCH_SPARK_MAX_SAMPLES",
            "BENCH_SPARK_MEMORY",
            "BENCH_BATCH_PERIODS",
            "BENCH_REMEASURE",
        )
        if k in os.environ
    ]
    if knobs:
        table["notes"].append(
            f"Run with {', '.join(knobs)} (defaults: bench/analytics/bench.py)."
        )
    if not any(r["samples"] >= 10**8 for r in results):
        table["notes"].append(
            "The goal of 10⁸ samples within a minute needs that size: "
            "BENCH_PACKETS=23,230,2300 (its dataset is generated once and kept)."
        )
    print(markdown(table))
    now = datetime.now(UTC)
    out_json = REPO / "bench" / "results" / "analytics.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(
        json.dumps(
            {
                "name": "analytics",
                "time": now.isoformat(),
                "setup": setup(now),
                "tables": [table],
                "data": {"results": results},
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
