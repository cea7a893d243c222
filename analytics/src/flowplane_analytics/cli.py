"""flowplane-analytics: the command line (also `flowplane altmark analyze …`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from . import (
    __version__,
    engine,
    filecheck,
    metrics,
    output,
    records,
    sparkcluster,
    storage,
    synth,
    topology,
)
from . import clusters as clus
from . import collect as coll

# Exit codes: 0 done; 1 a probe failed (collect) or an internal error; 2 bad input (a flag,
# the topology, the dataset), said in one line before anything was written; 3 an alarm with
# --fail-on-alarm.
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_ALARM = 3


class UsageError(Exception):
    pass


def _int_at_least(low: int, note: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number ≥ low."""

    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a whole number") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{v}: want {low} or more{note}")
        return v

    return parse


def _number_in(low: float, high: float | None = None, above: bool = False) -> Callable:
    """An argparse type: a number from low (excluded if above) to high."""

    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
        if v != v or v < low or (above and v == low) or (high is not None and v > high):
            want = f"more than {low:g}" if above else f"{low:g} or more"
            if high is not None:
                want = f"from {low:g} to {high:g}"
            raise argparse.ArgumentTypeError(f"{s}: want {want}")
        return v

    return parse


def _master(s: str) -> str:
    try:
        engine.check_master(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--master {s!r}: ")) from None
    return s


def _engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument(
        "--engine",
        choices=engine.ENGINES,
        default="duckdb",
        help="duckdb (in-process, default) or spark",
    )
    g.add_argument(
        "--master",
        type=_master,
        help="Spark master URL (default local[*]; e.g. spark://host:7077)",
    )
    g.add_argument("--memory-limit", help="DuckDB memory limit, e.g. 2GB (spills beyond it)")
    g.add_argument("--temp-dir", help="DuckDB spill directory")
    g.add_argument("--threads", type=_int_at_least(1), help="DuckDB threads")
    g.add_argument(
        "--batch-periods",
        type=_int_at_least(0, " (0: one query)"),
        metavar="N",
        help="run loss and delay in queries of N periods each (same answer; keeps a large "
        "dataset's joins and sorts in memory). Default: with DuckDB on a compacted dataset, "
        f"as many periods as hold about {engine.AUTO_BATCH_SAMPLES:,} samples, else 0 (one "
        "query)",
    )


def _out_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=output.FORMATS, default="table")
    p.add_argument("--output", "-o", help="write to FILE instead of stdout (needed for parquet)")


def _hosts_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--probe-hosts",
        action="store_true",
        help="a lab topology's hosts are probed too: their links become clusters",
    )


def _topology_arg(p: argparse.ArgumentParser, old_positional: bool = False) -> None:
    """--topology/-t, as every command that reads a topology takes it. old_positional: the
    TOPOLOGY positional of earlier releases still works, with a notice (run checks)."""
    p.add_argument(
        "--topology",
        "-t",
        required=not old_positional,
        help="lab topology YAML or graph file (YAML/JSON links of MP ids, GraphML)"
        + (" (required)" if old_positional else ""),
    )
    if old_positional:
        p.add_argument("old_topology", nargs="?", help=argparse.SUPPRESS)


def _old_topology(a: argparse.Namespace) -> None:
    """clusters and synth: the deprecated positional TOPOLOGY taken as --topology, or the
    missing flag said in argparse's words."""
    old = getattr(a, "old_topology", None)
    if old is not None:
        if a.topology is not None:
            raise UsageError(f"{a.cmd}: give the topology once, as --topology {a.topology}")
        print(
            f'flowplane-analytics: "{a.cmd} TOPOLOGY" is deprecated; '
            f'use "{a.cmd} --topology TOPOLOGY"',
            file=sys.stderr,
        )
        a.topology = old
    if hasattr(a, "old_topology") and a.topology is None:
        raise UsageError(f"{a.cmd}: the following arguments are required: --topology/-t")


