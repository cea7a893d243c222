"""flowplane-analytics: the command line (also `flowplane altmark analyze …`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from . import clusters as clus
from . import collect as coll
from . import engine, metrics, output, records, synth, topology

EXIT_USAGE = 2
EXIT_ALARM = 3


class UsageError(Exception):
    pass


def _engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument(
        "--engine",
        choices=engine.ENGINES,
        default="duckdb",
        help="duckdb (in-process, default) or spark",
    )
    g.add_argument("--master", help="Spark master URL (default local[*]; e.g. spark://host:7077)")
    g.add_argument("--memory-limit", help="DuckDB memory limit, e.g. 2GB (spills beyond it)")
    g.add_argument("--temp-dir", help="DuckDB spill directory")
    g.add_argument("--threads", type=int, help="DuckDB threads")
    g.add_argument(
        "--batch-periods",
        type=int,
        metavar="N",
        help="run loss and delay in queries of N periods each (same answer; keeps a large "
        f"dataset's joins and sorts in memory). Default: {engine.AUTO_BATCH} with DuckDB on "
        "a compacted dataset, else 0 (one query)",
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


def _metric_args(p: argparse.ArgumentParser, topo_required: bool = True) -> None:
    _hosts_arg(p)
    p.add_argument(
        "--data",
        "-d",
        required=True,
        help="dataset directory (local, or hdfs:// / s3a:// with --engine spark)",
    )
    p.add_argument(
        "--topology",
        "-t",
        required=topo_required,
        help="lab topology YAML or graph file (YAML/JSON links of MP ids, GraphML)",
    )
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
    _engine_args(p)
    _out_args(p)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="flowplane-analytics",
        description="altmark analytics: RFC 9342 clusters, loss and delay from period records",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("collect", help="pull period records from probes' REST APIs")
    p.add_argument("--data", "-d", required=True, help="dataset directory to fill")
    p.add_argument(
        "--probe",
        "-p",
        action="append",
        required=True,
        metavar="URL[,token-file=F]",
        help="a probe's API, e.g. http://198.18.0.1:9464 (repeatable)",
    )
    p.add_argument("--token-file", help=f"bearer token for every probe (else ${coll.TOKEN_ENV})")
    p.add_argument("--retries", type=int, default=3, help="retries per request (default 3)")
    p.add_argument(
        "--retry-wait",
        type=float,
        default=1.0,
        help="first pause between retries in seconds, doubling (default 1)",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="per request, seconds")
    p.add_argument("--no-jsonl", action="store_true", help="do not keep jsonl/<probe>/<n>.jsonl")
    _out_args(p)

    p = sub.add_parser(
        "compact",
        help="rewrite a dataset's records into DATA/compact/ (few large files, integer columns)",
    )
    p.add_argument("--data", "-d", required=True, help="dataset directory (local)")
    _engine_args(p)

    p = sub.add_parser("clusters", help="clusters of a topology (table, PNG)")
    p.add_argument("topology", help="lab topology YAML or graph file")
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
        help=f"exit {EXIT_ALARM} when any period has an alarm",
    )

    p = sub.add_parser("delay", help="delay per period and cluster from matched samples")
    _metric_args(p)

    p = sub.add_parser("paths", help="each sampled packet's hops in time order")
    _metric_args(p)
    p.add_argument("--limit", type=int, default=1000, help="packets (default 1000; 0 = all)")

    p = sub.add_parser("report", help="HTML page with the tables and plots")
    _metric_args(p)
    p.add_argument("--html", required=True, help="the HTML file to write")

    p = sub.add_parser("synth", help="write synthetic records with injected loss (demo, bench)")
    p.add_argument("topology")
    _hosts_arg(p)
    p.add_argument("--data", "-d", required=True)
    p.add_argument("--periods", type=int, default=10)
    p.add_argument("--packets", type=int, default=2000, help="per host pair and period")
    p.add_argument("--loss", type=float, default=0.01, help="loss probability on every MP link")
    p.add_argument("--hash-bits", type=int, default=4)
    p.add_argument("--jitter-ns", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--lab-ifnames",
        action="store_true",
        help="name interfaces as a lab's probe sees them (fp<tag>-eth0)",
    )
    return ap


def _network(path: str, probe_hosts: bool = False) -> topology.Network:
    try:
        return topology.load(path, probe_hosts=probe_hosts)
    except (topology.TopologyError, OSError) as e:
        raise UsageError(str(e)) from e


def _resolve(net: topology.Network, supers: Sequence[str]) -> list[clus.Cluster]:
    try:
        return clus.resolve(net, supers)
    except ValueError as e:
        raise UsageError(str(e)) from e


def _opts(a: argparse.Namespace) -> engine.Options:
    return engine.Options(
        engine=a.engine,
        master=a.master,
        memory_limit=a.memory_limit,
        temp_dir=a.temp_dir,
        threads=a.threads,
    )


def _setup(a: argparse.Namespace) -> tuple[Any, engine.Dataset, topology.Network, list, Any, Any]:
    net = _network(a.topology, a.probe_hosts)
    cs = _resolve(net, a.super)
    con = engine.connect(_opts(a))
    try:
        ds = engine.load(con, a.data, layout=a.layout)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from e
    members, aliases = metrics.membership(net, cs)
    return con, ds, net, cs, members, aliases


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


def run(argv: Sequence[str]) -> int:
    a = parser().parse_args(argv)
    err = sys.stderr
    if a.cmd == "collect":
        try:
            tok = coll.default_token(a.token_file)
            srcs = [coll.parse_source(s, tok) for s in a.probe]
        except (OSError, ValueError) as e:
            raise UsageError(str(e)) from e
        res = coll.collect(
            srcs,
            a.data,
            retries=a.retries,
            backoff=a.retry_wait,
            timeout=a.timeout,
            keep_json=not a.no_jsonl,
        )
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
                    "status": "ok" if r.ok else f"DOWN: {r.error}",
                }
                for r in res
            ]
        )
        output.emit(df, a.format, a.output)
        bad = [r for r in res if not r.ok]
        for r in bad:
            print(f"flowplane-analytics: collect: probe {r.url} failed: {r.error}", file=err)
        return 1 if bad else 0
    if a.cmd == "compact":
        t = time.monotonic()
        try:
            meta = engine.compact(engine.connect(_opts(a)), a.data)
        except (FileNotFoundError, ValueError) as e:
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
        output.emit(_clusters_frame(cs), a.format, a.output)
        if a.png:
            from . import draw

            draw.graph_png(net, cs, a.png)
            print(f"graph: {a.png}", file=err)
        return 0
    if a.cmd == "synth":
        net = _network(a.topology, a.probe_hosts)
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
        truth = synth.generate(net, spec, a.data)
        print(
            f"{len(truth.periods)} periods, {len(records.probes(Path(a.data)))} probes, "
            f"{truth.samples} samples, {sum(truth.drops.values())} packets dropped "
            f"under {a.data}",
            file=err,
        )
        return 0
    con, ds, net, cs, members, aliases = _setup(a)
    if a.cmd == "loss":
        df = engine.execute_by_periods(
            con, ds, lambda d: metrics.loss(d, members, aliases), a.batch_periods
        )
        output.emit(df, a.format, a.output)
        alarms = df[df["alarm"] != ""]
        if len(alarms):
            miss = con.execute(metrics.missing_points(ds, members, aliases))
            print(
                f"ALARM: {len(alarms)} (period, cluster) rows: "
                f"{(alarms['alarm'] == 'negative_loss').sum()} negative loss, "
                f"{(alarms['alarm'] == 'missing_points').sum()} with missing points",
                file=err,
            )
            for _, r in miss.head(20).iterrows():
                print(
                    f"ALARM: period {r['period']} cluster {r['cluster']}: no counters for "
                    f"{r['role']} point {r['point']}",
                    file=err,
                )
            if a.fail_on_alarm:
                return EXIT_ALARM
        return 0
    if a.cmd == "delay":
        df = engine.execute_by_periods(
            con, ds, lambda d: metrics.delay(d, members, aliases), a.batch_periods
        )
        output.emit(df, a.format, a.output)
        return 0
    if a.cmd == "paths":
        expr = metrics.paths(ds, aliases)
        df = con.execute(expr)
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
        output.emit(df, a.format, a.output)
        return 0
    if a.cmd == "report":
        from . import report

        loss = con.execute(metrics.loss(ds, members, aliases))
        miss = con.execute(metrics.missing_points(ds, members, aliases))
        dl = con.execute(metrics.delay(ds, members, aliases))
        delays = con.execute(metrics.matched_delays(ds, members, aliases).limit(200_000))
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
        print(f"report: {a.html}", file=err)
        return 0
    raise UsageError(f"unknown command {a.cmd}")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"flowplane-analytics: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
