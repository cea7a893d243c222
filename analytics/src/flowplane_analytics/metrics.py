"""The metrics, each defined once as an Ibis expression and run by whichever backend the
tables come from (DuckDB or Spark).

Notation for cluster K in period n, with input MPs I(K) and output MPs O(K), and P_m(n) the
packets counted at MP m (summed over FlowMonIDs):

    loss(K, n)      = Σ_{m∈I(K)} P_m(n) − Σ_{m∈O(K)} P_m(n)
    loss_rate(K, n) = loss(K, n) / Σ_{m∈I(K)} P_m(n)

Alarms: ``missing_points`` when a point of K has no counters row in period n (loss is then
NULL, never computed from the points that are there: a probe that recorded nothing),
``negative_loss`` when loss < 0, ``outage`` when packets entered K and none left it (loss rate
1: every point there, counting zero at the outputs). The
delay table carries the same ``missing_points`` (its delay then comes from the points there).

Delay: with B(K, n) = max hash_bits over K's points in period n and mask = 2^B − 1, a sample
is valid when hash & mask = hash_ref & mask. A valid sample at an input and one at an output
with the same hash form a pair; the pair is a match when their 5-tuples are equal (else a
collision, rejected and counted). Hashes seen more than once at K's inputs, or more than once
at its outputs, in a period are ambiguous and dropped; ``pairs`` counts the rest, ``matched``
those without a collision. delay = tai_out − tai_in;
jitter = mean |delay_i − delay_{i−1}| over the matches ordered by tai_in (RFC 3393 IPDV).
Percentiles are nearest-rank: p_q = the delay at 1-based rank ⌈q·N/100⌉ by delay, an integer
that both engines compute identically (``reductions.nearest_rank``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import ibis
import ibis.expr.types as ir

from .clusters import Cluster
from .engine import MP_KEY, TUPLE, Dataset
from .reductions import nearest_rank
from .topology import Network

__all__ = ["TUPLE"]


def membership(net: Network, clusters: Sequence[Cluster]) -> tuple[ir.Table, ir.Table]:
    """(members, aliases): members = (cluster, role, point) for every input and output point of
    every cluster, with the cluster's count of them (points); aliases = (point, probe, ifname,
    direction) for every name a probe may record a point under (eth0, and a lab's kernel name
    fp<tag>-eth0)."""
    rows: dict[str, list[Any]] = {
        "cluster": [],
        "role": [],
        "point": [],
        "ci": [],
        "is_in": [],
        "points": [],
    }
    for ci, c in enumerate(clusters):
        for role, pts in (("in", c.inputs), ("out", c.outputs)):
            for p in pts:
                rows["cluster"].append(c.id)
                rows["role"].append(role)
                rows["point"].append(p.id)
                rows["ci"].append(ci)
                rows["is_in"].append(role == "in")
                rows["points"].append(len(c.inputs) + len(c.outputs))
    al: dict[str, list[Any]] = {"point": [], "probe": [], "ifname": [], "direction": []}
    for p in net.points():
        for name in net.ifname_aliases(p):
            al["point"].append(p.id)
            al["probe"].append(p.probe)
            al["ifname"].append(name)
            al["direction"].append(p.direction)
    members = ibis.memtable(
        rows,
        schema={
            "cluster": "string",
            "role": "string",
            "point": "string",
            "ci": "int32",  # the cluster's index: the hot joins and groupings use it
            "is_in": "boolean",
            "points": "int64",
        },
    )
    aliases = ibis.memtable(
        al, schema={"point": "string", "probe": "string", "ifname": "string", "direction": "string"}
    )
    return members, aliases


def _point_counters(ds: Dataset, aliases: ir.Table) -> ir.Table:
    c = ds.counters
    j = c.join(aliases, MP_KEY)
    return j.group_by(["period", "point"]).agg(
        packets=j.packets.sum(),
        hash_bits=j.hash_bits.max(),
        hash_ref=j.hash_ref.min(),
        hash_ref_max=j.hash_ref_max.max(),
    )


def _expected(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Every point of every cluster in every period any probe recorded, with its packets: NULL
    when the point has no counters row in that period (a missing point)."""
    pc = _point_counters(ds, aliases)
    periods = ds.counters.select("period").distinct()
    expected = members.cross_join(periods)
    return expected.left_join(pc, ["period", "point"]).select(
        "ci", "cluster", "role", "point", "period", "packets"
    )


