"""A class-data-sharing archive for Spark's JVMs: the classes a Spark session loads, parsed and
verified once and then mapped from one file by every later JVM, which then starts sooner and
runs its first query sooner.

The first session on a machine (per Java and pyspark install) records the archive when its
driver JVM exits (``-XX:ArchiveClassesAtExit``, into a file named after the process, renamed
into place once the JVM has exited cleanly; sessions started meanwhile run without one rather
than record it too). Every later driver maps it (``-XX:SharedArchiveFile``), and so do the
executors of a cluster on this machine (a ``spark://`` master on a loopback address, as
``cluster up`` starts), whose classpath is the driver's. A JVM that cannot use the archive
(another Java, changed jars, a corrupt file) runs without it, silently.
``FLOWPLANE_SPARK_CDS=off`` turns it off; the archive lives in
``$XDG_CACHE_HOME/flowplane-analytics`` (default ``~/.cache/…``) unless
``FLOWPLANE_SPARK_CDS`` names another directory. Each install records its own archive, with
a note of its install beside it (``….jars``: the jars directory and its mtime); a new archive
removes those of installs that are gone (that directory missing or changed: a reinstall) and
keeps at most the KEEP − 1 most recently used others (a mapping session marks its archive
used).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

ENV = "FLOWPLANE_SPARK_CDS"
# CDS's own messages (classes it skips while recording, an archive it cannot use) stay off
# stdout, where a command's table goes.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# Archives of live installs kept in the directory: the one just recorded and the most recently
# used others.
KEEP = 3


@dataclass
class Plan:
    driver: str  # JVM options for the driver
    executor: str  # JVM options for executors on this machine ("" for any other master)
    recording: Path | None  # the file this driver's JVM writes at exit, renamed into `archive`
    archive: Path | None


def directory() -> Path | None:
    """Where archives live; None when FLOWPLANE_SPARK_CDS=off."""
    v = os.environ.get(ENV, "")
    if v.lower() in ("off", "0", "false", "no"):
        return None
    if v:
        return Path(v)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "flowplane-analytics"


def archive_path(java: str) -> Path | None:
    """The archive for this Java and this pyspark install: its name changes when either does (a
    reinstalled pyspark has new jars, which an archive of the old ones does not fit)."""
    d = directory()
    if d is None:
        return None
    import pyspark

    jars = _jars()
    real = os.path.realpath(java)
    key = f"{real}\0{os.stat(real).st_mtime_ns}\0{jars}\0{os.stat(jars).st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return d / f"spark-{pyspark.__version__}-{digest}.jsa"


def _jars() -> Path:
    """The pyspark install's jars: the classpath an archive fits."""
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def plan(java: str, master: str) -> Plan:
    """The JVM options for a session on `master`: map the archive if there is one, else record
    it (the driver only)."""
    try:
        archive = archive_path(java)
        if archive is not None:
            archive.parent.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # an unwritable cache, no home: run without an archive
        archive = None
    if archive is None or any(c.isspace() for c in str(archive)):  # Spark splits options
        return Plan("", "", None, None)
    if archive.is_file():
        with contextlib.suppress(OSError):
            os.utime(archive)  # used now: pruning keeps the most recently used
        use = f"-XX:SharedArchiveFile={archive} {_QUIET}"
        here = master.startswith("spark://") and urlparse(master).hostname in _LOOPBACK
        return Plan(use, use if here else "", None, archive)
    if _recording_elsewhere(archive):
        return Plan("", "", None, archive)  # one recording at a time; this run goes without
    recording = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    try:
        recording.touch()  # says "recording" to sessions that start before this one ends
    except OSError:
        return Plan("", "", None, None)
    return Plan(f"-XX:ArchiveClassesAtExit={recording} {_QUIET}", "", recording, archive)


def _recording_elsewhere(archive: Path) -> bool:
    """Whether a live process is recording `archive`; removes what dead ones left."""
    busy = False
    for f in archive.parent.glob(f"{archive.name}.*.tmp"):
        if _recorder_alive(f):
            busy = True
        else:
            _remove(f)
    return busy


def _recorder_alive(tmp: Path) -> bool:
    """Whether the process that names the recording ….jsa.<pid>.tmp still runs."""
    pid = tmp.name.rsplit(".", 2)[-2]
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


def finish_at_exit(p: Plan, jvm: subprocess.Popen[bytes] | None) -> None:
    """When this process exits, end the driver JVM (it exits when its stdin closes), wait for
    it to write the recording, and rename it into place: an archive is always whole."""
    if p.recording is None or p.archive is None or jvm is None:
        return
    recording, archive = p.recording, p.archive

    def finish() -> None:
        ok = False
        # The JVM takes seconds to write the archive: said, so that the wait is not a hang.
        with contextlib.suppress(OSError):
            print(
                f"flowplane-analytics: saving Spark's class archive for faster starts "
                f"(once per install): {archive}",
                file=sys.stderr,
            )
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if jvm.stdin is not None:
                jvm.stdin.close()
            ok = jvm.wait(timeout=120) == 0 and recording.stat().st_size > 0
        if ok:
            publish(recording, archive)
        else:
            _remove(recording)

    atexit.register(finish)


def publish(recording: Path, archive: Path, jars: Path | None = None) -> None:
    """The recording renamed into place, with a note beside it of its install (the jars
    directory and its mtime); then the directory pruned: the archives of installs that are gone
    (their jars directory missing, or changed since: a reinstall), all but the KEEP − 1 most
    recently used others, notes without an archive, and dead recorders' files. A JVM mapping a
    removed archive keeps its mapping."""
    jars = jars or _jars()
    try:
        os.replace(recording, archive)
    except OSError:
        _remove(recording)
        return
    with contextlib.suppress(OSError):
        note = {"jars": str(jars), "jars_mtime_ns": jars.stat().st_mtime_ns}
        archive.with_suffix(".jars").write_text(json.dumps(note))
    live = []
    for f in archive.parent.glob("spark-*"):
        if f.name.endswith(".tmp"):
            if not _recorder_alive(f):
                _remove(f)
        elif f.suffix == ".jars" and not f.with_suffix(".jsa").exists():
            _remove(f)
        elif f.suffix == ".jsa" and f != archive:
            try:
                mtime = f.stat().st_mtime_ns
            except OSError:
                continue
            if _install_gone(f.with_suffix(".jars")):
                _remove(f, f.with_suffix(".jars"))
            else:
                live.append((mtime, f))
    for _, f in sorted(live, reverse=True)[KEEP - 1 :]:
        _remove(f, f.with_suffix(".jars"))


def _install_gone(note: Path) -> bool:
    """Whether the install a note names is gone: its jars directory deleted or changed (False
    without a readable note: an archive recorded before notes existed is only ever capped)."""
    try:
        n = json.loads(note.read_text())
        jars, mtime = Path(n["jars"]), int(n["jars_mtime_ns"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    try:
        return jars.stat().st_mtime_ns != mtime
    except OSError:
        return True


def _remove(*files: Path) -> None:
    for f in files:
        with contextlib.suppress(OSError):
            f.unlink()
