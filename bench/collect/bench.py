"""`BENCH=collect make bench`: `flowplane-analytics collect` against many real probes.

BENCH_PROBES (default 100) `flowplane altmark probe run` processes in one namespace of their
own, each on a veth interface with UDP crossing it, each recording BENCH_PERIODS (default 20)
periods of 200 ms and then serving them off loopback with a bearer token
(analytics/tests/probefarm.py). Then `collect` runs as its own process in that namespace, with
--parallel BENCH_PARALLEL (default 8), for each probe count of BENCH_COUNTS (default 10 and
all), into a fresh local directory and into an S3-compatible server (moto's, on loopback),
and once more into the same directory (nothing to fetch). Each run's wall time, period records
and rows (counters and samples) per second, and the collector's peak memory (its maxrss) are
tabulated; every run must collect every period every probe recorded. Writes
bench/results/collect.json in the shape every bench writes (bench/report).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "analytics" / "tests"))
from probefarm import Farm, need_root, s3_env

# The page's helpers (setup, markdown, goals) as the analytics bench writes them.
_spec = importlib.util.spec_from_file_location(
    "abench", REPO / "bench/analytics/bench.py"
)
assert _spec and _spec.loader
ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab)

TOKEN = "bench0123456789abcdef0123"
# moto's server runs in the farm's namespace, where collect runs: this waits for it to answer
# and makes the bucket.
_BUCKET = """
import sys, time, requests
for _ in range(600):
    try:
        requests.put(sys.argv[1] + "/fp-bench", timeout=5).raise_for_status()
        sys.exit(0)
    except requests.RequestException:
        time.sleep(0.1)
sys.exit(1)
"""
PY = REPO / "analytics" / ".venv" / "bin" / "python"


def run_collect(
    farm: Farm, n: int, dest: str, parallel: int, env: dict[str, str]
) -> dict:
    """One collect run against the first n probes: its answer, time and peak memory."""
    probes = farm.workdir / f"probes-{n}.txt"
    probes.write_text("\n".join(farm.url(i) for i in range(n)) + "\n")
    out = farm.workdir / "collect.out"
    envs = [f"{k}={v}" for k, v in env.items()]
    t0 = time.monotonic()
    p = farm.start(
        "env",
        f"PYTHONPATH={REPO / 'analytics' / 'src'}",
        *envs,
        str(PY),
        "-m",
        "flowplane_analytics",
        "collect",
        "-d",
        dest,
        "--probe-file",
        str(probes),
        "--token-file",
        str(farm.token_file),
        "--parallel",
        str(parallel),
        "--format",
        "json",
        log=out,
    )
    _, status, ru = os.wait4(p.pid, 0)
    secs = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    rows = [json.loads(x) for x in out.read_text().splitlines() if x.startswith("{")]
    if p.returncode != 0 or len(rows) != n:
        raise RuntimeError(f"collect exited {p.returncode}: {out.read_text()[-3000:]}")
    return {
        "seconds": secs,
        "peak_mib": ru.ru_maxrss / 1024,
        "fetched": sum(r["fetched"] for r in rows),
        "already": sum(r["already"] for r in rows),
        "rows": sum(r["rows"] for r in rows),
    }


def main() -> int:
    why = need_root()
    if why:
        print(f"collect bench: {why}", file=sys.stderr)
        return 1
    n_max = int(os.environ.get("BENCH_PROBES", "100"))
    periods = int(os.environ.get("BENCH_PERIODS", "20"))
    parallel = int(os.environ.get("BENCH_PARALLEL", "8"))
    counts = sorted(
        {min(int(x), n_max) for x in os.environ.get("BENCH_COUNTS", "10").split(",")}
    )
    counts = sorted({*counts, n_max})
    work = REPO / "bench" / "results" / "collect-work"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    t0 = time.monotonic()
    farm = Farm(work, n_max, TOKEN, periods=periods, period_ms=200, rate=300, nmax=256)
    moto = None
    try:
        farm.wait_recorded(timeout=900)
        start_s = time.monotonic() - t0
        rss = farm.rss_kib()
        recorded = [len(farm.recorded(i)) for i in range(n_max)]
        endpoint = "http://127.0.0.1:29000"
        moto = farm.start(
            str(PY), "-m", "moto.server", "-H", "127.0.0.1", "-p", "29000"
        )
        if farm.start(str(PY), "-c", _BUCKET, endpoint).wait(timeout=120) != 0:
            raise RuntimeError("moto's server did not answer in its namespace")
        results = []
        for n in counts:
            want = sum(recorded[:n])
            for dest_kind in ("local", "s3"):
                if dest_kind == "local":
                    dest, env = str(work / f"ds-{n}"), {}
                else:
                    dest, env = f"s3://fp-bench/ds-{n}", s3_env(endpoint)
                first = run_collect(farm, n, dest, parallel, env)
                again = run_collect(farm, n, dest, parallel, env)
                if (
                    first["fetched"] != want
                    or again["fetched"]
                    or again["already"] != want
                ):
                    raise RuntimeError(
                        f"{n} probes into {dest}: {first}, then {again}; want {want}"
                    )
                results.append(
                    {"probes": n, "dest": dest_kind, "first": first, "again": again}
                )
                print(
                    f"collect: {n} probes into {dest_kind}: {first} / {again}",
                    file=sys.stderr,
                )
    finally:
        farm.close()
        if moto:
            moto.terminate()
            moto.wait()
    cols = [
        "probes",
        "into",
        "period records",
        "rows",
        "time",
        "records/s",
        "rows/s",
        "peak memory",
        "second run (nothing new)",
    ]
    table = {
        "title": "collect from real probes",
        "columns": cols,
        "rows": [],
        "goals": [],
        "notes": [
            (
                f"{n_max} `flowplane altmark probe run` processes (one veth interface each, "
                f"{periods} periods of 200 ms, UDP crossing every interface, NMAX 256) in one "
                f"namespace, serving their APIs off loopback with a bearer token; they took "
                f"{start_s:.0f} s to start and record, and used {sum(rss) / 1024:.0f} MiB "
                f"resident in all ({max(rss) / 1024:.0f} MiB the largest). `collect --parallel "
                f"{parallel}` runs as its own process in the namespace; into s3 is moto's "
                "S3-compatible server on loopback. Records are period records (one per probe and "
                "period), rows their counters and samples rows; peak memory is the collector's "
                "maxrss. The second run lists every probe's periods and fetches nothing."
            ),
        ],
    }
    for r in results:
        f, a = r["first"], r["again"]
        table["rows"].append(
            [
                str(r["probes"]),
                r["dest"],
                str(f["fetched"]),
                str(f["rows"]),
                f"{f['seconds']:.1f} s",
                f"{f['fetched'] / f['seconds']:.0f}",
                f"{f['rows'] / f['seconds']:.0f}",
                f"{f['peak_mib']:.0f} MiB",
                f"{a['seconds']:.1f} s",
            ]
        )
        table["goals"].append(
            [ab.check("every period once", "yes", True)]
            + (
                [ab.at_most("peak MiB", f["peak_mib"], 512)]
                if r["probes"] == n_max
                else []
            )
        )
    print(ab.markdown(table))
    now = datetime.now(UTC)
    out_json = REPO / "bench" / "results" / "collect.json"
    out_json.write_text(
        json.dumps(
            {
                "name": "collect",
                "time": now.isoformat(),
                "setup": ab.setup(now),
                "tables": [table],
                "data": {
                    "results": results,
                    "probe_rss_kib": rss,
                    "recorded": recorded,
                },
            },
            indent=1,
        )
        + "\n"
    )
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
