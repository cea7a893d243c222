"""Negative loss, outages and missing points raise alarms; loss is never computed from part of
a cluster's points, and an outage (points there, counting zero) is not a missing point."""

from __future__ import annotations

import pytest
from conftest import ENGINES, Run, lab6_links

from flowplane_analytics import clusters, synth


@pytest.fixture(scope="module")
def alarm_dataset(tmp_path_factory, lab6):
    root = tmp_path_factory.mktemp("alarms")
    spec = synth.Spec(
        periods=3,
        packets=500,
        hash_bits=4,
        seed=5,
        # period 0: r4's out point toward r6 counts 9 packets too many (negative loss in r4's
        # cluster, +9 on the wire r4→r6); period 1: r3 has no row for eth3 out;
        # period 2: r5 wrote no record at all.
        extra_packets={(0, "r4:eth2:out"): 9},
        missing_points={(1, "r3:eth3:out")},
        missing_probes={(2, "r5")},
    )
    return root, synth.generate(lab6, spec, root)


@pytest.mark.parametrize("eng", ENGINES)
def test_alarms(eng, cons, alarm_dataset, lab6):
    root, truth = alarm_dataset
    cs = clusters.resolve(lab6)
    by_label = {c.label: c.id for c in cs}
    wire = by_label["r4:eth2:out → r6:eth0:in"]
    r4 = by_label["node r4"]
    df = Run(cons(eng), root, lab6, cs).loss().set_index(["period", "cluster"])
    n0, n1, n2 = truth.periods
    # the extra count is an output of r4's cluster (more out than in) and the wire's input
    assert df.loc[(n0, r4)].alarm == "negative_loss" and df.loc[(n0, r4)].loss == -9
    assert df.loc[(n0, wire)].loss == 9 and df.loc[(n0, wire)].alarm == ""
    assert df.loc[(n0, "e2e")].alarm == ""
    # r3's eth3 out is an output of r3's cluster and the input of the wire r3→r5
    for cid in (by_label["node r3"], by_label["r3:eth3:out → r5:eth0:in"]):
        row = df.loc[(n1, cid)]
        assert row.alarm == "missing_points" and row.missing == 1
        assert row.loss != row.loss or row.loss is None  # NULL, not a partial sum
    # period n2: every cluster touching r5 (and end to end, h4 is behind r5) is missing points
    r5 = {c.id for c in cs if any(p.probe == "r5" for p in c.points)}
    bad = set(df.loc[n2][df.loc[n2].alarm == "missing_points"].index)
    assert bad == r5 and "e2e" in bad
    # the rest of that period is still exact
    for c in cs:
        if c.id not in r5:
            assert df.loc[(n2, c.id)].loss == truth.loss_of(n2, c.links) == 0


@pytest.mark.parametrize("eng", ENGINES)
def test_delay_alarm_is_loss_alarm(eng, cons, alarm_dataset, lab6):
    """delay counts a cluster's missing points against its size, loss by a join with every
    period: each delay row has the missing_points alarm exactly when loss's row has it."""
    root, _ = alarm_dataset
    cs = clusters.resolve(lab6)
    run = Run(cons(eng), root, lab6, cs)
    loss = run.loss().set_index(["period", "cluster"])
    delay = run.delay().set_index(["period", "cluster"])
    missing = loss.loc[delay.index, "missing"] > 0
    assert (missing == (delay.alarm == "missing_points")).all()
    assert missing.sum() > 0 and (~missing).sum() > 0


def test_missing_points_listed(cons, alarm_dataset, lab6):
    root, truth = alarm_dataset
    cs = clusters.resolve(lab6)
    miss = Run(cons("duckdb"), root, lab6, cs).missing()
    n1 = truth.periods[1]
    got = set(miss[miss.period == n1].point)
    assert got == {"r3:eth3:out"}
    n2 = truth.periods[2]
    assert set(miss[miss.period == n2].point) == {
        "r5:eth0:in",
        "r5:eth0:out",
        "r5:eth1:in",
        "r5:eth1:out",
    }


def test_cli_fail_on_alarm(alarm_dataset, capsys):
    from flowplane_analytics.cli import main

    root, _ = alarm_dataset
    topo = str(__import__("pathlib").Path(__file__).parent / "data" / "lab6.yaml")
    code = main(["loss", "-d", str(root), "-t", topo, "--format", "csv", "--fail-on-alarm"])
    err = capsys.readouterr().err
    assert code == 3
    assert "negative loss" in err and "no counters for out point r3:eth3:out" in err


@pytest.mark.parametrize("eng", ENGINES)
def test_outage_is_loss_not_a_missing_point(eng, cons, tmp_path, lab6):
    """A wire that drops everything: its points still write zero rows, so its cluster reads
    every packet in as lost, rate 1, alarm outage, no missing point."""
    wire = lab6_links(lab6, "r3", "r5")[0]
    spec = synth.Spec(periods=2, packets=300, hash_bits=4, seed=7, loss_prob={wire: 1.0})
    truth = synth.generate(lab6, spec, tmp_path)
    cs = clusters.resolve(lab6)
    cid = {c.label: c.id for c in cs}[f"{wire[0].id} → {wire[1].id}"]
    df = Run(cons(eng), tmp_path, lab6, cs).loss().set_index(["period", "cluster"])
    for n in truth.periods:
        row = df.loc[(n, cid)]
        assert row.alarm == "outage" and row.missing == 0 and row.out_packets == 0
        assert row.loss == row.in_packets == truth.loss_of(n, [wire]) > 0
        assert row.loss_rate == 1.0
