"""altmark analytics scale benchmark: DuckDB vs Spark local mode on synthetic records.

Generates datasets of 102 measurement points (bench/analytics/ring17.yaml: 17 routers in a
ring, 272 host pairs) for several numbers of periods, then runs loss + delay on each engine in
a fresh process and prints a markdown table: time, samples/s, peak memory, the ratio Spark /
DuckDB and the growth against the smallest size, and whether both engines gave identical
answers. Not a test: numbers depend on the machine and its load.

Environment: BENCH_PERIODS=10,100,1000 (sizes), BENCH_ENGINES=duckdb,spark,
BENCH_DATA=DIR (default bench/results/analytics-data, kept between runs and reused),
BENCH_DUCKDB_MEMORY=1GB (DuckDB memory_limit; it spills beyond it),
BENCH_SPARK_MAX_PERIODS=100 (larger sizes run on DuckDB only: Spark local mode takes many
minutes there), BENCH_REMEASURE=0 (reuse the timings of an earlier run kept under BENCH_DATA).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TOPO = HERE / "ring17.yaml"


def generate(root: Path, periods: int) -> dict:
    from flowplane_analytics import synth, topology

    meta = root / "meta.json"
    if meta.exists():
        return json.loads(meta.read_text())
    net = topology.load(TOPO)
    spec = synth.Spec(
        periods=periods,
        packets=256,
        hash_bits=6,
        grow_prob=0.1,
        jitter_ns=20_000,
        loss_prob={lk: 0.002 for lk in net.graph.edges},
        seed=periods,
    )
    t = time.time()
    truth = synth.generate(net, spec, root)
    m = {
        "periods": periods,
        "samples": truth.samples,
        "points": len(net.graph.nodes),
        "files": 2 * len(list((root / "counters").glob("*/*"))),
        "drops": sum(truth.drops.values()),
        "gen_s": round(time.time() - t, 1),
    }
    meta.write_text(json.dumps(m))
    return m


def measure(engine_name: str, root: str, out: str) -> None:
    """One engine, one dataset, in this (fresh) process: loss + delay, then peak memory."""
    from flowplane_analytics import clusters, engine, metrics, topology

    net = topology.load(TOPO)
    cs = clusters.resolve(net)
    opts = engine.Options(
        engine=engine_name,
        memory_limit=os.environ.get("BENCH_DUCKDB_MEMORY", "1GB"),
        temp_dir=str(Path(out).parent / "spill"),
    )
    t0 = time.time()
    con = engine.connect(opts)
    t1 = time.time()
    ds = engine.load(con, root, cache=False)
    m, a = metrics.membership(net, cs)
    loss = con.execute(metrics.loss(ds, m, a))
    t2 = time.time()
    delay = con.execute(metrics.delay(ds, m, a))
    t3 = time.time()
    k = ["period", "cluster"]
    loss.sort_values(k).reset_index(drop=True).to_parquet(out + ".loss.parquet")
    delay.sort_values(k).reset_index(drop=True).to_parquet(out + ".delay.parquet")
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    jvm_kb = (
        _descendants_hwm_kb()
    )  # Spark's JVM: peak resident memory of our child processes
    if engine_name == "spark":
        engine.spark_session().stop()
    rss = rss_kb + jvm_kb
    Path(out + ".json").write_text(
        json.dumps(
            {
                "start_s": t1 - t0,
                "loss_s": t2 - t1,
                "delay_s": t3 - t2,
                "peak_mb": rss / 1024,
            }
        )
    )


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


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        measure(*sys.argv[2:5])
        return 0
    sizes = [int(x) for x in os.environ.get("BENCH_PERIODS", "10,100,1000").split(",")]
    engines = os.environ.get("BENCH_ENGINES", "duckdb,spark").split(",")
    data = Path(
        os.environ.get("BENCH_DATA", REPO / "bench" / "results" / "analytics-data")
    )
    spark_max = int(os.environ.get("BENCH_SPARK_MAX_PERIODS", "100"))
    remeasure = os.environ.get("BENCH_REMEASURE", "1") == "1"
    results = []
    for n in sizes:
        root = data / f"p{n}"
        meta = generate(root, n)
        row = {**meta}
        for eng in engines:
            if eng == "spark" and n > spark_max:
                continue
            out = str(data / f"p{n}-{eng}")
            if remeasure or not Path(out + ".json").exists():
                subprocess.run(
                    [sys.executable, __file__, "measure", eng, str(root), out],
                    check=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            row[eng] = json.loads(Path(out + ".json").read_text())
        if "duckdb" in row and "spark" in row:
            row["identical"] = identical(
                str(data / f"p{n}-duckdb"), str(data / f"p{n}-spark")
            )
        results.append(row)
        print(f"bench: {n} periods done", file=sys.stderr)
    print(
        "| periods | samples | files | engine | loss s | delay s | samples/s (loss+delay) "
        "| peak MB (process + JVM) | time / DuckDB | time / smallest |"
    )
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    base: dict[str, float] = {}
    for r in results:
        for eng in engines:
            if eng not in r:
                print(
                    f"| {r['periods']} | {r['samples']:,} | {r['files']:,} | {eng} "
                    f"| not run (BENCH_SPARK_MAX_PERIODS={spark_max}) | | | | | |"
                )
                continue
            m = r[eng]
            t = m["loss_s"] + m["delay_s"]
            base.setdefault(eng, t)
            d = r.get("duckdb")
            ratio = t / (d["loss_s"] + d["delay_s"]) if d else float("nan")
            print(
                f"| {r['periods']} | {r['samples']:,} | {r['files']:,} | {eng} "
                f"| {m['loss_s']:.1f} | {m['delay_s']:.1f} | {r['samples'] / t:,.0f} "
                f"| {m['peak_mb']:.0f} | {ratio:.2f} | {t / base[eng]:.1f} |"
            )
    if any("identical" in r for r in results):
        same = all(r["identical"] for r in results if "identical" in r)
        print(
            f"\nDuckDB and Spark answers identical (loss and delay, every size): "
            f"{'yes' if same else 'NO'}"
        )
    out = REPO / "bench" / "results" / "analytics.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
