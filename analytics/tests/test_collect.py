"""collect against local HTTP servers that serve the probe's documented API (GET /periods,
GET /periods/{n}, bearer token), into a directory and into an S3-compatible object store (a real
moto server on loopback), from which every metric reads on DuckDB and on Spark with the answers
of the same records read from a local directory."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import requests
from conftest import DATA, Run

from flowplane_analytics import collect, records, storage, synth
from flowplane_analytics.cli import main

TOKEN = "0123456789abcdef0123"
TOPO = str(DATA / "lab6.yaml")


class Probe:
    """A fake probe serving one probe's periods of a dataset."""

    def __init__(self, root: Path, probe: str, token: str | None = TOKEN):
        self.root, self.probe, self.token = root, probe, token
        self.fail: set[int] = set()  # periods answered with 500
        self.requests: list[str] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                outer.requests.append(self.path)
                if outer.token and self.headers.get("Authorization") != f"Bearer {outer.token}":
                    return self._send(401, {"error": "missing or wrong bearer token"})
                if self.path == "/periods":
                    ps = records.complete_periods(outer.root, outer.probe)
                    return self._send(200, {"probe": outer.probe, "periods": ps})
                if self.path.startswith("/periods/"):
                    n = int(self.path.rsplit("/", 1)[1])
                    if n in outer.fail:
                        return self._send(500, {"error": "boom"})
                    if not records.is_complete(outer.root, outer.probe, n):
                        return self._send(404, {"error": "no complete record"})
                    return self._send(200, records.read_period_json(outer.root, outer.probe, n))
                return self._send(404, {"error": "no route"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def source(tmp_path_factory, lab6):
    root = tmp_path_factory.mktemp("probes")
    synth.generate(lab6, synth.Spec(periods=3, packets=300, seed=11), root)
    return root


@pytest.fixture
def probes(source):
    ps = [Probe(source, p) for p in records.probes(source)]
    yield ps
    for p in ps:
        p.close()


def _frame(root, table):
    df = pq.read_table(Path(root) / table).to_pandas()
    df["probe"], df["period"] = df.probe.astype(str), df.period.astype(int)
    return df.sort_values(list(df.columns)).reset_index(drop=True)


def test_collect_idempotent_and_exact(tmp_path, source, probes):
    srcs = [collect.Source(p.url, TOKEN) for p in probes]
    res = collect.collect(srcs, tmp_path, retries=0)
    assert all(r.ok for r in res), [r.error for r in res]
    assert sum(len(r.fetched) for r in res) == 3 * len(probes)
    for t in ("counters", "samples"):
        pd.testing.assert_frame_equal(_frame(tmp_path, t), _frame(source, t), check_dtype=False)
    assert (tmp_path / "jsonl" / probes[0].probe).is_dir()
    # again: nothing fetched, nothing duplicated, one GET /periods per probe
    before = [len(p.requests) for p in probes]
    res = collect.collect(srcs, tmp_path, retries=0)
    assert [len(r.fetched) for r in res] == [0] * len(probes)
    assert [r.present for r in res] == [3] * len(probes)
    assert [len(p.requests) - b for p, b in zip(probes, before, strict=True)] == [1] * len(probes)
    assert len(list((tmp_path / "counters").rglob("*.parquet"))) == 3 * len(probes)


def test_collect_resumes(tmp_path, source, probes):
    p = probes[0]
    periods = records.complete_periods(source, p.probe)
    p.fail = {periods[1]}
    res = collect.collect([collect.Source(p.url, TOKEN)], tmp_path, retries=1, sleep=lambda _: None)
    assert not res[0].ok and "HTTP 500" in res[0].error
    assert res[0].fetched == [periods[0]]
    # a writer killed mid-way leaves a temporary file: the next run removes it
    stale = records.partition_dir(tmp_path, "counters", p.probe, periods[1])
    stale.mkdir(parents=True)
    (stale / ".part-0.parquet.x.tmp").write_text("half")
    p.fail = set()
    res = collect.collect([collect.Source(p.url, TOKEN)], tmp_path, retries=0)
    assert res[0].ok and res[0].fetched == periods[1:] and res[0].present == 1
    assert not list(tmp_path.rglob("*.tmp"))
    assert records.complete_periods(tmp_path, p.probe) == periods


def test_token_required(tmp_path, probes):
    res = collect.collect(
        [collect.Source(probes[0].url, None)], tmp_path, retries=2, sleep=lambda _: None
    )
    assert "401" in res[0].error and res[0].attempts == 1  # no retry on a wrong token


def test_down_probe_retried_and_reported(tmp_path, probes, capsys):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens there now
    tf = tmp_path / "token"
    tf.write_text(TOKEN + "\n")
    code = main(
        [
            "collect",
            "-d",
            str(tmp_path / "ds"),
            "--token-file",
            str(tf),
            "--probe",
            dead,
            "--probe",
            probes[0].url,
            "--retries",
            "2",
            "--retry-wait",
            "0.01",
            "--format",
            "json",
        ]
    )
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 1
    down = next(r for r in rows if r["url"] == dead)
    assert down["status"].startswith("DOWN") and down["requests"] == 3
    # the operating system's reason, not urllib3's repr of nested exceptions
    assert down["status"].endswith("(Connection refused)"), down["status"]
    up = next(r for r in rows if r["url"] == probes[0].url)
    assert up["status"] == "ok" and up["fetched"] == 3
    assert f"probe {dead} failed" in err


def test_down_reason_is_short_and_says_what_happened():
    """Each way a GET gets no answer is named in a few words, none as an empty class name."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]

    def hang_up() -> None:  # accept, read the request, close without an answer
        c, _ = srv.accept()
        c.recv(4096)
        c.close()

    threading.Thread(target=hang_up, daemon=True).start()
    reasons = {}
    for name, url in (("hung up", f"http://127.0.0.1:{port}/"), ("scheme", "nope://x/")):
        try:
            requests.get(url, timeout=5)
        except requests.RequestException as e:
            reasons[name] = collect._why(e)
    srv.close()
    assert reasons["hung up"] == "Remote end closed connection without response", reasons
    assert reasons["scheme"].startswith("InvalidSchema: No connection adapters"), reasons


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    def norm(df: pd.DataFrame) -> pd.DataFrame:
        return df.sort_values(list(df.columns)).reset_index(drop=True)

    pd.testing.assert_frame_equal(norm(a), norm(b))


def test_collect_to_s3_then_metrics_on_both_engines(
    s3, source, probes, lab6, lab6_clusters, cons, capsys
):
    url = f"{s3}/collect"
    srcs = [collect.Source(p.url, TOKEN) for p in probes]
    res = collect.collect(srcs, url, retries=0, parallel=3)
    assert all(r.ok for r in res), [r.error for r in res]
    assert sum(len(r.fetched) for r in res) == 3 * len(probes)
    root = storage.Root(url)
    assert len([f for f in root.files("counters") if f.endswith("part-0.parquet")]) == 3 * len(
        probes
    )
    assert records.probes(url) == records.probes(source)
    # idempotent on S3 too: one listing per probe, nothing fetched again
    res = collect.collect(srcs, url, retries=0)
    assert [len(r.fetched) for r in res] == [0] * len(probes)
    assert [r.present for r in res] == [3] * len(probes)

    # the local answers once, on DuckDB: both engines' answers from S3 must equal them
    local = Run(cons("duckdb"), source, lab6, lab6_clusters)
    want = {m: getattr(local, m)() for m in ("loss", "delay", "paths", "missing")}
    for eng in ("duckdb", "spark"):
        remote = Run(cons(eng), url, lab6, lab6_clusters)
        for m, df in want.items():
            _same(getattr(remote, m)(), df)

    # the command line reads it on DuckDB (the default engine) with the local answer
    assert main(["loss", "-d", url, "-t", TOPO, "--format", "json"]) == 0
    remote = capsys.readouterr().out
    assert main(["loss", "-d", str(source), "-t", TOPO, "--format", "json"]) == 0
    assert remote == capsys.readouterr().out
    assert len(remote.splitlines()) > 3


def test_s3_bad_input(s3, probes, tmp_path, capsys):
    tf = tmp_path / "t"
    tf.write_text(TOKEN)
    args = ["--token-file", str(tf), "--probe", probes[0].url, "--format", "json"]
    assert main(["collect", "-d", "s3://fp-no-such-bucket/x", *args]) == 2
    err = capsys.readouterr().err
    assert "no bucket 'fp-no-such-bucket'" in err and "Traceback" not in err
    assert main(["collect", "-d", "s3:///x", *args]) == 2
    assert "want s3://BUCKET/PREFIX" in capsys.readouterr().err
    assert main(["loss", "-d", f"{s3}/nothing-here", "-t", TOPO]) == 2
    err = capsys.readouterr().err
    assert f"--data {s3}/nothing-here: cannot read it: no counters/" in err
    assert "Traceback" not in err
    # a store that does not answer is said so, not taken for a dataset without files
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        assert main(["loss", "-d", f"{s3}/ok", "-t", TOPO]) == 2
    err = capsys.readouterr().err
    assert "cannot read it" in err and "fps3" not in err and "No files found" not in err, err
    assert main(["collect", "-d", f"{s3}/ok", *args]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["status"] == "ok" and row["fetched"] == 3
