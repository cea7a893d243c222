"""Synthetic period records of the documented schema, with known ground truth.

Traffic: every pair of hosts of a lab topology exchanges a flow (one 5-tuple) along the lab's
routes; each period each flow sends ``packets`` packets. Loss is injected per MP link (an edge
of the measurement-point graph: a wire direction or a path through a router) as an exact count
per period, drawn from a binomial law with the link's probability or given explicitly; delay is
a fixed time per MP link plus uniform jitter. Only the packets that a probe would sample are
materialised (their hashes match ``hash_ref`` in the low ``hash_bits`` bits); the others exist
only as counts, so large datasets stay cheap. A point's hash_bits can grow by one in a period
(``grow_prob``), as a busy probe's would: it then keeps only the samples matching at the longer
length.

The truth returned: drops per (period, MP link), and the records themselves.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from . import records
from .topology import Network, Point, path_points

Link = tuple[Point, Point]


@dataclass
class Spec:
    periods: int = 4
    first_period: int = 1_763_856_000
    period_ns: int = 1_000_000_000
    packets: int = 2000  # per flow and period
    hash_bits: int = 4
    hash_ref: int = 0x5A5A5A5A
    grow_prob: float = 0.0  # probability that a point matches one more hash bit in a period
    loss_prob: dict[Link, float] = field(default_factory=dict)
    drops: dict[tuple[int, Link], int] = field(default_factory=dict)  # exact, (period index, link)
    link_delay_ns: dict[Link, int] = field(default_factory=dict)
    default_wire_delay_ns: int = 50_000
    default_router_delay_ns: int = 10_000
    jitter_ns: int = 0  # uniform [0, jitter_ns] added per hop
    collisions: int = 0  # per period: last-hop samples whose 5-tuple is replaced
    missing_points: set[tuple[int, str]] = field(default_factory=set)  # (period index, point id)
    missing_probes: set[tuple[int, str]] = field(default_factory=set)  # (period index, probe)
    extra_packets: dict[tuple[int, str], int] = field(default_factory=dict)
    seed: int = 1
    ifname_style: str = "plain"  # "plain" (eth0) or "lab" (fp<tag>-eth0, as a lab's probe sees it)


@dataclass
class Truth:
    drops: dict[tuple[int, Link], int]  # (period, link) → dropped packets
    periods: list[int]
    samples: int = 0
    collisions: int = 0

    def loss_of(self, period: int, links: tuple[Link, ...]) -> int:
        return sum(self.drops.get((period, lk), 0) for lk in links)


def _host_ip(i: int) -> str:
    return str(ipaddress.IPv4Address("198.18.128.0") + i + 1)


def generate(net: Network, spec: Spec, out: str | Path | None = None) -> Truth:
    """Writes spec's periods under out (if given) and returns the truth."""
    rng = np.random.default_rng(spec.seed)
    hosts = net.hosts
    flows = []
    for si, s in enumerate(hosts):
        for di, d in enumerate(hosts):
            if (s, d) in net.routes:
                pts = path_points(net, net.routes[(s, d)])
                if len(pts) >= 2:
                    flows.append((pts, (_host_ip(si), _host_ip(di), 17, 10000 + si, 20000 + di)))
    points = net.points()
    probes = sorted({p.probe for p in points})
    truth = Truth(drops=defaultdict(int), periods=[])
    base = spec.hash_bits
    ref = spec.hash_ref & 0xFFFFFFFF
    base_mask = (1 << base) - 1

    def ifname(p: Point) -> str:
        if spec.ifname_style == "lab":
            return net.ifname_aliases(p)[-1]
        return p.ifname

    for k in range(spec.periods):
        n = spec.first_period + k
        truth.periods.append(n)
        start = n * spec.period_ns
        bits = {
            p: base + int(rng.random() < spec.grow_prob) if spec.grow_prob else base for p in points
        }
        count: dict[Point, int] = defaultdict(int)
        samp: dict[Point, list[tuple[np.ndarray, tuple]]] = defaultdict(list)
        for pts, tup in flows:
            alive = spec.packets
            # The sampled packets: hashes with the low `base` bits equal to the reference.
            ns = int(rng.binomial(spec.packets, 1.0 / (1 << base)))
            h = (rng.integers(0, 1 << 32, ns, dtype=np.int64) & ~np.int64(base_mask)) | (
                ref & base_mask
            )
            t = start + rng.integers(0, spec.period_ns // 2, ns, dtype=np.int64)
            keep = np.ones(ns, dtype=bool)
            coll = np.zeros(ns, dtype=bool)
            for j, p in enumerate(pts):
                count[p] += alive
                m = (1 << bits[p]) - 1
                sel = keep & ((h & m) == (ref & m))
                if j == len(pts) - 1 and spec.collisions:
                    idx = np.flatnonzero(sel)[: spec.collisions]
                    coll[:] = False
                    coll[idx] = True
                    truth.collisions += len(idx)
                samp[p].append(
                    (np.stack([h[sel], t[sel], coll[sel].astype(np.int64)], axis=1), tup)
                )
                truth.samples += int(sel.sum())
                if j == len(pts) - 1:
                    break
                link = (p, pts[j + 1])
                d = spec.drops.get((k, link))
                if d is None:
                    prob = spec.loss_prob.get(link, 0.0)
                    d = int(rng.binomial(alive, prob)) if prob else 0
                d = min(d, alive)
                if d:
                    truth.drops[(n, link)] += d
                    nk = int(keep.sum())
                    ds = int(rng.hypergeometric(nk, alive - nk, d)) if nk else 0
                    if ds:
                        victims = rng.choice(np.flatnonzero(keep), ds, replace=False)
                        keep[victims] = False
                    alive -= d
                wire = p.probe != pts[j + 1].probe
                dl = spec.link_delay_ns.get(
                    link, spec.default_wire_delay_ns if wire else spec.default_router_delay_ns
                )
                t = t + dl
                if spec.jitter_ns:
                    t = t + rng.integers(0, spec.jitter_ns + 1, ns, dtype=np.int64)
        if out is None:
            continue
        for probe in probes:
            if (k, probe) in spec.missing_probes:
                continue
            crow = []
            srows: dict[str, list] = defaultdict(list)
            for p in (q for q in points if q.probe == probe):
                if (k, p.id) in spec.missing_points:
                    continue
                pk = count[p] + spec.extra_packets.get((k, p.id), 0)
                crow.append(
                    {
                        "period_ns": spec.period_ns,
                        "color": n % 2,
                        "start_tai_ns": start,
                        "ifname": ifname(p),
                        "ifindex": int(p.ifname.removeprefix("eth") or 0) + 2,
                        "direction": p.direction,
                        "carrier": "dscp",
                        "flowmon_id": -1,
                        "packets": pk,
                        "bytes": pk * 100,
                        "samples": 0,
                        "hash_bits": bits[p],
                        "hash_ref": ref,
                        "first_tai_ns": start if pk else 0,
                        "last_tai_ns": start if pk else 0,
                        "mean_tai_ns": start if pk else 0,
                        "malformed": 0,
                        "schema_version": records.SCHEMA_VERSION,
                    }
                )
                nsamp = 0
                for arr, tup in samp.get(p, []):
                    if not len(arr):
                        continue
                    m = len(arr)
                    nsamp += m
                    c = arr[:, 2].astype(bool)
                    srows["ifname"].append(np.full(m, ifname(p), dtype=object))
                    srows["direction"].append(np.full(m, p.direction, dtype=object))
                    srows["hash"].append(arr[:, 0])
                    srows["tai_ns"].append(arr[:, 1])
                    srows["src_addr"].append(np.where(c, "198.19.255.254", tup[0]).astype(object))
                    srows["dst_addr"].append(np.full(m, tup[1], dtype=object))
                    srows["proto"].append(np.full(m, tup[2], dtype=np.int32))
                    srows["src_port"].append(np.full(m, tup[3], dtype=np.int32))
                    srows["dst_port"].append(np.full(m, tup[4], dtype=np.int32))
                crow[-1]["samples"] = nsamp
            records.write_period(
                Path(out), probe, n, records.counters_table(crow), _samples(srows, n)
            )
    truth.drops = dict(truth.drops)
    return truth


def _samples(cols: dict[str, list], period: int) -> pa.Table:
    if not cols:
        return records.samples_table([])
    cat = {k: np.concatenate(v) for k, v in cols.items()}
    m = len(cat["hash"])
    arrays = {
        "ifname": pa.array(cat["ifname"], pa.string()),
        "direction": pa.array(cat["direction"], pa.string()),
        "flowmon_id": pa.array(np.full(m, -1, dtype=np.int64)),
        "color": pa.array(np.full(m, period % 2, dtype=np.int32)),
        "hash": pa.array(cat["hash"], pa.int64()),
        "tai_ns": pa.array(cat["tai_ns"], pa.int64()),
        "src_addr": pa.array(cat["src_addr"], pa.string()),
        "dst_addr": pa.array(cat["dst_addr"], pa.string()),
        "proto": pa.array(cat["proto"], pa.int32()),
        "src_port": pa.array(cat["src_port"], pa.int32()),
        "dst_port": pa.array(cat["dst_port"], pa.int32()),
        "length": pa.array(np.full(m, 100, dtype=np.int32)),
    }
    return pa.table(arrays, schema=records.SAMPLES_SCHEMA)
