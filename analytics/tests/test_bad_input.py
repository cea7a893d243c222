"""Bad input gets a clear error (exit 2, one message naming the file or flag), never a Python
traceback or a Java stack; --skip-bad-files reads a bad record file's probe period as absent."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ENGINES, Run

from flowplane_analytics import clusters, engine, metrics, synth, topology
from flowplane_analytics.cli import main

DATA = Path(__file__).parent / "data"
TOPO = str(DATA / "lab6.yaml")
REPO = Path(__file__).parents[2]
SHAPE_CASES = REPO / "internal" / "topo" / "testdata" / "shape_cases.yaml"
NOT_PARQUET = "not a Parquet file (truncated or corrupt)"


def run(args, capsys):
    """main(args) in this process: (exit code, stdout, stderr); argparse's exit included."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def run_process(args, env=None):
    """`python -m flowplane_analytics args` in a child process: (code, stdout, stderr)."""
    p = subprocess.run(
        [sys.executable, "-m", "flowplane_analytics", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return p.returncode, p.stdout, p.stderr


def clean(err: str) -> None:
    assert "Traceback" not in err and "Exception in thread" not in err, err
    assert "\tat org.apache" not in err and "py4j" not in err.lower(), err


def bad_input(code, err, *names):
    """Exit 2, every name in the message, nothing but messages on stderr."""
    assert code == 2, err
    clean(err)
    for n in names:
        assert str(n) in err, (n, err)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    """A small lab6 dataset: 3 periods, lab interface names."""
    root = tmp_path_factory.mktemp("bad-input") / "ds"
    spec = synth.Spec(periods=3, packets=300, hash_bits=3, seed=3, ifname_style="lab")
    synth.generate(topology.load(TOPO), spec, root)
    return root


def copy(ds, tmp_path, name="d") -> Path:
    d = tmp_path / name
    shutil.copytree(ds, d)
    return d


def record(root: Path, table: str, probe: str, i: int) -> Path:
    """The file of the i-th period of probe."""
    return sorted((root / table / f"probe={probe}").glob("period=*/part-0.parquet"))[i]


def truncate(f: Path, keep: int = 200) -> None:
    f.write_bytes(f.read_bytes()[:keep])


# --- record files ------------------------------------------------------------------------


def test_truncated_counters_file(ds, tmp_path, capsys):
    root = copy(ds, tmp_path)
    f = record(root, "counters", "r3", 1)
    truncate(f)
    for cmd in ("loss", "delay", "paths"):
        code, out, err = run([cmd, "-d", root, "-t", TOPO], capsys)
        bad_input(code, err, f, NOT_PARQUET, "--skip-bad-files")
        assert out == "" and len(err.splitlines()) == 1
    code, _, err = run(["compact", "-d", root], capsys)
    bad_input(code, err, f, NOT_PARQUET)
    assert not (root / "compact").exists()


def test_truncated_file_real_process_and_spark(ds, tmp_path):
    """The same with the console script's process, and on Spark: the files are checked before
    any engine starts, so Spark says the same and no JVM runs."""
    root = copy(ds, tmp_path)
    f = record(root, "samples", "r2", 0)
    f.write_bytes(b"")
    for extra in ([], ["--engine", "spark"]):
        code, _, err = run_process(["delay", "-d", root, "-t", TOPO, *extra])
        bad_input(code, err, f, "empty file", "--skip-bad-files")
        assert err.startswith("flowplane-analytics: ") and len(err.splitlines()) == 1


def test_skip_bad_files_reads_the_period_as_absent(ds, tmp_path, capsys):
    """--skip-bad-files: the bad file's probe period is left out (counters and samples), so the
    answer is exactly that of the dataset without that period of that probe: missing points
    with the missing_points alarm."""
    root = copy(ds, tmp_path, "bad")
    f = record(root, "counters", "r3", 1)
    truncate(f)
    absent = copy(ds, tmp_path, "absent")
    shutil.rmtree(record(absent, "counters", "r3", 1).parent)
    shutil.rmtree(record(absent, "samples", "r3", 1).parent)
    for cmd in ("loss", "delay"):
        code, out, err = run(
            [cmd, "-d", root, "-t", TOPO, "--format", "csv", "--skip-bad-files"], capsys
        )
        assert code == 0, err
        clean(err)
        assert f"skipped {f}: {NOT_PARQUET}" in err and "probe r3's period" in err
        code, want, _ = run([cmd, "-d", absent, "-t", TOPO, "--format", "csv"], capsys)
        assert code == 0 and out == want
        if cmd == "loss":  # (delay: r3's clusters have no pairs that period, so no row)
            df = pd.read_csv(io.StringIO(out))
            period = int(f.parent.name.removeprefix("period="))
            assert (df[df.period == period].alarm == "missing_points").any()
            assert (df[df.period != period].alarm.fillna("") == "").all()
    code, _, err = run(
        ["loss", "-d", root, "-t", TOPO, "--skip-bad-files", "--fail-on-alarm"], capsys
    )
    assert code == 3 and "no counters for" in err and "r3:" in err


def test_bad_samples_file_drops_its_probe_period(ds, tmp_path, capsys):
    """A bad samples file: its probe's whole period is left out (delay is never computed from
    fewer samples in silence): loss flags its points as missing too."""
    root = copy(ds, tmp_path)
    f = record(root, "samples", "r4", 2)
    truncate(f, 10)
    code, out, err = run(
        ["loss", "-d", root, "-t", TOPO, "--format", "csv", "--skip-bad-files"], capsys
    )
    assert code == 0 and f"skipped {f}" in err
    assert "missing_points" in out and "ALARM: period" in err and "point r4:" in err


def test_skip_bad_files_on_spark(ds, tmp_path, capsys, cons):
    """Spark reads the same subset of files as DuckDB (one Spark case: it starts a JVM), and
    prints the same text: loss's and delay's NULL counts and statistics too."""
    cons("spark")  # the session the other tests use, started once
    root = copy(ds, tmp_path)
    truncate(record(root, "counters", "r5", 0))
    for m in ("loss", "delay"):
        got = {}
        for eng in ENGINES:
            args = [m, "-d", root, "-t", TOPO, "--format", "csv", "--skip-bad-files"]
            code, out, err = run([*args, "--engine", eng], capsys)
            assert code == 0, err
            clean(err)
            got[eng] = out
        assert got["duckdb"] == got["spark"], m
        assert ",missing_points" in got["duckdb"] and ",,," in got["duckdb"]


def test_corrupt_pages_behind_a_good_footer(ds, tmp_path, capsys):
    """A file whose footer reads but whose pages do not: the engine fails, the files are then
    read through to name it; --skip-bad-files leaves it out and runs again."""
    root = copy(ds, tmp_path)
    f = record(root, "samples", "r3", 0)
    data = bytearray(f.read_bytes())
    data[8:300] = b"\xab" * 292
    f.write_bytes(bytes(data))
    code, _, err = run(["delay", "-d", root, "-t", TOPO], capsys)
    bad_input(code, err, f, "corrupt Parquet data")
    code, _, err = run(["delay", "-d", root, "-t", TOPO, "--skip-bad-files"], capsys)
    assert code == 0 and f"skipped {f}: corrupt Parquet data" in err
    clean(err)


def test_wrong_table_and_bad_period_directory(ds, tmp_path, capsys):
    root = copy(ds, tmp_path)
    f = record(root, "counters", "r1", 0)
    shutil.copy(record(root, "samples", "r1", 0), f)  # a samples file where counters belong
    code, _, err = run(["loss", "-d", root, "-t", TOPO], capsys)
    bad_input(code, err, f, "no column packets")
    root = copy(ds, tmp_path, "e")
    d = record(root, "counters", "r1", 0).parent
    d.rename(d.with_name("period=abc"))
    code, _, err = run(["loss", "-d", root, "-t", TOPO], capsys)
    bad_input(code, err, "period=abc is not a period number")
    # a copy under a name the reader takes for the same period would count it twice
    root = copy(ds, tmp_path, "z")
    d = record(root, "counters", "r1", 0).parent
    shutil.copytree(d, d.with_name("period=00"))
    code, _, err = run(["loss", "-d", root, "-t", TOPO], capsys)
    bad_input(code, err, "period=00 is not a probe's name for it (period=0)")


@pytest.mark.parametrize(
    ("table", "column", "to", "shown"),
    [
        ("counters", "packets", "string", "packets is string"),
        ("counters", "packets", "double", "packets is double"),
        ("samples", "tai_ns", "string", "tai_ns is string"),
        ("samples", "hash", "double", "hash is double"),
        ("samples", "src_port", "string", "src_port is string"),
    ],
)
def test_column_of_the_wrong_type(ds, tmp_path, capsys, table, column, to, shown):
    """A record file whose column holds the wrong type (text for a count, a float for an
    integer) is named, exit 2, on every metric; --skip-bad-files leaves its probe's period out."""
    import pyarrow.parquet as pq

    root = copy(ds, tmp_path)
    f = record(root, table, "r1", 0)
    t = pq.read_table(f)
    i = t.schema.get_field_index(column)
    pq.write_table(t.set_column(i, column, t[column].cast(to)), f)
    for m in ("loss", "delay", "paths"):
        code, _, err = run([m, "-d", root, "-t", TOPO], capsys)
        bad_input(code, err, f, f"column {shown} (want ", f"not usable as a {table} record")
    code, out, err = run(["loss", "-d", root, "-t", TOPO, "--skip-bad-files"], capsys)
    assert code == 0 and f"skipped {f}: column {shown}" in err and "missing_points" in out
    clean(err)


def test_period_no_probe_recorded(ds, tmp_path, capsys):
    """A period between the first and the last that no probe recorded (every probe down, or
    the collection) has no row to carry an alarm: loss names it on stderr, --fail-on-alarm
    exits 3, and the report counts it."""
    root = copy(ds, tmp_path)
    middle = record(root, "counters", "r1", 1).parent.name
    for d in root.glob(f"*/probe=*/{middle}"):
        shutil.rmtree(d)
    period = int(middle.removeprefix("period="))
    code, out, err = run(["loss", "-d", root, "-t", TOPO, "--format", "csv"], capsys)
    assert code == 0 and f"ALARM: period {period}: no probe recorded it" in err
    assert f"\n{period}," not in out
    clean(err)
    code, _, err = run(["loss", "-d", root, "-t", TOPO, "--fail-on-alarm"], capsys)
    assert code == 3, err
    html = tmp_path / "r.html"
    assert run(["report", "-d", root, "-t", TOPO, "--html", html], capsys)[0] == 0
    assert f"period {period}: no probe recorded it" in html.read_text()


def test_points_the_topology_does_not_name(ds, tmp_path, capsys):
    """Records of a probe whose probe_id the topology does not know (a typo: r6 recorded as
    r6x) are named on stderr, and the probe's points are missing from the metrics."""
    root = copy(ds, tmp_path)
    for t in ("counters", "samples"):
        (root / t / "probe=r6").rename(root / t / "probe=r6x")
    code, _, err = run(["loss", "-d", root, "-t", TOPO, "--format", "csv"], capsys)
    assert code == 0, err
    clean(err)
    assert "no point of the topology names: r6x:" in err, err
    assert "check the probes' probe_id and interface names" in err
    assert "missing points" in err
    code, _, err = run(["loss", "-d", ds, "-t", TOPO, "--format", "csv"], capsys)
    assert code == 0 and "no point of the topology names" not in err, err


def test_two_period_lengths(ds, tmp_path, capsys):
    """Records of two measurements in one directory (another period length at one probe): the
    period numbers cannot be compared, so every metric and compact refuse them, naming both
    lengths and their probes, instead of reporting absurd gaps."""
    import pyarrow.parquet as pq

    root = copy(ds, tmp_path)
    for f in (root / "counters" / "probe=r6").glob("period=*/part-0.parquet"):
        t = pq.read_table(f)
        col = t.schema.get_field_index("period_ns")
        t = t.set_column(col, "period_ns", [[500_000_000] * t.num_rows])
        pq.write_table(t, f)
    for cmd in (["loss", "-t", TOPO], ["delay", "-t", TOPO], ["compact"]):
        code, _, err = run([*cmd, "-d", root], capsys)
        bad_input(code, err, root, "2 period lengths: 500ms (probe r6); 1s (probes r1, r2, r3")
        assert "a metric needs one" in err


def test_several_bad_files(ds, tmp_path, capsys):
    root = copy(ds, tmp_path)
    files = [record(root, "counters", p, 0) for p in ("r1", "r2", "r6")]
    for f in files:
        truncate(f)
    code, _, err = run(["loss", "-d", root, "-t", TOPO], capsys)
    bad_input(code, err, *files, "3 bad record files: remove them or pass --skip-bad-files")


def test_corrupt_compact_file(ds, tmp_path, capsys):
    root = copy(ds, tmp_path)
    assert run(["compact", "-d", root], capsys)[0] == 0
    f = sorted((root / "compact" / "samples").glob("*/*.parquet"))[0]
    truncate(f)
    for layout in ("auto", "compact"):
        code, _, err = run(["delay", "-d", root, "-t", TOPO, "--layout", layout], capsys)
        bad_input(code, err, f, NOT_PARQUET, "rerun `flowplane-analytics compact")
    # auto layout with --skip-bad-files: the compacted copy is not used, the records are
    code, out, err = run(["delay", "-d", root, "-t", TOPO, "--skip-bad-files"], capsys)
    assert code == 0 and "reading the partitioned records" in err
    code, want, _ = run(["delay", "-d", root, "-t", TOPO, "--layout", "raw"], capsys)
    assert out == want


def test_compact_with_skipped_files(ds, tmp_path, capsys):
    root = copy(ds, tmp_path)
    f = record(root, "counters", "r2", 2)
    truncate(f)
    code, _, err = run(["compact", "-d", root, "--skip-bad-files"], capsys)
    assert code == 0 and f"skipped {f}" in err
    # read without the flag, the copy says it was built without the file
    code, _, err = run(["loss", "-d", root, "-t", TOPO], capsys)
    bad_input(
        code, err, root / "compact", "built leaving out 1 bad record file", "--skip-bad-files"
    )
    code, out, err = run(
        ["loss", "-d", root, "-t", TOPO, "--format", "csv", "--skip-bad-files"], capsys
    )
    assert code == 0 and "left out when `compact` ran" in err and "missing_points" in out


def test_jsonl_is_not_read(ds, tmp_path, capsys):
    """jsonl/ holds the API's answers as collected; no command reads it, so a corrupt one
    changes nothing."""
    root = copy(ds, tmp_path)
    (root / "jsonl" / "r1").mkdir(parents=True)
    (root / "jsonl" / "r1" / "1.jsonl").write_text('{"probe": "r1", "peri')
    code, _, err = run(["loss", "-d", root, "-t", TOPO], capsys)
    assert code == 0, err


def test_dataset_directory(ds, tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    (tmp_path / "empty").mkdir()
    for cmd in ("loss", "delay", "paths", "compact"):
        topo = [] if cmd == "compact" else ["-t", TOPO]
        code, _, err = run([cmd, "-d", tmp_path / "nope", *topo], capsys)
        bad_input(code, err, tmp_path / "nope", "no such directory")
        code, _, err = run([cmd, "-d", a_file, *topo], capsys)
        bad_input(code, err, a_file, "not a directory")
        code, _, err = run([cmd, "-d", tmp_path / "empty", *topo], capsys)
        bad_input(code, err, tmp_path / "empty", "no counters/")
    code, _, err = run(
        ["report", "-d", tmp_path / "nope", "-t", TOPO, "--html", tmp_path / "r.html"], capsys
    )
    bad_input(code, err, "no such directory")
    code, _, err = run(["loss", "-d", ds, "-t", TOPO, "--layout", "compact"], capsys)
    bad_input(code, err, "no compacted copy", "compact --data")
    code, _, err = run(["loss", "-d", "hdfs://nn:8020/am", "-t", TOPO], capsys)
    bad_input(code, err, "hdfs://nn:8020/am", "--engine spark")


# --- topologies ------------------------------------------------------------------------------


def _shape_cases():
    return yaml.safe_load(SHAPE_CASES.read_text())


@pytest.mark.parametrize("case", _shape_cases(), ids=lambda c: c["name"])
def test_lab_topology_like_go(case, tmp_path, monkeypatch):
    """internal/topo/testdata/shape_cases.yaml: the analytics say exactly what Go says."""
    monkeypatch.chdir(tmp_path)
    Path("bad.yaml").write_text(case["yaml"])
    with pytest.raises(topology.TopologyError) as e:
        topology.load("bad.yaml")
    assert e.value.problems == case["want"]


def test_lab_topology_typos_exit_2(tmp_path, capsys):
    """What used to give an empty "successful" analysis: lnks:, an unknown link key, a kind
    routr. All three reported, even with --fail-on-alarm, before the data is looked at."""
    t = tmp_path / "bad.yaml"
    t.write_text(
        "name: lab\nnodes:\n  r1: {kind: routr}\n  r2: {kind: router}\n  h1: {}\n"
        "lnks:\n  - endpoints: [r1, h1]\nlinks:\n  - endpoints: [r1, r2]\n    bandwidth: 1gbit\n"
    )
    for cmd in (
        ["loss", "-d", tmp_path / "nodata", "-t", t, "--fail-on-alarm"],
        ["clusters", "-t", t],
    ):
        code, out, err = run(cmd, capsys)
        bad_input(
            code,
            err,
            f'{t}:3: nodes.r1.kind: unknown kind "routr"; use host or router',
            f'{t}:6: lnks: unknown key "lnks"; known keys here: links, name, nodes',
            f'{t}:10: links[0].bandwidth: unknown key "bandwidth"; known keys here: corrupt, ',
        )
        assert out == "" and len(err.splitlines()) == 3


def test_schema_is_package_data():
    from flowplane_analytics import topocheck

    sc = topocheck.schema()
    assert sc["kinds"] == ["host", "router"] and "links" in sc["levels"]["top"]["keys"]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("nodes: {a: {}\n", ":2: not valid YAML: expected ',' or '}'"),
        ("", ": the file is empty; want a lab topology"),
        ("- a\n- b\n", ":1: the top level is not a mapping"),
        ("name: x\nlnks: [[a, b]]\n", ":1: neither nodes: nor links: (keys here: lnks, name)"),
        ("links:\n  - [a, b]\n  - {from: a, too: c}\n", ':3: links[1].too: unknown key "too"'),
        (
            "links:\n  - [a, b]\npoint: [a]\n",
            ':3: point: unknown key "point"; known keys here: links, name, points',
        ),
        ("links:\n  - [a, b, c]\n", ":2: links[0]: want [FROM, TO]"),
        ("links:\n  - [a, b]\n  - [a, a]\n", ":3: links[1]: a link from a to itself"),
        ("links:\n  - {from: b, to: b}\n", ":2: links[0]: a link from b to itself"),
        ("links:\n  - {from: a, from: a}\n", ":2: links[0].to: missing"),
        ("links: {a: b}\n", ":1: links: must be a list"),
        (
            "nodes: {h1: {}, h2: {}}\nlinks: [{endpoints: [h1, h2]}]\n",
            "no routers (hosts carry a probe only with --probe-hosts)",
        ),
    ],
)
def test_topology_files(text, want, tmp_path, capsys):
    t = tmp_path / "t.yaml"
    t.write_text(text)
    code, _, err = run(["clusters", "-t", t], capsys)
    bad_input(code, err, f"{t}{want}" if want.startswith(":") else want, t)


def test_topology_not_there_or_not_text(tmp_path, capsys):
    for path, want in (
        (tmp_path / "nope.yaml", "cannot read the topology: No such file or directory"),
        (tmp_path, "cannot read the topology: Is a directory"),
    ):
        code, _, err = run(["loss", "-d", tmp_path, "-t", path], capsys)
        bad_input(code, err, path, want)
    b = tmp_path / "b.yaml"
    b.write_bytes(b"\xff\xfe\x00nodes")
    bad_input(*run(["clusters", "-t", b], capsys)[::2], b, "not a text file")
    g = tmp_path / "g.graphml"
    g.write_text("<graphml><graph")
    bad_input(*run(["clusters", "-t", g], capsys)[::2], g, "not a GraphML file")
    g.write_text(
        '<graphml xmlns="http://graphml.graphdrawing.org/xmlns"><graph edgedefault="directed">'
        '<node id="a"/><node id="b"/><edge source="a"/></graph></graphml>'
    )
    bad_input(*run(["clusters", "-t", g], capsys)[::2], g, "give every edge a source and a target")
    g.write_text(
        '<graphml xmlns="http://graphml.graphdrawing.org/xmlns"><graph edgedefault="directed">'
        '<node id="a"/><edge source="a" target="a"/></graph></graphml>'
    )
    bad_input(*run(["clusters", "-t", g], capsys)[::2], g, "an edge from a to itself")


def test_synth_needs_a_lab(tmp_path, capsys):
    code, _, err = run(["synth", "-t", DATA / "rfc_example.yaml", "-d", tmp_path / "s"], capsys)
    bad_input(code, err, "rfc_example.yaml", "synth needs a lab topology")


# --- flags -------------------------------------------------------------------------------


def test_parquet_needs_output_before_any_work(tmp_path, capsys):
    nope = tmp_path / "nope"
    for cmd in (
        ["loss", "-d", nope, "-t", nope],
        ["delay", "-d", nope, "-t", nope],
        ["paths", "-d", nope, "-t", nope],
        ["clusters", "-t", nope],
        ["collect", "-d", nope, "-p", "http://127.0.0.1:1"],
    ):
        code, out, err = run([*cmd, "--format", "parquet"], capsys)
        bad_input(code, err, "--format parquet writes a file: add --output FILE")
        assert out == "" and not nope.exists()


SYNTH = ["synth", "-t", TOPO, "-d", "X"]  # a synth command line, its bad flag to follow


@pytest.mark.parametrize(
    ("args", "want"),
    [
        ([*SYNTH, "--periods", "-1"], "argument --periods: -1: want 1 or more"),
        ([*SYNTH, "--periods", "0"], "argument --periods: 0: want 1 or more"),
        ([*SYNTH, "--periods", "ten"], "--periods: 'ten' is not a whole number"),
        ([*SYNTH, "--packets", "-1"], "argument --packets: -1: want 0 or more"),
        ([*SYNTH, "--loss", "1.5"], "argument --loss: 1.5: want from 0 to 1"),
        ([*SYNTH, "--loss", "nan"], "argument --loss: nan: want from 0 to 1"),
        ([*SYNTH, "--hash-bits", "40"], "--hash-bits: 40: want 0 to 31"),
        ([*SYNTH, "--jitter-ns", "-5"], "--jitter-ns: -5: want 0 or more"),
        (["paths", "-d", "X", "-t", TOPO, "--limit", "-5"], "--limit: -5: want 0 or more"),
        (["loss", "-d", "X", "-t", TOPO, "--batch-periods", "-1"], "--batch-periods: -1: want 0"),
        (
            ["delay", "-d", "X", "-t", TOPO, "--threads", "0"],
            "argument --threads: 0: want 1 or more",
        ),
        (
            ["loss", "-d", "X", "-t", TOPO, "--engine", "spark", "--master", "spark:/h"],
            "--master: not a Spark master URL",
        ),
        (
            ["loss", "-d", "X", "-t", TOPO, "--engine", "spark", "--master", "local[0]"],
            "--master: not a Spark master URL",
        ),
        (["collect", "-d", "X", "-p", "h:1", "--retries", "-1"], "--retries: -1: want 0 or more"),
        (["collect", "-d", "X", "-p", "h:1", "--timeout", "0"], "--timeout: 0: want more than 0"),
        (
            ["collect", "-d", "X", "-p", "h:1", "--retry-wait", "-1"],
            "--retry-wait: -1: want 0 or more",
        ),
    ],
)
def test_bad_numbers(args, want, tmp_path, capsys):
    args = [str(tmp_path / "X") if a == "X" else a for a in args]
    code, _, err = run(args, capsys)
    bad_input(code, err, want)
    assert not (tmp_path / "X").exists()


def test_bad_settings(ds, tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    base = ["loss", "-d", ds, "-t", TOPO]
    for extra, want in (
        (
            ["--super", "C1+C99"],
            "--super C1+C99: no cluster C99 (the topology's clusters are C1 to C19",
        ),
        (["--super", "+"], "--super '+': name the clusters to join"),
        (["--memory-limit", "2XB"], "--memory-limit '2XB': not a memory size"),
        (["--temp-dir", a_file / "spill"], f"--temp-dir {a_file}/spill: cannot create it"),
        (["-o", tmp_path / "no" / "x.csv"], f"--output {tmp_path}/no/x.csv: no directory"),
        (["-o", tmp_path], f"--output {tmp_path}: is a directory"),
    ):
        code, out, err = run([*base, *extra], capsys)
        bad_input(code, err, want)
        assert out == ""
    code, _, err = run(
        ["report", "-d", ds, "-t", TOPO, "--html", tmp_path / "no" / "r.html"], capsys
    )
    bad_input(code, err, "--html", "no directory")
    code, _, err = run(["clusters", "-t", TOPO, "--png", tmp_path / "no" / "g.png"], capsys)
    bad_input(code, err, "--png", "no directory")


def test_out_of_memory(ds, capsys):
    """A --memory-limit too small for the query: one line saying so and what to change, exit
    1 (it failed while running), no "internal error"."""
    code, out, err = run(["delay", "-d", ds, "-t", TOPO, "--memory-limit", "1KB"], capsys)
    assert code == 1 and out == ""
    assert "DuckDB ran out of memory" in err and "give --temp-dir DIR" in err
    assert "internal error" not in err and "Traceback" not in err


def test_collect_and_synth_inputs(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for probe, want in (
        ("http://[::1", "--probe 'http://[::1': not a URL"),
        ("ftp://host:1", "want http://HOST:PORT"),
        ("http://h:1,tokn-file=x", "unknown option 'tokn-file'"),
        (f"http://h:1,token-file={tmp_path}/none", f"token file {tmp_path}/none: No such file"),
        ("198.18.0.1:9464", "'198.18.0.1:9464' has no scheme"),
        ("http://not a url", "--probe 'http://not a url': not a probe's URL"),
    ):
        code, _, err = run(["collect", "-d", tmp_path / "c", "-p", probe], capsys)
        bad_input(code, err, want)
    # a probe file names its line; the same probe twice (a trailing /, the default port) is
    # refused before anything is fetched
    pf = tmp_path / "probes.txt"
    for lines, want in (
        ("http://h:1\n# c\nnot a url\n", f"--probe-file {pf} line 3: 'not a url' has no scheme"),
        ("http://h:1\nhttp://H:1/\n", f"--probe-file {pf} line 2: the same probe as --probe-file"),
        ("http://h\nhttp://h:80\n", "line 2: the same probe as"),
    ):
        pf.write_text(lines)
        code, _, err = run(["collect", "-d", tmp_path / "c", "--probe-file", pf], capsys)
        bad_input(code, err, want)
    assert not (tmp_path / "c").exists()
    code, _, err = run(["collect", "-d", a_file, "-p", "http://127.0.0.1:1"], capsys)
    bad_input(code, err, a_file, "not a directory")
    code, _, err = run(
        ["collect", "-d", tmp_path, "-p", "h:1", "--token-file", tmp_path / "t"], capsys
    )
    bad_input(code, err, "--token-file", "No such file")
    code, _, err = run(["synth", "-t", TOPO, "-d", a_file], capsys)
    bad_input(code, err, a_file, "not a directory")
    # synth never writes into a dataset: the records there stay as they were
    d = tmp_path / "s"
    assert run(["synth", "-t", TOPO, "-d", d, "--periods", "2"], capsys)[0] == 0
    before = {f: f.read_bytes() for f in d.rglob("*") if f.is_file()}
    code, _, err = run(["synth", "-t", TOPO, "-d", d, "--periods", "3", "--seed", "9"], capsys)
    bad_input(code, err, d, "already holds records (counters, samples")
    assert {f: f.read_bytes() for f in d.rglob("*") if f.is_file()} == before


def test_spark_without_java(ds):
    """No JVM: exit 2 saying pyspark needs Java 17+ and how to install it (no JVM start)."""
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"} | {"PATH": "/nonexistent"}
    code, _, err = run_process(["loss", "-d", ds, "-t", TOPO, "--engine", "spark"], env)
    bad_input(code, err, "--engine spark", "Java 17", "openjdk-17-jre-headless")
    env["JAVA_HOME"] = "/nonexistent"
    code, _, err = run_process(["loss", "-d", ds, "-t", TOPO, "--engine", "spark"], env)
    bad_input(code, err, "JAVA_HOME=/nonexistent has no bin/java")


def test_spark_without_pyspark(ds, capsys, monkeypatch):
    """Installed without the [spark] extra: exit 2 with the pip command, before anything else."""
    from flowplane_analytics import engine

    real = engine.importlib.util.find_spec
    monkeypatch.setattr(
        engine.importlib.util, "find_spec", lambda n, *a: None if n == "pyspark" else real(n, *a)
    )
    monkeypatch.setattr(engine, "_spark_session", None)
    code, _, err = run(["loss", "-d", ds, "-t", TOPO, "--engine", "spark"], capsys)
    bad_input(code, err, "pip install 'flowplane-analytics[spark]'")


def test_internal_error_is_one_line(ds, capsys, monkeypatch):
    """An unexpected exception: one line and exit 1; the traceback only when asked for."""
    from flowplane_analytics import engine

    def boom(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(engine, "execute_by_periods", boom)
    code, _, err = run(["loss", "-d", ds, "-t", TOPO], capsys)
    assert code == 1 and err.splitlines() == [
        "flowplane-analytics: internal error: RuntimeError: boom (rerun with "
        "FLOWPLANE_ANALYTICS_DEBUG=1 for the traceback)"
    ]
    monkeypatch.setenv("FLOWPLANE_ANALYTICS_DEBUG", "1")
    code, _, err = run(["loss", "-d", ds, "-t", TOPO], capsys)
    assert code == 1 and "Traceback" in err and "RuntimeError: boom" in err


# --- the delay alarm ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def missing_dataset(tmp_path_factory, lab6):
    root = tmp_path_factory.mktemp("delay-alarm")
    spec = synth.Spec(
        periods=3,
        packets=400,
        hash_bits=2,
        seed=11,
        missing_points={(1, "r3:eth3:out")},
        missing_probes={(2, "r1")},
    )
    return root, synth.generate(lab6, spec, root)


@pytest.mark.parametrize("eng", ENGINES)
def test_delay_alarm_missing_points(eng, cons, missing_dataset, lab6):
    """A delay row is flagged missing_points exactly when loss flags its (period, cluster), and
    every such (period, cluster) has one, even with no pair: the delay then comes from the
    points that are there."""
    root, truth = missing_dataset
    cs = clusters.resolve(lab6)
    r = Run(cons(eng), root, lab6, cs)
    loss = r.loss().set_index(["period", "cluster"])["alarm"]
    dl = r.delay()
    assert list(dl.columns)[-1] == "alarm"
    want = [
        "missing_points" if loss[(p, c)] == "missing_points" else ""
        for p, c in zip(dl.period, dl.cluster, strict=True)
    ]
    assert list(dl.alarm) == want
    # and every (period, cluster) loss flags has its delay row, pairs or not
    lost = {k for k, a in loss.items() if a == "missing_points"}
    flagged = dl[dl.alarm == "missing_points"]
    assert set(zip(flagged.period, flagged.cluster, strict=True)) == lost
    assert set(flagged.period) == set(truth.periods[1:])
    assert (dl[dl.period == truth.periods[0]].alarm == "").all()
    # in queries of one period each (the first without a NULL, the later ones with): the same
    for name, want in (("loss", r.loss()), ("delay", dl)):
        f = getattr(metrics, name)
        got = engine.execute_by_periods(r.con, r.ds, lambda d, f=f: f(d, r.members, r.aliases), 1)
        k = ["period", "cluster"]
        pd.testing.assert_frame_equal(
            got.sort_values(k).reset_index(drop=True),
            want.sort_values(k).reset_index(drop=True),
            check_dtype=False,
        )
