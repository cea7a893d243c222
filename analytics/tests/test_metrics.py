"""Loss and delay against injected ground truth, on both engines, with identical answers."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import ENGINES, lab6_links

from flowplane_analytics import clusters
from flowplane_analytics.metrics import TUPLE


@pytest.mark.parametrize("eng", ENGINES)
def test_loss_equals_injected_drops(eng, results, truth_dataset, lab6, lab6_clusters):
    _, truth = truth_dataset
    df = results(eng)["loss"]
    want = {(n, c.id): truth.loss_of(n, c.links) for n in truth.periods for c in lab6_clusters}
    got = {(int(r.period), r.cluster): int(r.loss) for r in df.itertuples()}
    assert got == want  # exact: every cluster, the super-cluster and end to end, every period
    assert (df["alarm"] == "").all() and (df["missing"] == 0).all()
    e2e = df[df.cluster == "e2e"].set_index("period")["loss"]
    for n in truth.periods:
        assert e2e[n] == sum(v for (p, _), v in truth.drops.items() if p == n)
    # the 123 drops injected on r3→r5 in the second period are in that wire's cluster
    c = clusters.cluster_of_link(lab6_clusters)[lab6_links(lab6, "r3", "r5")[0]]
    assert int(df[(df.cluster == c) & (df.period == truth.periods[1])]["loss"].iloc[0]) >= 123
    # clusters without any drop show exactly 0
    assert (df[df.cluster.isin([c for (_, c), v in want.items() if v == 0])]["loss"] == 0).all()


def _norm(df: pd.DataFrame, keys) -> pd.DataFrame:
    return df.sort_values(keys).reset_index(drop=True)


def test_engines_identical(results):
    d, s = results("duckdb"), results("spark")
    k = ["period", "cluster"]
    pd.testing.assert_frame_equal(_norm(d["loss"], k), _norm(s["loss"], k), check_dtype=False)
    pd.testing.assert_frame_equal(
        _norm(d["delay"], k), _norm(s["delay"], k), check_dtype=False, check_exact=True
    )
    pk = ["period", "hash", *TUPLE, "hop"]
    pd.testing.assert_frame_equal(
        _norm(d["paths"], pk), _norm(s["paths"], pk), check_dtype=False, check_exact=True
    )


def independent_e2e(root, cs):
    """End-to-end matches recomputed with pandas straight from the Parquet files: samples at
    the e2e points valid at the longest hash length among those points, paired by hash."""
    e2e = next(c for c in cs if c.id == "e2e")
    ins = {p.id for p in e2e.inputs}
    outs = {p.id for p in e2e.outputs}

    def pid(df):
        return df.probe.astype(str) + ":" + df.ifname.str.split("-").str[-1] + ":" + df.direction

    s = pq.read_table(root / "samples").to_pandas()
    c = pq.read_table(root / "counters").to_pandas()
    s["point"], c["point"] = pid(s), pid(c)
    s["period"], c["period"] = s.period.astype(int), c.period.astype(int)
    bits = c[c.point.isin(ins | outs)].groupby("period").hash_bits.max()
    ref = int(c.hash_ref.iloc[0])
    mask = s.period.map(lambda n: (1 << int(bits[n])) - 1)
    s = s[(s.hash & mask) == (ref & mask)]
    a = s[s.point.isin(ins)]
    b = s[s.point.isin(outs)]
    m = a.merge(b, on=["period", "hash"], suffixes=("_in", "_out"))
    same = m[[f"{x}_in" for x in TUPLE]].to_numpy() == m[[f"{x}_out" for x in TUPLE]].to_numpy()
    m["collision"] = ~same.all(axis=1)
    m["delay"] = m.tai_ns_out - m.tai_ns_in
    return m


@pytest.mark.parametrize("eng", ENGINES)
def test_delay_against_truth(eng, results, truth_dataset, lab6, lab6_clusters):
    root, truth = truth_dataset
    df = results(eng)["delay"].set_index(["period", "cluster"])
    c_r3r4 = clusters.cluster_of_link(lab6_clusters)[lab6_links(lab6, "r3", "r4")[0]]
    ind = independent_e2e(root, lab6_clusters)
    for n in truth.periods:
        # a one-link cluster: every matched delay is the link's delay, exactly
        r = df.loc[(n, c_r3r4)]
        assert r.matched > 0 and r.mean_ns == r.min_ns == r.max_ns == r.p99_ns == 40_000
        assert r.jitter_ns == 0
        for c in lab6_clusters:
            if c.id.startswith("C") and c.label.startswith("node"):
                rr = df.loc[(n, c.id)]
                assert rr.min_ns == rr.max_ns == 10_000
        # end to end: collisions rejected, the rest agree with pandas
        i = ind[ind.period == n]
        e = df.loc[(n, "e2e")]
        assert e.collisions == i.collision.sum() > 0
        good = sorted(i[~i.collision].delay)
        assert e.matched == len(good)
        assert e.mean_ns == pytest.approx(sum(good) / len(good), rel=1e-12)
        assert (e.min_ns, e.max_ns) == (good[0], good[-1])
        assert e.p50_ns == good[(len(good) * 50 + 99) // 100 - 1]
        assert e.p99_ns == good[(len(good) * 99 + 99) // 100 - 1]
        # the shortest path crosses one router; the longest four (40 µs is r3→r4 only)
        assert e.min_ns == 10_000
        assert e.max_ns == 4 * 10_000 + 3 * 50_000


def test_hash_length_filter(results, truth_dataset, lab6_clusters):
    """With grown hash lengths, only samples matching at the cluster's longest hash length
    are matched: recount them with pandas for one wire cluster."""
    root, _ = truth_dataset
    df = results("duckdb")["delay"].set_index(["period", "cluster"])
    s = pq.read_table(root / "samples").to_pandas()
    c = pq.read_table(root / "counters").to_pandas()
    wire = next(x for x in lab6_clusters if x.label.startswith("r3:eth3:out"))
    pin, pout = wire.inputs[0], wire.outputs[0]

    def at(df, p):
        return df[
            (df.probe == p.probe)
            & (df.ifname == f"fpam6-{p.ifname}")
            & (df.direction == p.direction)
        ]

    grown = 0
    for n, g in s.groupby("period"):
        cc = c[c.period.astype(int) == int(n)]
        bits = int(pd.concat([at(cc, pin), at(cc, pout)]).hash_bits.max())
        grown += bits > 3
        ref = int(cc.hash_ref.iloc[0])
        mask = (1 << bits) - 1
        ok = g[(g.hash & mask) == (ref & mask)]
        m = at(ok, pin).merge(at(ok, pout), on=["hash", *TUPLE])
        assert df.loc[(int(n), wire.id)].matched == len(m)
        assert len(at(g, pin)) > len(m) or bits == 3
    assert grown  # the case is exercised


@pytest.mark.parametrize("eng", ENGINES)
def test_compact_layout_same_answers(eng, cons, results, truth_dataset, lab6, lab6_clusters):
    """`compact` (run by the engine itself) rewrites the records into root/compact/; loss,
    delay and paths read from it equal those read from the partitioned records, exactly."""
    import shutil

    from conftest import Run

    from flowplane_analytics import engine

    src, _ = truth_dataset
    root = src.parent / f"compact-{eng}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(src, root)
    con = cons(eng)
    meta = engine.compact(con, root)
    assert meta["counter_files"] == len(list(root.glob("counters/probe=*/period=*/*.parquet")))
    assert engine.load(con, root).layout == "compact"
    r = Run(con, root, lab6, lab6_clusters)
    want = results(eng)
    k = ["period", "cluster"]
    pk = ["period", "hash", *TUPLE, "hop"]
    pd.testing.assert_frame_equal(_norm(r.loss(), k), _norm(want["loss"], k), check_dtype=False)
    pd.testing.assert_frame_equal(
        _norm(r.delay(), k), _norm(want["delay"], k), check_dtype=False, check_exact=True
    )
    pd.testing.assert_frame_equal(
        _norm(r.paths(), pk), _norm(want["paths"], pk), check_dtype=False, check_exact=True
    )
    # the samples are integers only; the counters' sums stay integers
    d = engine.load(con, root)
    assert all(t.is_integer() for t in d.samples.schema().types), d.samples.schema()
    assert d.counters.schema()["packets"].is_integer()


@pytest.mark.parametrize("eng", ENGINES)
def test_batched_by_periods_same_answers(eng, cons, results, truth_dataset, lab6, lab6_clusters):
    """loss and delay run in queries of two periods each equal the single query (a batch of
    one period: test_auto_batches_by_samples)."""
    from flowplane_analytics import engine, metrics

    root, _ = truth_dataset
    con = cons(eng)
    ds = engine.load(con, root)
    m, a = metrics.membership(lab6, lab6_clusters)
    k = ["period", "cluster"]
    for name, f in (("loss", metrics.loss), ("delay", metrics.delay)):
        got = engine.execute_by_periods(con, ds, lambda d, f=f: f(d, m, a), 2)
        pd.testing.assert_frame_equal(_norm(got, k), _norm(results(eng)[name], k), check_exact=True)


def test_auto_batches_by_samples(monkeypatch, cons, results, truth_dataset, lab6, lab6_clusters):
    """DuckDB on a compacted dataset sizes its batches by samples (engine.AUTO_BATCH_SAMPLES):
    one query when the dataset holds fewer, batches of periods otherwise; the same answers."""
    import shutil

    from flowplane_analytics import engine, metrics

    src, _ = truth_dataset
    root = src.parent / "compact-auto-batch"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(src, root)
    con = cons("duckdb")
    engine.compact(con, root)
    ds = engine.load(con, root)
    m, a = metrics.membership(lab6, lab6_clusters)
    n = int(con.execute(ds.samples.count()))
    periods = int(con.execute(ds.counters.period.nunique()))
    built: list[int] = []

    def loss(d):
        built.append(1)
        return metrics.loss(d, m, a)

    k = ["period", "cluster"]
    # a batch per period, then two periods per query, then one query for the whole dataset
    for size, queries in ((1, periods), (2 * n // periods + 1, -(-periods // 2)), (n, 1)):
        monkeypatch.setattr(engine, "AUTO_BATCH_SAMPLES", size)
        built.clear()
        got = engine.execute_by_periods(con, ds, loss, None)
        assert len(built) == queries, size
        pd.testing.assert_frame_equal(
            _norm(got, k), _norm(results("duckdb")["loss"], k), check_exact=True
        )


def test_execute_orders_as_duckdb(cons):
    """Spark's answer is sorted in pandas (engine.execute), in the ORDER BY's order: mixed
    directions, NULLs first or last as asked, ties kept stable by the later keys."""
    import ibis

    from flowplane_analytics import engine

    t = ibis.memtable(
        {"a": [2, 1, None, 2, 1, None], "b": ["x", "y", "z", None, "x", "y"], "c": range(6)}
    )
    exprs = [
        t.order_by(["a", ibis.desc("b")]),
        t.order_by([ibis.desc("a", nulls_first=True), "c"]),
        t.order_by([ibis.asc("b", nulls_first=True), ibis.desc("c")]),
    ]
    for e in exprs:
        want = cons("duckdb").execute(e)
        got = engine.execute(cons("spark"), e)
        pd.testing.assert_frame_equal(want, got, check_dtype=False)


@pytest.mark.parametrize("eng", ENGINES)
def test_nearest_rank_every_size(eng, cons):
    """Each engine's lowering of nearest_rank is the value at rank ceil(pct·N/100), for every
    group size 1..300 (ranks where pct·N/100 is an integer included), with NULLs ignored and an
    all-NULL group NULL."""
    import random

    import ibis

    from flowplane_analytics.reductions import nearest_rank

    rnd = random.Random(9343)
    g: list[int] = []
    v: list[int | None] = []
    for n in range(1, 301):
        vals = [rnd.randint(-500, 500) for _ in range(n)] + [None] * (n % 3)
        rnd.shuffle(vals)
        g += [n] * len(vals)
        v += vals
    g += [0, 0]
    v += [None, None]
    t = ibis.memtable({"g": g, "v": v}, schema={"g": "int64", "v": "int64"})
    pcts = (1, 50, 90, 99, 100)
    q = t.group_by("g").agg(**{f"p{p}": nearest_rank(t.v, p) for p in pcts})
    got = cons(eng).execute(q).set_index("g")
    for n in range(1, 301):
        vals = sorted(x for x, k in zip(v, g, strict=True) if k == n and x is not None)
        for p in pcts:
            assert got.loc[n, f"p{p}"] == vals[(n * p + 99) // 100 - 1], (n, p)
    assert pd.isna(got.loc[0, "p50"])
    with pytest.raises(ValueError):
        nearest_rank(t.v, 0)