def _metric_args(p: argparse.ArgumentParser) -> None:
    _hosts_arg(p)
    p.add_argument(
        "--data",
        "-d",
        required=True,
        help="dataset: a directory or s3://BUCKET/PREFIX",
    )
    _topology_arg(p)
    p.add_argument(
        "--super",
        action="append",
        default=[],
        metavar="C1+C2",
        help="also report the super-cluster of these clusters (repeatable)",
    )
    p.add_argument(
        "--layout",
        choices=("auto", "raw", "compact"),
        default="auto",
        help="auto (default): DATA/compact/ when `compact` wrote it and no period came since, "
        "else the partitioned records",
    )
    _skip_arg(p)
    _engine_args(p)
    _out_args(p)


def _skip_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--skip-bad-files",
        action="store_true",
        help="leave out record files that cannot be read (truncated, not Parquet), naming them "
        "on stderr: their probe's period is read as not recorded (its points are missing "
        "points). Without it such a file is an error (exit 2)",
    )


def _hash_bits(s: str) -> int:
    v = _int_at_least(0)(s)
    if v > 31:
        raise argparse.ArgumentTypeError(f"{v}: want 0 to 31 (hashes are 32 bits)")
    return v


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="flowplane-analytics",
        description="altmark analytics: RFC 9342 clusters, loss and delay from period records",
    )
    ap.add_argument("--version", action="version", version=f"flowplane-analytics {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("collect", help="pull period records from probes' REST APIs")
    p.add_argument(
        "--data", "-d", required=True, help="dataset to fill: a directory or s3://BUCKET/PREFIX"
    )
    p.add_argument(
        "--probe",
        "-p",
        action="append",
        default=[],
        metavar="URL[,token-file=F]",
        help="a probe's API, e.g. http://198.18.0.1:9464 (repeatable)",
    )
    p.add_argument(
        "--probe-file",
        metavar="FILE",
        help="more probes, one URL[,token-file=F] per line (# comments, blank lines ignored)",
    )
    p.add_argument("--token-file", help=f"bearer token for every probe (else ${coll.TOKEN_ENV})")
    p.add_argument(
        "--parallel",
        type=_int_at_least(1),
        default=8,
        metavar="N",
        help="probes collected at once (default 8)",
    )
    p.add_argument(
        "--retries", type=_int_at_least(0), default=3, help="retries per request (default 3)"
    )
    p.add_argument(
        "--retry-wait",
        type=_number_in(0),
        default=1.0,
        help="first pause between retries in seconds, doubling (default 1)",
    )
    p.add_argument(
        "--timeout", type=_number_in(0, above=True), default=10.0, help="per request, seconds"
    )
    p.add_argument(
        "--probe-deadline",
        type=_number_in(0, above=True),
        metavar="S",
        help="seconds one probe may take in all, retries included, before it is reported and "
        "left (what it fetched is kept; default: no limit)",
    )
    p.add_argument("--no-jsonl", action="store_true", help="do not keep jsonl/<probe>/<n>.jsonl")
    _out_args(p)

    p = sub.add_parser(
        "compact",
        help="rewrite a dataset's records into DATA/compact/ (few large files, integer columns)",
    )
    p.add_argument("--data", "-d", required=True, help="dataset directory (local)")
    _skip_arg(p)
    _engine_args(p)

    p = sub.add_parser("clusters", help="clusters of a topology (table, PNG)")
    _topology_arg(p, old_positional=True)
    _hosts_arg(p)
    p.add_argument("--png", help="write the graph coloured by cluster to this PNG")
    p.add_argument("--super", action="append", default=[], metavar="C1+C2")
    p.add_argument(
        "--graph",
        action="store_true",
        help="print the measurement-point graph (JSON links) instead",
    )
    _out_args(p)

    p = sub.add_parser("loss", help="loss per period and cluster, and end to end")
    _metric_args(p)
    p.add_argument(
        "--fail-on-alarm",
        action="store_true",
        help=f"exit {EXIT_ALARM} when any period has an alarm, or a period no probe recorded",
    )

    p = sub.add_parser("delay", help="delay per period and cluster from matched samples")
    _metric_args(p)

    p = sub.add_parser("paths", help="each sampled packet's hops in time order")
    _metric_args(p)
    p.add_argument(
        "--limit",
        type=_int_at_least(0, " (0: all)"),
        default=1000,
        help="packets (default 1000; 0 = all)",
    )

    p = sub.add_parser("report", help="HTML page with the tables and plots")
    _metric_args(p)
    p.add_argument("--html", required=True, help="the HTML file to write")

    p = sub.add_parser(
        "cluster",
        help="start, inspect or stop a local Spark standalone cluster (master + workers)",
    )
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument(
        "--dir",
        default=str(sparkcluster.default_dir()),
        help="its state, logs and scratch directory (default %(default)s)",
    )
    p.add_argument("--workers", type=_int_at_least(1), default=2, help="(up) default 2")
    p.add_argument("--cores", type=_int_at_least(1), default=1, help="(up) per worker, default 1")
    p.add_argument("--memory", default="2g", help="(up) executor memory per worker, default 2g")
    p.add_argument(
        "--timeout",
        type=_number_in(0, above=True),
        default=120.0,
        help="(up) seconds to wait for the workers to register (default 120)",
    )

    p = sub.add_parser("synth", help="write synthetic records with injected loss (demo, bench)")
    _topology_arg(p, old_positional=True)
    _hosts_arg(p)
    p.add_argument("--data", "-d", required=True)
    p.add_argument("--periods", type=_int_at_least(1), default=10)
    p.add_argument(
        "--packets", type=_int_at_least(0), default=2000, help="per host pair and period"
    )
    p.add_argument(
        "--loss",
        type=_number_in(0, 1),
        default=0.01,
        help="loss probability on every MP link (0 to 1)",
    )
    p.add_argument("--hash-bits", type=_hash_bits, default=4, help="0 to 31 (default 4)")
    p.add_argument("--jitter-ns", type=_int_at_least(0), default=20_000)
    p.add_argument("--seed", type=_int_at_least(0), default=1)
    p.add_argument(
        "--lab-ifnames",
        action="store_true",
        help="name interfaces as a lab's probe sees them (fp<tag>-eth0)",
    )
    return ap


def _network(path: str, probe_hosts: bool = False, lab: bool = False) -> topology.Network:
    """The topology, checked: every problem of the file as a usage error, and one whose
    measurement-point graph has no link (nothing could be measured) too."""
    try:
        net = topology.load(path, probe_hosts=probe_hosts)
    except topology.TopologyError as e:
        raise UsageError(str(e)) from e
    if lab and net.node_graph is None:
        raise UsageError(
            f"{path}: a graph file; synth needs a lab topology (nodes:, links:; docs/lab.md)"
        )
    if not net.graph.number_of_edges():
        if net.node_graph is not None:
            hint = (
                "it has no links"
                if probe_hosts
                else "no routers (hosts carry a probe only with --probe-hosts)"
            )
            raise UsageError(f"{path}: no measurement-point links to analyse: {hint}")
        raise UsageError(f"{path}: no links: the graph has nothing to analyse")
    return net


def _resolve(net: topology.Network, supers: Sequence[str]) -> list[clus.Cluster]:
    if supers:
        ids = [c.id for c in clus.clusterize(net.graph)]
        for spec in supers:
            names = [x.strip() for x in spec.replace(",", "+").split("+") if x.strip()]
            if not names:
                raise UsageError(f"--super {spec!r}: name the clusters to join, e.g. C1+C2")
            missing = [x for x in names if x not in ids]
            if missing:
                raise UsageError(
                    f"--super {spec}: no cluster {', '.join(missing)} "
                    f"(the topology's clusters are C1 to C{len(ids)}; see `clusters`)"
                )
    try:
        return clus.resolve(net, supers)
    except ValueError as e:
        raise UsageError(f"--super: {e}") from e


def _opts(a: argparse.Namespace) -> engine.Options:
    return engine.Options(
        engine=a.engine,
        master=a.master,
        memory_limit=a.memory_limit,
        temp_dir=a.temp_dir,
        threads=a.threads,
    )


def _connect(a: argparse.Namespace, src: engine.Source) -> Any:
    try:
        return engine.connect(_opts(a), src)
    except engine.EngineError as e:
        raise UsageError(str(e)) from e


def _locate(a: argparse.Namespace, layout: str) -> engine.Source:
    """The dataset, located and its files checked before any engine starts."""
    sch = storage.scheme(a.data)
    if sch and sch not in storage.SCHEMES and a.engine != "spark":
        raise UsageError(f"--data {a.data}: a {sch}:// dataset needs --engine spark")
    if sch in storage.SCHEMES:
        _check_s3(a.data)
        # Before an engine lists it: DuckDB's and Spark's globs take an unreachable store or
        # a missing bucket for "no files".
        try:
            root = storage.Root(a.data)
            root.make()
            if not root.dirs("counters"):
                raise UsageError(
                    f"--data {a.data}: cannot read it: no counters/probe=*/ under this prefix "
                    "(collect into it first, or check the prefix)"
                )
        except (OSError, storage.StorageError) as e:
            raise UsageError(f"--data {a.data}: cannot read it: {engine.short_error(e)}") from e
    try:
        return engine.locate(a.data, layout, a.skip_bad_files, a.known_bad)
    except filecheck.BadFilesError as e:
        raise UsageError(str(e)) from e
    except OSError as e:  # FileNotFoundError, NotADirectoryError: messages name the path
        raise UsageError(str(e)) from e


class _SkipAndRetry(Exception):
    """Files found bad only once an engine failed on them, to leave out in a second run."""

    def __init__(self, bad: list[filecheck.BadFile]) -> None:
        super().__init__(str(bad[0]))
        self.bad = bad


@contextlib.contextmanager
def _reading(a: argparse.Namespace, src: engine.Source) -> Iterator[None]:
    """An engine failing while it reads the dataset: when a file is to blame (a footer that
    passed `locate`'s check over corrupt pages), name it as a usage error, or with
    --skip-bad-files have the command run again without it; else re-raise."""
    try:
        yield
    except (UsageError, OSError, KeyboardInterrupt, _duckdb_out_of_memory()):
        raise  # out of memory: no file to blame, and checking every one would take long
    except Exception as e:
        if not src.local:
            raise
        bad = filecheck.deep_check(src.files())
        if not bad:
            raise
        if a.skip_bad_files and not a.known_bad:
            raise _SkipAndRetry(bad) from e
        raise UsageError(str(filecheck.BadFilesError(bad, src.hint()))) from e


def _check_output(path: str | None, flag: str) -> None:
    """An output file that cannot be written, said before any work."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; name a file")
    parent = p.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: no directory {parent}")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{flag} {path}: cannot write in {parent}")


def _check_out_args(a: argparse.Namespace) -> None:
    if hasattr(a, "format"):
        try:
            output.check(a.format, a.output)
        except ValueError as e:
            raise UsageError(str(e)) from e
        _check_output(a.output, "--output")
    for flag in ("png", "html"):
        _check_output(getattr(a, flag, None), f"--{flag}")


def _emit(df: pd.DataFrame, a: argparse.Namespace) -> None:
    try:
        output.emit(df, a.format, a.output)
    except OSError as e:
        if isinstance(e, BrokenPipeError) or not a.output:
            raise
        raise UsageError(f"--output {a.output}: cannot write: {e.strerror or e}") from e


def _setup(
    a: argparse.Namespace,
) -> tuple[Any, engine.Dataset, engine.Source, topology.Network, list, Any, Any]:
    net = _network(a.topology, a.probe_hosts)
    cs = _resolve(net, a.super)
    src = _locate(a, a.layout)
    con = _connect(a, src)
    try:
        with _reading(a, src):
            ds = engine.load(con, src)
    except engine.EngineError as e:
        raise UsageError(str(e)) from e
    except UsageError:
        raise
    except Exception as e:
        if src.local:
            raise
        raise UsageError(f"--data {a.data}: cannot read it: {engine.short_error(e)}") from e
    members, aliases = metrics.membership(net, cs)
    with _reading(a, src):
        _warn_unnamed_points(con, ds, aliases)
    return con, ds, src, net, cs, members, aliases


_warned: set[str] = set()


def _warn_unnamed_points(con: Any, ds: engine.Dataset, aliases: Any) -> None:
    """Say which measurement points of the records no point of the topology names: a probe_id
    or an interface name that differs from the topology's leaves its points missing from every
    metric, which would otherwise read as probes that recorded nothing."""
    key = engine.MP_KEY
    # the counters (a row per point and period), not the samples: cheap at any size
    df = engine.execute(con, ds.counters.select(*key).distinct().anti_join(aliases, key))
    if df.empty:
        return
    names = sorted(":".join(map(str, r)) for r in df[key].itertuples(index=False))
    more = f" and {len(names) - 10} more" if len(names) > 10 else ""
    msg = (
        f"warning: the records hold {len(names)} measurement point(s) that no point of the "
        f"topology names: {', '.join(names[:10])}{more} (probe:interface:direction); their "
        "packets are in no metric: check the probes' probe_id and interface names against "
        "the topology"
    )
    if msg not in _warned:  # once, though --skip-bad-files may run the command again
        _warned.add(msg)
        print(msg, file=sys.stderr)


def _clusters_frame(cs: Sequence[clus.Cluster]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "cluster": c.id,
                "label": c.label,
                "inputs": " ".join(p.id for p in c.inputs),
                "outputs": " ".join(p.id for p in c.outputs),
                "links": len(c.links),
            }
            for c in cs
        ]
    )


def _sources(a: argparse.Namespace) -> list[coll.Source]:
    try:
        tok = coll.default_token(a.token_file)
    except OSError as e:
        raise UsageError(f"--token-file {a.token_file}: {e.strerror or e}") from e
    specs = [(x, f"--probe {x!r}") for x in a.probe]
    if a.probe_file:
        try:
            lines = Path(a.probe_file).read_text().splitlines()
        except OSError as e:
            raise UsageError(f"--probe-file {a.probe_file}: {e.strerror or e}") from e
        specs += [
            (x.strip(), f"--probe-file {a.probe_file} line {n}")
            for n, x in enumerate(lines, 1)
            if x.strip() and not x.strip().startswith("#")
        ]
    if not specs:
        raise UsageError("collect: name the probes with --probe URL or --probe-file FILE")
    srcs: list[coll.Source] = []
    seen: dict[tuple[str, str, int], str] = {}
    for spec, where in specs:
        try:
            src = coll.parse_source(spec, tok)
        except OSError as e:
            raise UsageError(f"{where}: token file {e.filename}: {e.strerror}") from e
        except ValueError as e:
            raise UsageError(f"{where}: {e}") from e
        want = "want http://HOST:PORT (or https://)"
        try:
            u = urllib.parse.urlsplit(src.url)
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError as e:  # a port that is not a number
            raise UsageError(f"{where}: not a URL ({e}); {want}") from e
        if u.scheme not in ("http", "https") or not u.hostname or not _HOST.fullmatch(u.hostname):
            raise UsageError(f"{where}: not a probe's URL; {want}")
        key = (u.hostname.lower(), u.path.rstrip("/"), port)
        if key in seen:
            raise UsageError(f"{where}: the same probe as {seen[key]}; name each probe once")
        seen[key] = where
        srcs.append(src)
    return srcs


# A host name or an IPv4 address, or an IPv6 one with its zone (urlsplit drops the brackets).
_HOST = re.compile(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?")


def _check_s3(path: str) -> None:
    """An s3:// dataset's URL and the store's settings (storage.py), before any work."""
    try:
        storage.split(path)
        storage.S3Settings.from_env()
    except storage.StorageError as e:
        raise UsageError(f"--data {path}: {e}") from e


def _data_dir(path: str, s3: bool = False) -> None:
    """A dataset directory to write: it may not exist yet, but must not be a file; or, if s3,
    an s3:// prefix with usable settings."""
    if not storage.is_local(path):
        if not (s3 and storage.is_s3(path)):
            if not s3:
                raise UsageError(f"--data {path}: want a local directory")
            raise UsageError(f"--data {path}: want a directory or s3://BUCKET/PREFIX")
        _check_s3(path)
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"--data {path}: not a directory")


