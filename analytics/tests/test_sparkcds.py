"""How Spark's JVMs start: the class-data-sharing archive (sparkcds), recorded once by a real
driver JVM and renamed into place whole, mapped by the next driver, ignored without a word when
unusable; and C1-only compilation for a small dataset (engine.C1_MAX_BYTES)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from flowplane_analytics import engine, sparkcds

# A session, one query, and whether the driver JVM maps the archive (its /proc maps name it).
SESSION = """
from pathlib import Path
from flowplane_analytics import engine, sparkcds
s = engine.spark_session(master="local[1]")
archive = sparkcds.archive_path(engine.check_java())
maps = Path(f"/proc/{s.sparkContext._gateway.proc.pid}/maps").read_text()
print(s.range(10).count(), str(archive) in maps)
"""


def _session(cache: Path) -> tuple[str, str]:
    env = {**os.environ, sparkcds.ENV: str(cache)}
    r = subprocess.run(
        [sys.executable, "-c", SESSION], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip(), r.stderr


def test_recorded_once_then_mapped(tmp_path, monkeypatch):
    out, err = _session(tmp_path)
    assert out == "10 False"  # the first session records, and says so as it writes
    (archive,) = tmp_path.glob("*.jsa")
    saving = f"saving Spark's class archive for faster starts (once per install): {archive}\n"
    assert f"flowplane-analytics: {saving}" in err
    assert not list(tmp_path.glob("*.tmp"))
    # the note beside it names the install's jars
    jars = Path(pyspark.__file__).parent / "jars"
    note = json.loads(archive.with_suffix(".jars").read_text())
    assert note == {"jars": str(jars), "jars_mtime_ns": jars.stat().st_mtime_ns}
    assert archive.read_bytes()[:4] == bytes.fromhex("a8ab0bf0")  # a dynamic CDS archive's magic
    for text in (out, err):
        assert "cds" not in text and "[warning]" not in text
    out, err = _session(tmp_path)
    assert out == "10 True"  # the next maps it
    # Nothing on stderr but the JVM's own line about Spark's incubator module: no CDS message,
    # and Spark's logging, off, prints no log level hint either.
    assert [x for x in err.splitlines() if "incubator modules" not in x] == [], err
    # Damaged: a JVM given the session's options runs without it, silently.
    archive.chmod(0o644)
    archive.write_bytes(b"not an archive" * 1000)
    monkeypatch.setenv(sparkcds.ENV, str(tmp_path))
    opts = sparkcds.plan(engine.check_java(), "local[*]").driver
    assert f"-XX:SharedArchiveFile={archive}" in opts
    r = subprocess.run(
        [engine.check_java(), *opts.split(), "-version"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "version" in r.stderr
    assert "cds" not in r.stdout + r.stderr and "[warning]" not in r.stdout + r.stderr


def test_plan(tmp_path, monkeypatch):
    java = engine.check_java()
    monkeypatch.setenv(sparkcds.ENV, "off")
    assert sparkcds.plan(java, "local[*]") == sparkcds.Plan("", "", None, None)

    monkeypatch.setenv(sparkcds.ENV, str(tmp_path / "a cache"))  # Spark splits on blanks
    assert sparkcds.plan(java, "local[*]") == sparkcds.Plan("", "", None, None)

    monkeypatch.setenv(sparkcds.ENV, str(tmp_path / "cache"))
    p = sparkcds.plan(java, "local[*]")
    assert p.recording is not None and p.archive is not None
    assert p.recording.exists()  # the marker other sessions see
    assert f"-XX:ArchiveClassesAtExit={p.recording}" in p.driver and p.executor == ""
    # Meanwhile, a second session neither records nor maps.
    assert sparkcds.plan(java, "local[*]") == sparkcds.Plan("", "", None, p.archive)
    # A dead recorder's file is removed, and this session records.
    dead = p.recording.with_name(f"{p.archive.name}.999999999.tmp")
    p.recording.rename(dead)
    assert sparkcds.plan(java, "local[*]").recording == p.recording
    assert not dead.exists()

    p.recording.unlink()
    p.archive.write_bytes(b"x")
    use = f"-XX:SharedArchiveFile={p.archive}"
    for master, executors in [
        ("local[*]", False),
        ("spark://127.0.0.1:7077", True),  # a cluster on this machine (cluster up)
        ("spark://localhost:7077", True),
        ("spark://198.18.0.1:7077", False),  # its workers may not have the file
        ("yarn", False),
    ]:
        q = sparkcds.plan(java, master)
        assert use in q.driver and q.recording is None
        assert (use in q.executor) == executors, master


def test_publish_prunes(tmp_path, monkeypatch):
    """A new archive removes those of installs that are gone (their jars directory deleted, or
    changed since: a reinstall) and keeps the KEEP − 1 most recently used others, which a
    mapping session marks; another Java's archive of the same install is such an other. Notes
    without an archive and dead recorders' files go, a live recorder's stays."""
    cache, live_jars, new_jars = tmp_path / "cache", tmp_path / "venv-jars", tmp_path / "new-jars"
    for d in (cache, live_jars, new_jars):
        d.mkdir()

    def archive(i: int, jars: Path | None, mtime: int | None = None) -> Path:
        f = cache / f"spark-4.0.5-{i:016x}.jsa"
        f.write_bytes(b"x")
        if jars is not None:
            m = jars.stat().st_mtime_ns if mtime is None else mtime
            f.with_suffix(".jars").write_text(json.dumps({"jars": str(jars), "jars_mtime_ns": m}))
        os.utime(f, ns=(i * 10**9, i * 10**9))
        return f

    gone = archive(9, tmp_path / "deleted-venv", 1)  # newest, but its install is gone
    reinstalled = archive(8, new_jars, 1)  # the same directory, changed since
    other_java = archive(7, new_jars)  # the same install, unchanged: another Java's
    live = [archive(i, live_jars) for i in (1, 2, 3)]
    unnoted = archive(4, None)  # recorded before notes existed
    monkeypatch.setenv(sparkcds.ENV, str(cache))
    java = engine.check_java()
    mapped = sparkcds.archive_path(java)
    assert mapped is not None
    mapped.write_bytes(b"x")
    os.utime(mapped, ns=(0, 0))
    assert sparkcds.plan(java, "local[*]").archive == mapped  # maps it: now the newest
    (cache / "spark-4.0.5-00000000000000aa.jars").write_text("{}")  # no archive
    dead = cache / f"{live[0].name}.999999999.tmp"
    running = cache / f"{live[1].name}.{os.getpid()}.tmp"
    dead.touch()
    running.touch()
    recording = tmp_path / "new.jsa.tmp"
    recording.write_bytes(b"y")
    new = cache / "spark-4.0.5-ffffffffffffffff.jsa"
    sparkcds.publish(recording, new, new_jars)
    assert new.read_bytes() == b"y"
    assert json.loads(new.with_suffix(".jars").read_text())["jars"] == str(new_jars)
    assert sparkcds.KEEP == 3
    kept = {new, new.with_suffix(".jars"), mapped, other_java, other_java.with_suffix(".jars")}
    assert set(cache.iterdir()) == kept | {running}
    assert not {gone, reinstalled, unnoted, *live} & set(cache.iterdir())


# A session for a dataset (argv[1]), with C1_MAX_BYTES = argv[2]: is the driver's JVM C1-only?
SIZED = """
import sys
from flowplane_analytics import engine
engine.C1_MAX_BYTES = int(sys.argv[2])
src = engine.locate(sys.argv[1], "raw")
s = engine.connect(engine.Options(engine="spark", master="local[1]"), src)._session
mx = s.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print("-XX:TieredStopAtLevel=1" in list(mx.getInputArguments()))
"""


def test_small_input_compiles_with_c1(truth_dataset):
    root, _ = truth_dataset
    size = engine.locate(root, "raw").size
    env = {**os.environ, sparkcds.ENV: "off"}
    for limit, c1 in ((size + 1, True), (size, False)):  # C1 strictly below the limit
        r = subprocess.run(
            [sys.executable, "-c", SIZED, str(root), str(limit)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [str(c1)], (limit, r.stdout)


def test_source_size_decides_c1(truth_dataset, monkeypatch):
    """Source.size counts the files a source reads; connect asks for C1 only for a local one
    under the limit (the session itself stubbed: no JVM)."""
    root, _ = truth_dataset
    full = engine.locate(root, "raw")
    one = sorted(full.files())[0]
    assert full.size == sum(f.stat().st_size for f in full.files()) > one.stat().st_size
    assert engine.Source(str(root), "raw", counters=[str(one)], samples=[]).size == (
        one.stat().st_size
    )  # skipped files left out
    assert engine.Source("s3://bucket/data", "raw").size is None
    asked = []

    class Stop(Exception):
        pass

    def session(*args):
        asked.append(args[-1])
        raise Stop

    monkeypatch.setattr(engine, "spark_session", session)
    monkeypatch.setattr(engine, "C1_MAX_BYTES", full.size + 1)
    for src in (full, None, engine.Source("s3://bucket/data", "raw")):
        with contextlib.suppress(Stop):
            engine.connect(engine.Options(engine="spark"), src)
    monkeypatch.setattr(engine, "C1_MAX_BYTES", full.size)
    with contextlib.suppress(Stop):
        engine.connect(engine.Options(engine="spark"), full)
    assert asked == [True, False, False, False]


def test_starts_where_the_host_name_does_not_resolve(tmp_path):
    """A machine whose own host name is in no /etc/hosts (a minimal container or chroot): the
    JVM's InetAddress.getLocalHost fails, and Spark with it, unless told to use the loopback
    (engine.jvm_environment). A UTS namespace of the test's own gives it such a name (root)."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("a UTS namespace needs root")
        pytest.skip("a UTS namespace needs root")
    script = (
        f"hostname fpnohost-{os.getpid()} && "
        f"exec {sys.executable} -c 'from flowplane_analytics import engine; "
        'print(engine.spark_session(master="local[1]").range(3).count())\''
    )
    # AWS keys in the environment too: Spark looks the host name up to say where they came from
    env = {
        **os.environ,
        sparkcds.ENV: str(tmp_path),
        "AWS_ACCESS_KEY_ID": "fp",
        "AWS_SECRET_ACCESS_KEY": "fp",
    }
    env.pop("SPARK_LOCAL_IP", None)
    env.pop("SPARK_LOCAL_HOSTNAME", None)
    r = subprocess.run(
        ["unshare", "--uts", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and r.stdout.strip() == "3", r.stderr
