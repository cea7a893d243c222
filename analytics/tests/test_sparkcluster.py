"""A real Spark standalone cluster (a master and 2 workers, `cluster up`): loss, delay, paths and
report run on it (the CLI with --master spark://…, and spark-submit in client mode) on a compacted
dataset give exactly DuckDB's answers, and the work ran on the two workers' executors, not in the
driver."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from conftest import DATA

from flowplane_analytics import engine, sparkcluster
from flowplane_analytics.cli import main

TOPO = str(DATA / "lab6.yaml")
PKG = Path(__file__).parents[1] / "src" / "flowplane_analytics"
COMMANDS = ("loss", "delay", "paths")


@pytest.fixture(scope="module")
def compacted(truth_dataset, tmp_path_factory):
    """A copy of the truth dataset with its compact layout, which the commands then read (as a
    user compacts before analysing at scale; the raw layout on Spark: test_metrics)."""
    root, _ = truth_dataset
    copy = tmp_path_factory.mktemp("compacted") / "data"
    shutil.copytree(root, copy)
    assert main(["compact", "-d", str(copy)]) == 0
    return copy


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("fpspark-cluster")
    c = sparkcluster.up(d, workers=2, cores=1, memory="1g")
    yield c
    assert sparkcluster.down(d)
    assert not sparkcluster._spark_groups(c.pids), "cluster processes left behind"
    assert not d.exists()


def _spark_env(events: Path) -> dict[str, str]:
    """The driver's settings for a run on the cluster: an event log (to see where tasks ran)
    and a small footprint (executors of 512 MB, one per worker)."""
    events.mkdir(exist_ok=True)
    conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": str(events),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
        "spark.executor.memory": "512m",
        "spark.driver.memory": "1g",
    }
    args = " ".join(f"--conf {k}={v}" for k, v in conf.items())
    return {**os.environ, "PYSPARK_SUBMIT_ARGS": f"{args} pyspark-shell"}


def _tasks_by_executor(events: Path, app: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (events / app).read_text().splitlines():
        e = json.loads(line)
        if e["Event"] == "SparkListenerTaskEnd":
            ex = e["Task Info"]["Executor ID"]
            out[ex] = out.get(ex, 0) + 1
    return out


def _outputs(tmp: Path, data: Path, extra: list[str]) -> list[list[str]]:
    base = ["-d", str(data), "-t", TOPO, "--layout", "compact", *extra]
    runs = [[m, *base, "--format", "parquet", "-o", str(tmp / f"{m}.parquet")] for m in COMMANDS]
    runs[2] += ["--limit", "0"]
    runs.append(["report", *base, "--html", str(tmp / "report.html")])
    return runs


def _same(a: Path, b: Path) -> None:
    for m in COMMANDS:
        x, y = pd.read_parquet(a / f"{m}.parquet"), pd.read_parquet(b / f"{m}.parquet")
        keys = [c for c in x.columns if c not in ("loss_rate", "mean_ns", "jitter_ns")]
        x = x.sort_values(keys).reset_index(drop=True)
        y = y.sort_values(keys).reset_index(drop=True)
        pd.testing.assert_frame_equal(x, y, check_dtype=False, check_exact=True)
    assert (a / "report.html").read_text() == (b / "report.html").read_text()


def test_cluster_runs_the_metrics_like_duckdb(cluster, compacted, tmp_path):
    root = compacted
    want, got, events = tmp_path / "duckdb", tmp_path / "spark", tmp_path / "events"
    want.mkdir()
    got.mkdir()
    for args in _outputs(want, root, []):
        assert main(args) == 0
    # one driver (a fresh process: this one may hold a local session) for the four commands
    script = (
        "import sys, json\n"
        "from flowplane_analytics.cli import main\n"
        "from flowplane_analytics import engine\n"
        f"for a in {_outputs(got, root, ['--engine', 'spark', '--master', cluster.master])!r}:\n"
        "    assert main(a) == 0, a\n"
        "print(engine.spark_session().sparkContext.applicationId)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script],
        env=_spark_env(events),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    app = r.stdout.split()[-1]
    _same(want, got)
    # the master ran the application with one executor on each of the two workers ...
    st = cluster.status()
    (a,) = [x for x in st["completedapps"] + st["activeapps"] if x["id"] == app]
    assert a["name"] == "flowplane-analytics" and a["cores"] == 2
    executors = set()
    for w in st["workers"]:
        with urllib.request.urlopen(w["webuiaddress"] + "/json/", timeout=10) as f:
            wj = json.load(f)
        executors |= {
            (w["id"], e["id"])
            for e in wj.get("executors", []) + wj.get("finishedexecutors", [])
            if e["appid"] == app
        }
    assert len({w for w, _ in executors}) == 2, executors
    # ... and every task ran on those executors, both of them, none in the driver
    tasks = _tasks_by_executor(events, app)
    assert set(tasks) == {"0", "1"}, tasks
    # A small dataset: the executors' JVMs compiled with C1 only.
    assert engine.locate(str(root), "compact").size < engine.C1_MAX_BYTES
    logs = list(Path(cluster.dir).glob(f"work/worker-*/{app}/*/stderr"))
    commands = [f.read_text().split("\n", 1)[0] for f in logs]
    assert len(commands) == 2 and all("-XX:TieredStopAtLevel=1" in c for c in commands), commands


def test_spark_submit_client_mode(cluster, compacted, tmp_path):
    """As docs/altmark-analytics.md says: spark-submit --deploy-mode client … __main__.py."""
    root = compacted
    out = tmp_path / "loss.parquet"
    args = ["-d", str(root), "-t", TOPO, "--layout", "compact", "--format", "parquet", "-o"]
    assert main(["loss", *args, str(tmp_path / "want.parquet")]) == 0
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    r = subprocess.run(
        [
            str(submit),
            *("--master", cluster.master, "--deploy-mode", "client"),
            *("--conf", "spark.executor.memory=512m"),
            str(PKG / "__main__.py"),
            *("loss", "--engine", "spark", *args, str(out)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    pd.testing.assert_frame_equal(
        pd.read_parquet(out), pd.read_parquet(tmp_path / "want.parquet"), check_exact=True
    )


def test_failed_up_leaves_nothing_running(tmp_path):
    """A cluster whose workers cannot register in time: up stops what it started, keeps the
    logs, and says so; down then removes the directory."""
    d = tmp_path / "fpspark-fail"
    with pytest.raises(sparkcluster.ClusterError, match="workers registered"):
        sparkcluster.up(d, workers=2, timeout=0.5)
    assert sorted(x.name for x in d.iterdir()) == ["logs"]
    assert not [p for p in Path("/proc").glob("[0-9]*") if _uses(p, d)]
    assert not sparkcluster.down(d) and not d.exists()


def _uses(proc: Path, d: Path) -> bool:
    """Whether the process runs in d (the daemons' working directory) or names it."""
    try:
        return (
            os.readlink(proc / "cwd").startswith(str(d))
            or str(d).encode() in (proc / "cmdline").read_bytes()
        )
    except OSError:
        return False


def test_cluster_bad_input(tmp_path, capsys):
    """Exit 2, nothing deleted: a directory holding other files, a file, a bad memory size,
    status without a cluster."""
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    for args, want in (
        (["down", "--dir", str(keep)], "not a cluster directory (it holds precious)"),
        (["up", "--dir", str(keep)], "not a cluster directory"),
        (["up", "--dir", str(keep / "precious")], "not a directory"),
        (["up", "--memory", "2x", "--dir", str(tmp_path / "c")], "not a memory size"),
        (["status", "--dir", str(tmp_path / "c")], "no cluster there"),
    ):
        assert main(["cluster", *args]) == 2
        assert want in capsys.readouterr().err
    assert (keep / "precious").read_text() == "x"