_MEMORY_RE = re.compile(r"[1-9]\d*[kmgt]?", re.IGNORECASE)


def _cluster(a: argparse.Namespace) -> int:
    """cluster up: the master URL on stdout (M=$(flowplane-analytics cluster up)), the rest on
    stderr; down: everything stopped, DIR deleted; status: the master's JSON summarised."""
    err = sys.stderr
    if a.action == "up":
        if not _MEMORY_RE.fullmatch(a.memory):
            raise UsageError(f"--memory {a.memory!r}: not a memory size; write e.g. 2g or 512m")
        try:
            c = sparkcluster.up(a.dir, a.workers, a.cores, a.memory, a.timeout)
        except sparkcluster.ClusterError as e:
            raise UsageError(str(e)) from e
        print(c.master)
        print(
            f"cluster: {a.workers} workers registered; web UI {c.web} (JSON: {c.web}/json/); "
            f"logs in {c.dir}/logs; stop it with `flowplane-analytics cluster down"
            + (f" --dir {a.dir}`" if a.dir != str(sparkcluster.default_dir()) else "`"),
            file=err,
        )
        return 0
    if a.action == "down":
        try:
            was = sparkcluster.down(a.dir)
        except sparkcluster.ClusterError as e:
            raise UsageError(str(e)) from e
        print(f"cluster: {'stopped' if was else 'none was running'}; {a.dir} removed", file=err)
        return 0
    c = sparkcluster.load(a.dir)
    if c is None:
        raise UsageError(f"--dir {a.dir}: no cluster there (start one with `cluster up`)")
    try:
        j = c.status()
    except OSError as e:
        raise UsageError(f"cluster {c.master}: its web UI {c.web} does not answer ({e})") from e
    print(f"master {c.master} ({j.get('status', '?')}), web UI {c.web}")
    for w in j.get("workers", []):
        print(
            f"worker {w.get('id')}: {w.get('state')}, {w.get('cores')} cores, {w.get('memory')} MB"
        )
    for kind in ("activeapps", "completedapps"):
        for app in j.get(kind, []):
            print(f"application {app.get('id')} {app.get('name')}: {app.get('state')}")
    return 0


