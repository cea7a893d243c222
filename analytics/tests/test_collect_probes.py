"""collect against real probes: ten `flowplane altmark probe run` processes in a namespace of
their own, serving their APIs off loopback with a bearer token, plus one probe address where
nothing listens and one server that accepts and never answers. Root only: in CI (CI=true) a
missing privilege or binary fails, elsewhere it skips."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from probefarm import API_ADDR, BASE_PORT, Farm, need_root

TOKEN = "fedcba9876543210fedcba98"
N = 10
# A server that accepts connections and never answers them.
SLOW = f"""
import socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("{API_ADDR}", {BASE_PORT + N}))
s.listen(64)
held = []
while True:
    held.append(s.accept())
"""
PY = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    why = need_root()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"test_collect_probes {why}")
        pytest.skip(why)
    f = Farm(tmp_path_factory.mktemp("farm"), N, TOKEN, periods=4, period_ms=200, rate=100)
    try:
        f.extra.append(f.start(str(PY), "-c", SLOW))
        f.wait_recorded()
        probes = f.workdir / "probes.txt"
        urls = [f.url(i) for i in range(N + 2)]  # N: the silent server; N+1: nothing there
        probes.write_text("# the farm\n" + "\n".join(urls) + "\n")
        yield f
    finally:
        f.close()


def _collect(farm: Farm, dest: Path, *extra: str, wait: bool = True):
    log = dest.with_suffix(".out")
    p = farm.start(
        "env",
        f"PYTHONPATH={SRC}",
        str(PY),
        "-m",
        "flowplane_analytics",
        "collect",
        "-d",
        str(dest),
        "--probe-file",
        str(farm.workdir / "probes.txt"),
        "--token-file",
        str(farm.token_file),
        "--parallel",
        "4",
        "--timeout",
        "2",
        "--retries",
        "1",
        "--retry-wait",
        "0.1",
        "--probe-deadline",
        "30",
        "--format",
        "json",
        *extra,
        log=log,
    )
    if not wait:
        return p
    code = p.wait(timeout=600)
    rows = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    return code, {r["url"]: r for r in rows}, log.read_text()


def _counters(root: Path, probe: str) -> pd.DataFrame:
    df = pq.read_table(root / "counters" / f"probe={probe}").to_pandas()
    df = df[["period", "ifname", "direction", "color", "packets", "bytes", "samples"]]
    df["period"] = df.period.astype(int)
    return df.sort_values(["period", "direction"]).reset_index(drop=True)


def _check_same(farm: Farm, dest: Path) -> None:
    """Every probe's records, collected, equal what the probe wrote itself."""
    for i in range(N):
        got, want = _counters(dest, f"p{i:03d}"), _counters(farm.data_dir(i), f"p{i:03d}")
        pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_many_probes_slow_dead_idempotent(farm, tmp_path):
    dest = tmp_path / "ds"
    code, rows, out = _collect(farm, dest)
    assert code == 1, out
    for i in range(N):
        r = rows[farm.url(i)]
        assert r["status"] == "ok" and r["fetched"] == len(farm.recorded(i)) > 0, r
        assert r["rows"] > 0
    assert rows[farm.url(N)]["status"].startswith("DOWN") and "timed out" in out  # silent
    assert rows[farm.url(N + 1)]["status"].startswith("DOWN")  # nothing listens
    assert sum(r["samples"] > 0 for r in [_counters(dest, f"p{i:03d}").sum()]) > 0
    _check_same(farm, dest)
    # again: nothing fetched twice
    code, rows, out = _collect(farm, dest)
    for i in range(N):
        r = rows[farm.url(i)]
        assert r["fetched"] == 0 and r["already"] == len(farm.recorded(i)), r
        assert r["requests"] == 1
    _check_same(farm, dest)


def test_killed_and_resumed(farm, tmp_path):
    """kill -9 in the middle of a run: every visible file whole; the next run completes."""
    dest = tmp_path / "ds"
    p = _collect(farm, dest, "--parallel", "1", wait=False)
    end = time.monotonic() + 300
    while time.monotonic() < end and p.poll() is None:
        if len(list(dest.glob("counters/*/*/part-0.parquet"))) >= 3:
            break
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    for f in dest.rglob("*.parquet"):
        pq.read_metadata(f)  # whole: a temporary name until written and synced
    before = len(list(dest.glob("counters/*/*/part-0.parquet")))
    code, rows, out = _collect(farm, dest)
    assert code == 1, out  # the silent and the dead probe
    total = sum(len(farm.recorded(i)) for i in range(N))
    assert sum(rows[farm.url(i)]["fetched"] for i in range(N)) == total - before
    assert not list(dest.rglob("*.tmp"))
    _check_same(farm, dest)


def test_token_required_off_loopback(farm, tmp_path):
    code, rows, _ = _collect(farm, tmp_path / "ds", "--token-file", "/dev/null")
    assert code == 1
    for i in range(N):
        assert "401" in rows[farm.url(i)]["status"], rows[farm.url(i)]
    assert not list((tmp_path / "ds").rglob("*.parquet"))