def loss(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Per period and cluster: in/out packets, loss, loss rate, points, missing, alarm."""
    j = _expected(ds, members, aliases)
    is_in = j.role == "in"
    missing = j.packets.isnull()
    per = j.group_by(["period", "cluster"]).agg(
        in_points=is_in.cast("int64").sum(),
        out_points=(~is_in).cast("int64").sum(),
        missing=missing.cast("int64").sum(),
        in_packets=ibis.ifelse(is_in, j.packets, 0).sum(),
        out_packets=ibis.ifelse(~is_in, j.packets, 0).sum(),
    )
    complete = per.missing == 0
    lossv = ibis.ifelse(complete, per.in_packets - per.out_packets, ibis.null("int64"))
    per = per.mutate(
        in_packets=ibis.ifelse(complete, per.in_packets, ibis.null("int64")),
        out_packets=ibis.ifelse(complete, per.out_packets, ibis.null("int64")),
        loss=lossv,
    )
    per = per.mutate(
        loss_rate=ibis.ifelse(
            per.in_packets > 0,
            per.loss.cast("float64") / per.in_packets.cast("float64"),
            ibis.null("float64"),
        ),
        alarm=ibis.cases(
            (per.missing > 0, "missing_points"),
            (per.loss < 0, "negative_loss"),
            ((per.in_packets > 0) & (per.out_packets == 0), "outage"),
            else_="",
        ),
    )
    return per.select(
        "period",
        "cluster",
        "in_points",
        "out_points",
        "in_packets",
        "out_packets",
        "loss",
        "loss_rate",
        "missing",
        "alarm",
    ).order_by(["period", "cluster"])


def period_gaps(periods: Iterable[int]) -> list[tuple[int, int]]:
    """The runs (first, last) of periods between the first and the last recorded that no probe
    recorded: an outage of every probe or of the collection, which no row of a table shows
    (the tables hold the periods some probe recorded). Periods are numbered consecutively
    (⌊TAI / period length⌋), so a gap is a jump in the numbers."""
    ps = sorted({int(p) for p in periods})
    return [(a + 1, b - 1) for a, b in itertools.pairwise(ps) if b - a > 1]


def describe_gap(gap: tuple[int, int]) -> str:
    first, last = gap
    if first == last:
        return f"period {first}: no probe recorded it"
    return f"periods {first}..{last}: no probe recorded them ({last - first + 1} periods)"


def missing_points(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Each (period, cluster, point) whose counters row is absent."""
    pc = _point_counters(ds, aliases)
    periods = ds.counters.select("period").distinct()
    expected = members.cross_join(periods)
    miss = expected.anti_join(pc, ["period", "point"])
    return miss.select("period", "cluster", "role", "point").order_by(
        ["period", "cluster", "point"]
    )


def _mp_points(ds: Dataset, aliases: ir.Table) -> ir.Table:
    """(mp, point): the dataset's measurement-point ids that are points of the network."""
    return ds.mps.join(aliases, MP_KEY).select("mp", "point")


def _cluster_periods(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Per cluster and period in which a point of the cluster has a counters row: B(K, n)
    (bits), the hash_ref, and ``missing``, the cluster's points with no counters row (as
    loss's, counted against the cluster's size rather than by a join with every period)."""
    pc = _point_counters(ds, aliases)
    mc = members.join(pc, "point")
    return mc.group_by(["ci", "period"]).agg(
        bits=mc.hash_bits.max(),
        ref=mc.hash_ref.min(),
        # no join after the grouping: Spark's adaptive plan broadcasts only a shuffle's output
        missing=mc.points.max() - mc.packets.count(),
    )


def _valid_samples(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Samples at the clusters' points that match at B(K, n) = the largest hash_bits of the
    cluster's points in the period: (ci, is_in, period, mp, hash, tai_ns, flow), one row per
    sample and cluster the sample's point belongs to."""
    bits = _cluster_periods(ds, members, aliases).select("ci", "period", "bits", "ref")
    # One small table per join (mp → probe interface → point → clusters): Spark sizes a join
    # of joins as the product of their sizes, so a prejoined mp → cluster table is never
    # broadcast and the samples are shuffled to meet it.
    mem = members.select("point", "ci", "is_in")
    sm = ds.samples.join(ds.mps, "mp").join(aliases, MP_KEY).join(mem, "point")
    sm = sm.join(bits, ["ci", "period"])
    mask = (ibis.literal(1, "int64") << sm.bits.cast("int64")) - 1
    sm = sm.filter((sm.hash & mask) == (sm.ref & mask))
    return sm.select("ci", "is_in", "period", "mp", "hash", "tai_ns", "flow")


def _pairs(ds: Dataset, members: ir.Table, aliases: ir.Table, points: bool) -> ir.Table:
    """Every in/out pair with the same hash in a cluster and period, unambiguous hashes only
    (exactly one valid sample at the cluster's inputs and one at its outputs): one grouping by
    (cluster, period, hash) with conditional aggregates. ``collision``: the 5-tuples differ
    (compared as ids of distinct 5-tuples; NULL when a 5-tuple has a NULL field)."""
    v = _valid_samples(ds, members, aliases)

    def side(is_in: bool, col: ir.Column) -> ir.Value:
        return ibis.ifelse(v.is_in == is_in, col, ibis.null(col.type())).max()

    aggs: dict[str, ir.Value] = {
        "n_in": v.is_in.cast("int64").sum(),
        "n": v.count(),
        "in_ns": side(True, v.tai_ns),
        "out_ns": side(False, v.tai_ns),
        "in_flow": side(True, v.flow),
        "out_flow": side(False, v.flow),
    }
    if points:
        aggs |= {"in_mp": side(True, v.mp), "out_mp": side(False, v.mp)}
    g = v.group_by(["ci", "period", "hash"]).agg(**aggs)
    p = g.filter((g.n_in == 1) & (g.n == 2))
    return p.mutate(collision=p.in_flow != p.out_flow, delay_ns=p.out_ns - p.in_ns)


def _names(members: ir.Table) -> ir.Table:
    return members.select("ci", "cluster").distinct()


def pairs(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Every in/out pair, with the cluster, the points and the 5-tuples by name."""
    p = _pairs(ds, members, aliases, points=True).join(_names(members), "ci")
    mp = _mp_points(ds, aliases)
    fl = ds.flows
    ip = mp.select(in_mp=mp.mp, in_point=mp.point)
    op = mp.select(out_mp=mp.mp, out_point=mp.point)
    fi = fl.select(in_flow=fl.flow, **{f"in_{c}": fl[c] for c in TUPLE})
    fo = fl.select(out_flow=fl.flow, **{f"out_{c}": fl[c] for c in TUPLE})
    p = p.join(ip, "in_mp").join(op, "out_mp").left_join(fi, "in_flow").left_join(fo, "out_flow")
    return p.select(
        "cluster",
        "period",
        "hash",
        "in_point",
        "in_ns",
        *[f"in_{c}" for c in TUPLE],
        "out_point",
        "out_ns",
        *[f"out_{c}" for c in TUPLE],
        "collision",
        "delay_ns",
    )


def delay(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Per period and cluster: matched samples, collisions rejected, delay mean/min/max/p50/p99
    and jitter, in nanoseconds; alarm ``missing_points`` when a point of the cluster has no
    counters row in the period (as loss's: the delay then comes from the points that are
    there), else "". A row per (period, cluster) with at least one pair or with points missing
    (no pair: 0 pairs, the statistics NULL)."""
    p = _pairs(ds, members, aliases, points=False)
    # Only what the window needs and the statistics read: DuckDB sorts every column it is given.
    p = p.select("ci", "period", "hash", "in_ns", "collision", "delay_ns")
    # One pass over the pairs (Spark would compute them again for a second consumer): the
    # window is partitioned by collision too, so over the matches it sees only matches.
    w = ibis.window(group_by=["ci", "period", "collision"], order_by=[p.in_ns, p.hash])
    p = p.mutate(ipdv=(p.delay_ns - p.delay_ns.lag().over(w)).abs())
    match = ~p.collision.fill_null(True)  # a NULL 5-tuple field: not a match

    def of_matches(v: ir.Value) -> ir.Value:
        return ibis.ifelse(match, v, ibis.null(v.type()))

    def mean(v: ir.IntegerValue) -> ir.FloatingValue:
        # an integer sum over a count, divided once: AVG's own rounding differs by engine (a
        # double accumulator, or a 128-bit sum divided in extended precision) in the last bit
        n = v.count()
        return ibis.ifelse(n > 0, v.sum().cast("float64") / n.cast("float64"), None)

    st = p.group_by(["ci", "period"]).agg(
        pairs=p.count(),
        collisions=p.collision.cast("int64").sum(),
        matched=match.cast("int64").sum(),
        mean_ns=mean(of_matches(p.delay_ns)),
        min_ns=of_matches(p.delay_ns).min(),
        max_ns=of_matches(p.delay_ns).max(),
        p50_ns=nearest_rank(of_matches(p.delay_ns), 50),
        p99_ns=nearest_rank(of_matches(p.delay_ns), 99),
        jitter_ns=mean(of_matches(p.ipdv)),
    )
    # A (cluster, period) with points missing has a row even without a pair, all its points
    # missing included (no row in _cluster_periods): a missing probe's clusters must not vanish
    # from the table. The joins are on small tables: clusters × periods.
    cp = _cluster_periods(ds, members, aliases).select("ci", "period", "missing")
    periods = ds.counters.select("period").distinct()
    out = _names(members).cross_join(periods).left_join(cp, ["ci", "period"])
    out = out.select("ci", "cluster", "period", missing=out.missing.fill_null(1))
    out = out.left_join(st, ["ci", "period"])
    out = out.filter(out.pairs.notnull() | (out.missing > 0))
    out = out.select(
        "period",
        "cluster",
        *[out[c].fill_null(0).name(c) for c in ("pairs", "collisions", "matched")],
        "mean_ns",
        "min_ns",
        "max_ns",
        "p50_ns",
        "p99_ns",
        "jitter_ns",
        alarm=ibis.cases((out.missing > 0, "missing_points"), else_=""),
    )
    return out.order_by(["period", "cluster"])


def matched_delays(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    p = pairs(ds, members, aliases)
    return p.filter(~p.collision).select(
        "period", "cluster", "hash", "in_point", "out_point", "in_ns", "out_ns", "delay_ns"
    )


def paths(ds: Dataset, aliases: ir.Table) -> ir.Table:
    """Each sampled packet's records ordered by timestamp: one row per hop. A packet is a
    (period, hash, 5-tuple) valid at the period's largest hash_bits over all points."""
    pc = _point_counters(ds, aliases)
    bits = pc.group_by("period").agg(bits=pc.hash_bits.max(), ref=pc.hash_ref.min())
    s = ds.samples.join(_mp_points(ds, aliases), "mp").left_join(ds.flows, "flow")
    s = s.select("period", "point", "hash", "tai_ns", *TUPLE).join(bits, "period")
    mask = (ibis.literal(1, "int64") << s.bits.cast("int64")) - 1
    s = s.filter((s.hash & mask) == (s.ref & mask))
    key = ["period", "hash", *TUPLE]
    w = ibis.window(group_by=key, order_by=[s.tai_ns, s.point])
    wf = ibis.window(group_by=key)
    s = s.mutate(
        hop=ibis.row_number().over(w) + 1, since_first_ns=s.tai_ns - s.tai_ns.min().over(wf)
    )
    return s.select(*key, "hop", "point", "tai_ns", "since_first_ns").order_by([*key, "hop"])


def hash_ref_alarms(ds: Dataset, aliases: ir.Table) -> ir.Table:
    """Periods whose points disagree on hash_ref: their samples cannot be matched."""
    pc = _point_counters(ds, aliases)
    per = pc.group_by("period").agg(lo=pc.hash_ref.min(), hi=pc.hash_ref_max.max())
    return per.filter(per.lo != per.hi).select("period", "lo", "hi")
