"""A local Spark standalone cluster (one master, N workers) from the installed pyspark: started
with free ports on 127.0.0.1, every log in one directory, stopped with nothing left running.

DIR (default ``$TMPDIR/fpspark-<uid>``) holds ``cluster.json`` (the master URL, the web UI
and the process ids), ``logs/`` (master.log, worker-N.log; the executors' stdout/stderr under
``work/``) and ``work/`` (the workers' scratch and executor directories). Every daemon runs in
its own process group, which its executors join: stopping a group stops them too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STATE = "cluster.json"


class ClusterError(Exception):
    """The cluster cannot be started or reached; said in one line."""


@dataclass
class Cluster:
    dir: str
    master: str  # spark://127.0.0.1:PORT
    web: str  # the master's web UI, http://127.0.0.1:PORT (JSON API: web + "/json/")
    pids: list[int]  # master first, then the workers (each its process group's leader)

    def status(self, timeout: float = 5) -> dict[str, Any]:
        """The master's JSON API (workers, alive workers, active and completed applications)."""
        return master_json(self.web, timeout)


def default_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"fpspark-{os.getuid()}"


def master_json(web: str, timeout: float = 5) -> dict[str, Any]:
    with urllib.request.urlopen(web.rstrip("/") + "/json/", timeout=timeout) as r:
        return json.load(r)


def _spark_class() -> Path:
    try:
        import pyspark
    except ImportError as e:
        raise ClusterError(
            "a Spark cluster needs pyspark: pip install 'flowplane-analytics[spark]'"
        ) from e
    p = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not p.exists():
        raise ClusterError(f"{p}: missing from the pyspark installation")
    return p


def _free_ports(n: int) -> list[int]:
    """n distinct ports free on 127.0.0.1 now (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def load(d: str | Path | None = None) -> Cluster | None:
    """The cluster whose state DIR holds, or None."""
    f = Path(d or default_dir()) / STATE
    try:
        return Cluster(**json.loads(f.read_text()))
    except (OSError, ValueError, TypeError):
        return None


_OURS = {STATE, "logs", "work"}


def _check_dir(d: Path) -> None:
    """ClusterError unless d is missing, empty or a cluster directory (nothing but what `up`
    writes): up and down delete it, and must never delete anything else."""
    if not d.exists():
        return
    if not d.is_dir():
        raise ClusterError(f"--dir {d}: not a directory")
    other = sorted(x.name for x in d.iterdir() if x.name not in _OURS)
    if other:
        raise ClusterError(
            f"--dir {d}: not a cluster directory (it holds {', '.join(other[:3])}"
            f"{', …' if len(other) > 3 else ''}); name a new or empty directory"
        )


def _tail(f: Path, n: int = 5) -> str:
    try:
        lines = [x for x in f.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def up(
    d: str | Path | None = None,
    workers: int = 2,
    cores: int = 1,
    memory: str = "2g",
    timeout: float = 120,
) -> Cluster:
    """Starts a master and `workers` workers (each `cores` cores and `memory` for executors)
    and waits until every worker has registered. On any failure, whatever was started is
    stopped again (the logs stay in DIR/logs) and ClusterError says why."""
    d = Path(d or default_dir()).resolve()
    _check_dir(d)
    old = load(d)
    if old is not None and _alive(old.pids):
        raise ClusterError(f"{d}: a cluster is up already ({old.master}); run `cluster down` first")
    spark_class = _spark_class()
    from . import engine

    try:
        java = engine.check_java()
    except engine.EngineError as e:
        raise ClusterError(str(e).replace("--engine spark: ", "cluster: ")) from e
    shutil.rmtree(d, ignore_errors=True)
    logs, work = d / "logs", d / "work"
    logs.mkdir(parents=True)
    work.mkdir()
    port, web_port, *wports = _free_ports(2 + 2 * workers)
    env = dict(os.environ)
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env |= {
        "SPARK_HOME": str(spark_class.parents[1]),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(work),
        "SPARK_WORKER_DIR": str(work),
        "SPARK_NO_DAEMONIZE": "1",
        "JAVA_HOME": env.get("JAVA_HOME") or str(Path(java).resolve().parents[1]),
    }
    env = engine.jvm_environment(env)
    c = Cluster(str(d), f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}", [])

    def start(name: str, *args: str) -> None:
        with open(logs / f"{name}.log", "wb") as log:
            p = subprocess.Popen(
                [str(spark_class), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=d,
                start_new_session=True,  # its own process group, which its executors join
            )
        c.pids.append(p.pid)
        (d / STATE).write_text(json.dumps(asdict(c)))

    try:
        start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(web_port)),
        )
        for i in range(workers):
            start(
                f"worker-{i + 1}",
                "org.apache.spark.deploy.worker.Worker",
                c.master,
                *("--host", "127.0.0.1", "--port", str(wports[2 * i])),
                *("--webui-port", str(wports[2 * i + 1]), "--cores", str(cores)),
                *("--memory", memory, "--work-dir", str(work / f"worker-{i + 1}")),
            )
        _wait(c, workers, timeout, logs)
    except BaseException:
        _stop(c.pids)
        (d / STATE).unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        raise
    return c


def _wait(c: Cluster, workers: int, timeout: float, logs: Path) -> None:
    deadline = time.monotonic() + timeout
    alive = 0
    while time.monotonic() < deadline:
        names = ["master"] + [f"worker-{i + 1}" for i in range(workers)]
        for pid, name in zip(c.pids, names, strict=True):
            if not _alive([pid]):
                raise ClusterError(
                    f"cluster: the {name} exited while starting; {logs}/{name}.log ends: "
                    f"{_tail(logs / f'{name}.log')}"
                )
        with contextlib.suppress(OSError, ValueError):
            alive = int(master_json(c.web, 2).get("aliveworkers", 0))
            if alive >= workers:
                return
        time.sleep(0.5)
    raise ClusterError(
        f"cluster: {alive} of {workers} workers registered with {c.master} within {timeout:g} s; "
        f"see the logs in {logs}"
    )


def _alive(pids: list[int]) -> bool:
    """Whether any of the daemons' process groups still runs a Spark process."""
    return bool(_spark_groups(pids))


def _spark_groups(pgids: list[int]) -> set[int]:
    """Those of the process groups that still hold a Spark process (a daemon or an executor):
    a group whose processes are all gone, or whose id another program reuses, is left alone."""
    found = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            st = (p / "stat").read_text().rsplit(")", 1)[1].split()
            if st[0] == "Z" or int(st[2]) not in pgids:  # st[2]: the process group
                continue
            if b"org.apache.spark" in (p / "cmdline").read_bytes():
                found.add(int(st[2]))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _stop(pids: list[int], grace: float = 15) -> None:
    """SIGTERM each daemon's process group (the daemon and its executors), SIGKILL what is
    left after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        groups = _spark_groups(pids)
        for g in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, sig)
        deadline = time.monotonic() + wait
        while groups and time.monotonic() < deadline:
            _reap(pids)
            time.sleep(0.2)
            groups = _spark_groups(pids)
        if not groups:
            break
    _reap(pids)


def _reap(pids: list[int]) -> None:
    """Collects the daemons that are this process's children (when it started them)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def down(d: str | Path | None = None) -> bool:
    """Stops the cluster of DIR (master, workers, executors) and deletes DIR, logs included.
    False when no cluster was running there; ClusterError when DIR holds anything else."""
    d = Path(d or default_dir()).resolve()
    _check_dir(d)
    c = load(d)
    was = c is not None and _alive(c.pids)
    if was:
        _stop(c.pids)
    shutil.rmtree(d, ignore_errors=True)
    return was