def run(argv: Sequence[str], known_bad: Sequence[filecheck.BadFile] = ()) -> int:
    """The command; known_bad: files an earlier run found bad only by reading them through."""
    a = parser().parse_args(argv)
    a.known_bad = list(known_bad)
    _old_topology(a)
    if not hasattr(a, "skip_bad_files"):
        a.skip_bad_files = False
    _check_out_args(a)
    err = sys.stderr
    if a.cmd == "collect":
        srcs = _sources(a)
        _data_dir(a.data, s3=True)
        try:
            res = coll.collect(
                srcs,
                a.data,
                retries=a.retries,
                backoff=a.retry_wait,
                timeout=a.timeout,
                keep_json=not a.no_jsonl,
                parallel=a.parallel,
                deadline=a.probe_deadline,
            )
        except storage.StorageError as e:
            raise UsageError(f"--data {e}") from e
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            raise UsageError(f"--data {a.data}: {where}{e.strerror or e}") from e
        df = pd.DataFrame(
            [
                {
                    "url": r.url,
                    "probe": r.probe,
                    "listed": r.listed,
                    "fetched": len(r.fetched),
                    "already": r.present,
                    "gone": len(r.missing),
                    "requests": r.attempts,
                    "rows": r.rows,
                    "seconds": round(r.seconds, 3),
                    "status": "ok" if r.ok else f"DOWN: {r.error}",
                }
                for r in res
            ]
        )
        _emit(df, a)
        bad = [r for r in res if not r.ok]
        for r in bad:
            print(f"flowplane-analytics: collect: probe {r.url} failed: {r.error}", file=err)
        return 1 if bad else 0
    if a.cmd == "compact":
        t = time.monotonic()
        if "://" in a.data and not a.data.startswith("file://"):
            raise UsageError(f"--data {a.data}: compact writes local datasets only")
        src = _locate(a, "raw")
        con = _connect(a, src)
        with _reading(a, src):
            try:
                meta = engine.compact(con, src)
            except engine.EngineError as e:
                raise UsageError(str(e)) from e
        print(
            f"compact: {a.data}/{engine.COMPACT}: {meta['counter_files']} probe periods "
            f"in {time.monotonic() - t:.1f} s",
            file=err,
        )
        return 0
    if a.cmd == "clusters":
        net = _network(a.topology, a.probe_hosts)
        if a.graph:
            print(topology.to_json(net))
            return 0
        cs = _resolve(net, a.super)
        _emit(_clusters_frame(cs), a)
        if a.png:
            from . import draw

            draw.graph_png(net, cs, a.png)
            print(f"graph: {a.png}", file=err)
        return 0
    if a.cmd == "cluster":
        return _cluster(a)
    if a.cmd == "synth":
        net = _network(a.topology, a.probe_hosts, lab=True)
        _data_dir(a.data)
        held = [
            t
            for t in ("counters", "samples", "jsonl", engine.COMPACT)
            if (Path(a.data) / t).exists()
        ]
        if held:
            raise UsageError(
                f"--data {a.data}: already holds records ({', '.join(held)}/); synth writes a "
                "new dataset: name a new or empty directory"
            )
        spec = synth.Spec(
            periods=a.periods,
            packets=a.packets,
            hash_bits=a.hash_bits,
            jitter_ns=a.jitter_ns,
            seed=a.seed,
            loss_prob={lk: a.loss for lk in net.graph.edges} if a.loss else {},
            ifname_style="lab" if a.lab_ifnames else "plain",
            grow_prob=0.2,
        )
        try:
            truth = synth.generate(net, spec, a.data)
        except OSError as e:
            raise UsageError(f"--data {a.data}: {e.filename or ''}: {e.strerror or e}") from e
        print(
            f"{len(truth.periods)} periods, {len(records.probes(Path(a.data)))} probes, "
            f"{truth.samples} samples, {sum(truth.drops.values())} packets dropped "
            f"under {a.data}",
            file=err,
        )
        return 0
    con, ds, src, net, cs, members, aliases = _setup(a)
    if a.cmd == "loss":
        with _reading(a, src):
            df = engine.execute_by_periods(
                con, ds, lambda d: metrics.loss(d, members, aliases), a.batch_periods
            )
            df = output.readable_order(df)  # the alarms below in the table's order
            alarms = df[df["alarm"] != ""]
            miss = (
                output.readable_order(
                    engine.execute(con, metrics.missing_points(ds, members, aliases))
                )
                if len(alarms)
                else None
            )
        _emit(df, a)
        gaps = metrics.period_gaps(df["period"])
        for g in gaps[:20]:
            print(f"ALARM: {metrics.describe_gap(g)}", file=err)
        if len(gaps) > 20:
            print(f"ALARM: … and {len(gaps) - 20} more gaps in the periods", file=err)
        if miss is not None:
            print(
                f"ALARM: {len(alarms)} (period, cluster) rows: "
                f"{(alarms['alarm'] == 'outage').sum()} outages (every packet lost), "
                f"{(alarms['alarm'] == 'negative_loss').sum()} negative loss, "
                f"{(alarms['alarm'] == 'missing_points').sum()} with missing points",
                file=err,
            )
            for _, r in alarms[alarms["alarm"] == "outage"].head(20).iterrows():
                print(
                    f"ALARM: period {r['period']} cluster {r['cluster']}: outage, all "
                    f"{r['in_packets']} packets in were lost",
                    file=err,
                )
            for _, r in miss.head(20).iterrows():
                print(
                    f"ALARM: period {r['period']} cluster {r['cluster']}: no counters for "
                    f"{r['role']} point {r['point']}",
                    file=err,
                )
        if (miss is not None or gaps) and a.fail_on_alarm:
            return EXIT_ALARM
        return 0
    if a.cmd == "delay":
        with _reading(a, src):
            df = engine.execute_by_periods(
                con, ds, lambda d: metrics.delay(d, members, aliases), a.batch_periods
            )
        _emit(df, a)
        return 0
    if a.cmd == "paths":
        with _reading(a, src):
            df = engine.execute(con, metrics.paths(ds, aliases))
        key = ["period", "hash", *metrics.TUPLE]
        if a.limit:
            keep = df[key].drop_duplicates().head(a.limit)
            df = df.merge(keep, on=key)
        if a.format == "table":
            df = (
                df.sort_values([*key, "hop"])
                .groupby(key, as_index=False, sort=False)
                .agg(
                    hops=("hop", "max"),
                    path=("point", " → ".join),
                    total_ns=("since_first_ns", "max"),
                )
            )
        _emit(df, a)
        return 0
    if a.cmd == "report":
        from . import report

        with _reading(a, src):
            loss = engine.execute(con, metrics.loss(ds, members, aliases))
            miss = engine.execute(con, metrics.missing_points(ds, members, aliases))
            dl = engine.execute(con, metrics.delay(ds, members, aliases))
            delays = engine.execute(
                con, metrics.matched_delays(ds, members, aliases).limit(200_000)
            )
        try:
            report.write(
                a.html,
                net,
                cs,
                loss,
                miss,
                dl,
                delays,
                title=f"altmark report: {net.name or a.topology}",
            )
        except OSError as e:
            raise UsageError(f"--html {a.html}: cannot write: {e.strerror or e}") from e
        print(f"report: {a.html}", file=err)
        return 0
    raise UsageError(f"unknown command {a.cmd}")


