"""The metrics, each defined once as an Ibis expression and run by whichever backend the
tables come from (DuckDB or Spark).

Notation for cluster K in period n, with input MPs I(K) and output MPs O(K), and P_m(n) the
packets counted at MP m (summed over FlowMonIDs):

    loss(K, n)      = Σ_{m∈I(K)} P_m(n) − Σ_{m∈O(K)} P_m(n)
    loss_rate(K, n) = loss(K, n) / Σ_{m∈I(K)} P_m(n)

Alarms: ``missing_points`` when a point of K has no counters row in period n (loss is then
NULL, never computed from the points that are there), ``negative_loss`` when loss < 0.

Delay: with B(K, n) = max hash_bits over K's points in period n and mask = 2^B − 1, a sample
is valid when hash & mask = hash_ref & mask. A valid sample at an input and one at an output
with the same hash form a pair; the pair is a match when their 5-tuples are equal (else a
collision, rejected and counted). Hashes seen more than once at K's inputs, or more than once
at its outputs, in a period are ambiguous and dropped. delay = tai_out − tai_in;
jitter = mean |delay_i − delay_{i−1}| over the matches ordered by tai_in (RFC 3393 IPDV).
Percentiles are nearest-rank: p_q = the smallest delay whose rank (1-based, by delay) is at
least ⌈q·N/100⌉, an integer that both engines compute identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ibis
import ibis.expr.types as ir

from .clusters import Cluster
from .engine import Dataset
from .topology import Network

TUPLE = ("src_addr", "dst_addr", "proto", "src_port", "dst_port")


def membership(net: Network, clusters: Sequence[Cluster]) -> tuple[ir.Table, ir.Table]:
    """(members, aliases): members = (cluster, role, point) for every input and output point of
    every cluster; aliases = (point, probe, ifname, direction) for every name a probe may record
    a point under (eth0, and a lab's kernel name fp<tag>-eth0)."""
    rows: dict[str, list[Any]] = {"cluster": [], "role": [], "point": []}
    for c in clusters:
        for role, pts in (("in", c.inputs), ("out", c.outputs)):
            for p in pts:
                rows["cluster"].append(c.id)
                rows["role"].append(role)
                rows["point"].append(p.id)
    al: dict[str, list[Any]] = {"point": [], "probe": [], "ifname": [], "direction": []}
    for p in net.points():
        for name in net.ifname_aliases(p):
            al["point"].append(p.id)
            al["probe"].append(p.probe)
            al["ifname"].append(name)
            al["direction"].append(p.direction)
    members = ibis.memtable(rows, schema={"cluster": "string", "role": "string", "point": "string"})
    aliases = ibis.memtable(
        al, schema={"point": "string", "probe": "string", "ifname": "string", "direction": "string"}
    )
    return members, aliases


def _point_counters(ds: Dataset, aliases: ir.Table) -> ir.Table:
    c = ds.counters
    j = c.join(aliases, ["probe", "ifname", "direction"])
    return j.group_by(["period", "point"]).agg(
        packets=j.packets.sum(),
        hash_bits=j.hash_bits.max(),
        hash_ref=j.hash_ref.min(),
        hash_ref_max=j.hash_ref_max.max(),
    )


def loss(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Per period and cluster: in/out packets, loss, loss rate, points, missing, alarm."""
    pc = _point_counters(ds, aliases)
    periods = ds.counters.select("period").distinct()
    expected = members.cross_join(periods)
    j = expected.left_join(pc, ["period", "point"]).select(
        "cluster", "role", "point", "period", "packets"
    )
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


def missing_points(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Each (period, cluster, point) whose counters row is absent."""
    pc = _point_counters(ds, aliases)
    periods = ds.counters.select("period").distinct()
    expected = members.cross_join(periods)
    miss = expected.anti_join(pc, ["period", "point"])
    return miss.select("period", "cluster", "role", "point").order_by(
        ["period", "cluster", "point"]
    )


def _valid_samples(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Samples at the clusters' points that match at B(K, n) = the largest hash_bits of the
    cluster's points in the period: (cluster, role, period, point, hash, tai_ns, 5-tuple)."""
    pc = _point_counters(ds, aliases)
    mc = members.join(pc, "point")
    bits = mc.group_by(["cluster", "period"]).agg(bits=mc.hash_bits.max(), ref=mc.hash_ref.min())
    s = ds.samples.join(aliases, ["probe", "ifname", "direction"]).select(
        "period", "point", "hash", "tai_ns", *TUPLE
    )
    sm = s.join(members, "point").join(bits, ["cluster", "period"])
    mask = (ibis.literal(1, "int64") << sm.bits.cast("int64")) - 1
    sm = sm.filter((sm.hash & mask) == (sm.ref & mask))
    return sm.select("cluster", "role", "period", "point", "hash", "tai_ns", *TUPLE)


def _unique_hashes(v: ir.Table, role: str) -> ir.Table:
    side = v.filter(v.role == role)
    n = side.group_by(["cluster", "period", "hash"]).agg(n=side.count())
    return side.semi_join(n.filter(n.n == 1), ["cluster", "period", "hash"])


def pairs(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Every in/out pair with the same hash in a cluster and period, unambiguous hashes only;
    ``collision`` says the 5-tuples differ."""
    v = _valid_samples(ds, members, aliases)
    ins = _unique_hashes(v, "in")
    outs = _unique_hashes(v, "out")
    ins = ins.select(
        "cluster",
        "period",
        "hash",
        in_point=ins.point,
        in_ns=ins.tai_ns,
        **{f"in_{c}": ins[c] for c in TUPLE},
    )
    outs = outs.select(
        "cluster",
        "period",
        "hash",
        out_point=outs.point,
        out_ns=outs.tai_ns,
        **{f"out_{c}": outs[c] for c in TUPLE},
    )
    p = ins.join(outs, ["cluster", "period", "hash"])
    same = ibis.and_(*[p[f"in_{c}"] == p[f"out_{c}"] for c in TUPLE])
    return p.mutate(collision=~same, delay_ns=p.out_ns - p.in_ns)


def delay(ds: Dataset, members: ir.Table, aliases: ir.Table) -> ir.Table:
    """Per period and cluster: matched samples, collisions rejected, delay mean/min/max/p50/p99
    and jitter, in nanoseconds."""
    p = pairs(ds, members, aliases)
    coll = p.group_by(["cluster", "period"]).agg(
        pairs=p.count(), collisions=p.collision.cast("int64").sum()
    )
    m = p.filter(~p.collision)
    w = ibis.window(group_by=["cluster", "period"], order_by=[m.in_ns, m.hash])
    wr = ibis.window(group_by=["cluster", "period"], order_by=[m.delay_ns, m.in_ns, m.hash])
    wn = ibis.window(group_by=["cluster", "period"])
    m = m.mutate(
        ipdv=(m.delay_ns - m.delay_ns.lag().over(w)).abs(),
        rank=ibis.row_number().over(wr) + 1,  # 1-based rank by delay
        n=m.count().over(wn),
    )

    def nearest_rank(pct: int) -> ir.IntegerValue:
        # the smallest delay whose rank is at least ceil(pct/100 · n), in integers
        need = (m.n * pct + 99) // 100
        return ibis.ifelse(m.rank >= need, m.delay_ns, ibis.null("int64")).min()

    st = m.group_by(["cluster", "period"]).agg(
        matched=m.count(),
        mean_ns=m.delay_ns.mean(),
        min_ns=m.delay_ns.min(),
        max_ns=m.delay_ns.max(),
        p50_ns=nearest_rank(50),
        p99_ns=nearest_rank(99),
        jitter_ns=m.ipdv.mean(),
    )
    out = coll.left_join(st, ["cluster", "period"]).select(
        "period",
        "cluster",
        "pairs",
        "collisions",
        "matched",
        "mean_ns",
        "min_ns",
        "max_ns",
        "p50_ns",
        "p99_ns",
        "jitter_ns",
    )
    return out.mutate(matched=out.matched.fill_null(0)).order_by(["period", "cluster"])


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
    s = ds.samples.join(aliases, ["probe", "ifname", "direction"]).select(
        "period", "point", "hash", "tai_ns", *TUPLE
    )
    s = s.join(bits, "period")
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
