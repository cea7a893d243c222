from __future__ import annotations

from pathlib import Path

import pytest

from flowplane_analytics import clusters, engine, metrics, synth, topology

DATA = Path(__file__).parent / "data"
ENGINES = ["duckdb", "spark"]


@pytest.fixture(scope="session")
def lab6() -> topology.Network:
    return topology.load(DATA / "lab6.yaml")


@pytest.fixture(scope="session")
def lab6_clusters(lab6):
    return clusters.resolve(lab6, ["C1+C2+C6"])


@pytest.fixture(scope="session")
def cons():
    """One connection per engine for the whole run (Spark starts once)."""
    made: dict[str, object] = {}

    def get(name: str):
        if name not in made:
            # Small data: one shuffle partition, no adaptive re-planning (faster to start).
            conf = {"spark.sql.adaptive.enabled": "false", "spark.driver.memory": "1g"}
            made[name] = engine.connect(
                engine.Options(engine=name, shuffle_partitions=1, spark_conf=conf)
            )
        return made[name]

    return get


class Run:
    """A dataset analysed on one engine."""

    def __init__(self, con, root, net, cs):
        self.con = con
        self.ds = engine.load(con, root)
        self.members, self.aliases = metrics.membership(net, cs)

    def loss(self):
        return self.con.execute(metrics.loss(self.ds, self.members, self.aliases))

    def delay(self):
        return self.con.execute(metrics.delay(self.ds, self.members, self.aliases))

    def missing(self):
        return self.con.execute(metrics.missing_points(self.ds, self.members, self.aliases))

    def paths(self):
        return self.con.execute(metrics.paths(self.ds, self.aliases))


def lab6_links(net, a, b):
    """The MP links of the wire a→b (router names) in net."""
    return [
        (p, q) for p, q in net.graph.edges if p.probe == a and q.probe == b and p.direction == "out"
    ]


@pytest.fixture(scope="session")
def truth_dataset(tmp_path_factory, lab6):
    """lab6 with random loss on every MP link, exact extra drops on chosen links, hash-length
    growth, one collision per flow and period at its last hop, fixed delays (40 µs on r3→r4,
    50 µs on other wires, 10 µs through a router); the ground truth alongside."""
    root = tmp_path_factory.mktemp("truth")
    r3r5 = lab6_links(lab6, "r3", "r5")[0]
    r2r4 = lab6_links(lab6, "r2", "r4")[0]
    r3r4 = lab6_links(lab6, "r3", "r4")[0]
    spec = synth.Spec(
        periods=3,
        packets=2000,
        hash_bits=3,
        grow_prob=0.3,
        loss_prob={lk: 0.005 for lk in lab6.graph.edges},
        drops={(1, r3r5): 123, (2, r2r4): 77},
        link_delay_ns={r3r4: 40_000},
        collisions=1,
        seed=7,
        ifname_style="lab",
    )
    truth = synth.generate(lab6, spec, root)
    return root, truth


@pytest.fixture(scope="session")
def results(cons, truth_dataset, lab6, lab6_clusters):
    """loss, delay and paths of the truth dataset, computed once per engine."""
    root, _ = truth_dataset
    memo: dict[str, dict] = {}

    def get(eng: str) -> dict:
        if eng not in memo:
            r = Run(cons(eng), root, lab6, lab6_clusters)
            memo[eng] = {"loss": r.loss(), "delay": r.delay(), "paths": r.paths()}
        return memo[eng]

    return get


@pytest.fixture(scope="session")
def s3():
    """A real S3-compatible server on this machine (moto's, as a process on a free loopback
    port), the environment's AWS settings pointing at it, and a bucket: s3://fp-test."""
    import os

    import requests
    from probefarm import moto_server, s3_env

    proc, url = moto_server()
    env = s3_env(url)
    saved = {k: os.environ.get(k) for k in env}
    try:
        os.environ.update(env)
        requests.put(f"{url}/fp-test", timeout=30).raise_for_status()  # the bucket
        yield "s3://fp-test"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        proc.wait(timeout=30)