def _duckdb_out_of_memory() -> type[Exception]:
    import duckdb  # a core dependency, imported late: the CLI starts faster without it

    return duckdb.OutOfMemoryException


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: exit 0, 1 (a probe failed; an internal error), 2 (bad input: one
    message naming the file or flag, no traceback) or 3 (--fail-on-alarm). An unexpected
    exception is one line too, the traceback only with FLOWPLANE_ANALYTICS_DEBUG=1."""
    args = sys.argv[1:] if argv is None else argv
    _warned.clear()
    try:
        try:
            return run(args)
        except _SkipAndRetry as r:  # --skip-bad-files, and a file failed only when read through
            return run(args, known_bad=r.bad)
    except UsageError as e:
        print(f"flowplane-analytics: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("flowplane-analytics: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (`| head`): stop quietly, and keep Python from complaining at exit
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_INTERNAL
    except Exception as e:
        if engine.debug():
            traceback.print_exc()
        elif isinstance(e, _duckdb_out_of_memory()):  # under --memory-limit
            print(
                f"flowplane-analytics: DuckDB ran out of memory ({engine.short_error(e)}); "
                "give --temp-dir DIR to spill to disk, raise --memory-limit or lower --threads "
                "(loss and delay: or fewer periods per query, --batch-periods N)",
                file=sys.stderr,
            )
        else:
            print(
                f"flowplane-analytics: internal error: {type(e).__name__}: "
                f"{engine.short_error(e)} (rerun with {engine.DEBUG_ENV}=1 for the traceback)",
                file=sys.stderr,
            )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
