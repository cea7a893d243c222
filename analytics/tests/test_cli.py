"""The console script's commands end to end on a small synthetic dataset (DuckDB)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from flowplane_analytics.cli import main

DATA = Path(__file__).parent / "data"
TOPO = str(DATA / "lab6.yaml")


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    assert (
        main(
            [
                "synth",
                "-t",
                TOPO,
                "-d",
                str(root),
                "--periods",
                "2",
                "--packets",
                "400",
                "--lab-ifnames",
            ]
        )
        == 0
    )
    return root


def test_version(capsys):
    from flowplane_analytics import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"flowplane-analytics {__version__}\n"


def test_clusters_table_and_png(tmp_path, capsys):
    png = tmp_path / "g.png"
    assert (
        main(
            [
                "clusters",
                "-t",
                str(DATA / "rfc_example.yaml"),
                "--png",
                str(png),
                "--super",
                "C2+C3",
                "--format",
                "json",
            ]
        )
        == 0
    )
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["cluster"] for r in rows] == ["C1", "C2", "C3", "C4", "S1", "e2e"]
    assert rows[4]["inputs"] == "2 3 6" and rows[4]["outputs"] == "5 7"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_probe_hosts(capsys):
    """A lab's hosts are measurement points only with --probe-hosts: then each host link is a
    cluster of its own (the demo's lossy link r1 → h2 among them)."""
    demo = str(Path(__file__).parents[2] / "examples" / "demo.yaml")
    for args, want in (
        ([], ["C1", "C2", "e2e"]),
        (["--probe-hosts"], ["C1", "C2", "C3", "C4", "C5", "C6", "e2e"]),
    ):
        assert main(["clusters", "-t", demo, "--format", "json", *args]) == 0
        rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        assert [r["cluster"] for r in rows] == want
    assert any(r["inputs"] == "r1:eth1:out" and r["outputs"] == "h2:eth0:in" for r in rows)


def test_loss_formats(ds, tmp_path, capsys):
    assert main(["loss", "-d", str(ds), "-t", TOPO]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["period", "cluster", "in_points"]
    pq = tmp_path / "loss.parquet"
    assert main(["loss", "-d", str(ds), "-t", TOPO, "--format", "parquet", "-o", str(pq)]) == 0
    df = pd.read_parquet(pq)
    assert set(df.cluster) >= {"C1", "e2e"} and df.period.nunique() == 2


def test_delay_paths_report(ds, tmp_path, capsys):
    assert main(["delay", "-d", str(ds), "-t", TOPO, "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("period,cluster,pairs,collisions,matched")
    assert main(["paths", "-d", str(ds), "-t", TOPO, "--limit", "5"]) == 0
    assert "→" in capsys.readouterr().out
    html = tmp_path / "r.html"
    assert main(["report", "-d", str(ds), "-t", TOPO, "--html", str(html)]) == 0
    text = html.read_text()
    assert text.count("data:image/png;base64,") == 3 and "Loss per period" in text


def test_usage_errors(tmp_path, capsys):
    assert main(["loss", "-d", str(tmp_path), "-t", TOPO]) == 2
    assert "no counters" in capsys.readouterr().err
    assert main(["clusters", "-t", str(tmp_path / "nope.yaml")]) == 2
    with pytest.raises(SystemExit) as e:
        main(["loss"])
    assert e.value.code == 2


def test_dataset_without_samples(ds, tmp_path, capsys):
    import shutil

    shutil.copytree(ds / "counters", tmp_path / "counters")
    assert main(["delay", "-d", str(tmp_path), "-t", TOPO, "--format", "csv"]) == 0
    assert capsys.readouterr().out.strip().startswith("period,cluster")  # header, no rows
    assert main(["delay", "-d", str(tmp_path), "-t", TOPO, "--format", "json"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["loss", "-d", str(tmp_path), "-t", TOPO, "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) > 1


def test_json_numbers_stay_numbers(tmp_path):
    """Integer columns with a NULL (a period a point missed) and exact Decimal sums are JSON
    numbers, not strings."""
    import decimal
    import io
    import json

    import pandas as pd

    from flowplane_analytics.output import emit

    df = pd.DataFrame({"loss": [decimal.Decimal(5), None], "rate": [0.25, None], "n": [1, 2]})
    out = io.StringIO()
    emit(df, "json", stream=out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert rows == [{"loss": 5, "rate": 0.25, "n": 1}, {"loss": None, "rate": None, "n": 2}]


def test_clusters_in_numeric_order():
    """Printed tables list C2 before C10 within a period (engines order names as text), the
    super-clusters after; rows that tie keep their order."""
    import io

    import pandas as pd

    from flowplane_analytics.output import emit

    df = pd.DataFrame(
        {
            "period": [1, 1, 1, 1, 2, 2],
            "cluster": ["C1", "C10", "C2", "S1", "C10", "C9"],
            "point": ["a", "b", "c", "d", "e", "f"],
        }
    )
    out = io.StringIO()
    emit(df, "csv", stream=out)
    assert out.getvalue().split()[1:] == [
        "1,C1,a",
        "1,C2,c",
        "1,C10,b",
        "1,S1,d",
        "2,C9,f",
        "2,C10,e",
    ]


def test_compact(ds, tmp_path, capsys):
    """`compact` writes DATA/compact/; loss and delay read it by default and equal the
    partitioned records' answers; once a period is added it is stale and ignored, and so it is
    when a period is rotated out for another (as many files as before)."""
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(ds, root)
    want = {}
    for m in ("loss", "delay"):
        assert main([m, "-d", str(root), "-t", TOPO, "--format", "csv"]) == 0
        want[m] = capsys.readouterr().out
    assert main(["compact", "-d", str(root)]) == 0
    assert "compact: " in capsys.readouterr().err
    assert (root / "compact" / "samples").is_dir()
    for m in ("loss", "delay"):
        for layout in ("auto", "compact"):
            args = [m, "-d", str(root), "-t", TOPO, "--format", "csv", "--layout", layout]
            assert main(args) == 0
            assert capsys.readouterr().out == want[m]
    # a new period arrives: compact/ is stale, the partitioned records are read (and said so)
    assert (
        main(["synth", "-t", TOPO, "-d", str(tmp_path / "more"), "--periods", "3", "--lab-ifnames"])
        == 0
    )
    for d in (tmp_path / "more" / "counters").glob("probe=*/period=*"):
        if not (root / "counters" / d.parent.name / d.name).exists():
            shutil.copytree(d, root / "counters" / d.parent.name / d.name)
    capsys.readouterr()
    assert main(["loss", "-d", str(root), "-t", TOPO, "--format", "csv"]) == 0
    cap = capsys.readouterr()
    assert "stale" in cap.err and cap.out != want["loss"]
    # rotation: one probe's oldest period goes, a later one comes; the count is unchanged
    assert main(["compact", "-d", str(root)]) == 0
    assert main(["loss", "-d", str(root), "-t", TOPO, "--format", "csv"]) == 0
    before = capsys.readouterr()
    assert "stale" not in before.err
    probe = sorted((root / "counters").glob("probe=*"))[0]
    periods = sorted(probe.glob("period=*"), key=lambda d: int(d.name.removeprefix("period=")))
    last = int(periods[-1].name.removeprefix("period="))
    periods[0].rename(probe / f"period={last + 1}")
    assert main(["loss", "-d", str(root), "-t", TOPO, "--format", "csv"]) == 0
    cap = capsys.readouterr()
    assert "stale" in cap.err and cap.out != before.out


def test_positional_topology_is_deprecated(capsys):
    """clusters TOPOLOGY and synth TOPOLOGY (earlier releases) still work, with one notice on
    stderr and the same output as --topology; both at once, or neither, exit 2."""
    t = str(DATA / "rfc_example.yaml")
    assert main(["clusters", "-t", t, "--format", "csv"]) == 0
    want = capsys.readouterr()
    assert want.err == ""
    assert main(["clusters", t, "--format", "csv"]) == 0
    got = capsys.readouterr()
    assert got.out == want.out
    assert got.err == (
        'flowplane-analytics: "clusters TOPOLOGY" is deprecated; '
        'use "clusters --topology TOPOLOGY"\n'
    )
    assert main(["clusters", t, "-t", t]) == 2
    assert "give the topology once" in capsys.readouterr().err
    for cmd in (["clusters"], ["synth", "-d", "X"]):
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert "the following arguments are required: --topology/-t" in err, err
