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


def _rank_in_segment(seg: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """For indices idx (ascending) of elements whose segment ids seg[idx] are non-decreasing:
    each one's 0-based rank among those of its segment."""
    if not len(idx):
        return idx
    sg = seg[idx]
    first = np.flatnonzero(np.r_[True, sg[1:] != sg[:-1]])
    return np.arange(len(idx)) - np.repeat(first, np.diff(np.r_[first, len(idx)]))


def generate(net: Network, spec: Spec, out: str | Path | None = None) -> Truth:
    """Writes spec's periods under out (if given) and returns the truth. Vectorized: all the
    flows of a chunk of periods at once, hop by hop (numpy), each file a slice of one table."""
    rng = np.random.default_rng(spec.seed)
    hosts = net.hosts
    flows: list[tuple[list[Point], tuple]] = []
    for si, s in enumerate(hosts):
        for di, d in enumerate(hosts):
            if (s, d) in net.routes:
                pts = path_points(net, net.routes[(s, d)])
                if len(pts) >= 2:
                    flows.append((pts, (_host_ip(si), _host_ip(di), 17, 10000 + si, 20000 + di)))
    points = net.points()
    pidx = {p: i for i, p in enumerate(points)}
    probes = sorted({p.probe for p in points})
    probe_of = np.array([probes.index(p.probe) for p in points], dtype=np.int64)
    truth = Truth(drops=defaultdict(int), periods=[])
    base = spec.hash_bits
    ref = spec.hash_ref & 0xFFFFFFFF
    nf, npts = len(flows), len(points)
    hops = max((len(pts) for pts, _ in flows), default=0)
    lens = np.array([len(pts) for pts, _ in flows], dtype=np.int64)
    path = np.zeros((nf, max(hops, 1)), dtype=np.int64)
    links: list[Link] = []
    link_id: dict[Link, int] = {}
    lid = np.zeros((nf, max(hops, 1)), dtype=np.int64)
    prob = np.zeros((nf, max(hops, 1)))
    delay = np.zeros((nf, max(hops, 1)), dtype=np.int64)
    for f, (pts, _) in enumerate(flows):
        for j, p in enumerate(pts):
            path[f, j] = pidx[p]
            if j + 1 < len(pts):
                lk = (p, pts[j + 1])
                lid[f, j] = link_id.setdefault(lk, len(links))
                if lid[f, j] == len(links):
                    links.append(lk)
                prob[f, j] = spec.loss_prob.get(lk, 0.0)
                wire = p.probe != pts[j + 1].probe
                delay[f, j] = spec.link_delay_ns.get(
                    lk, spec.default_wire_delay_ns if wire else spec.default_router_delay_ns
                )
    explicit: dict[int, list[tuple[int, int]]] = defaultdict(list)  # period index → (link, d)
    for (k, lk), d in spec.drops.items():
        if lk in link_id:
            explicit[k].append((link_id[lk], d))
    # a chunk of periods at a time: about 4 million sampled packets
    per_period = max(1, nf * spec.packets >> base)
    chunk = max(1, min(spec.periods, 4_000_000 // per_period))
    for k0 in range(0, spec.periods, chunk):
        c = min(chunk, spec.periods - k0)
        res = _chunk(spec, rng, k0, c, path, lens, lid, prob, delay, explicit, npts, ref)
        count, bits, drops, rec, ns_total, ncoll = res
        truth.samples += ns_total
        truth.collisions += ncoll
        for kk, li in zip(*np.nonzero(drops), strict=True):
            truth.drops[(spec.first_period + k0 + int(kk), links[li])] += int(drops[kk, li])
        truth.periods += [spec.first_period + k0 + i for i in range(c)]
        if out is not None:
            _write_chunk(
                net, spec, Path(out), k0, c, (count, bits), rec, points, probes, probe_of, flows
            )
    truth.drops = dict(truth.drops)
    return truth


def _chunk(
    spec: Spec,
    rng: np.random.Generator,
    k0: int,
    c: int,
    path: np.ndarray,
    lens: np.ndarray,
    lid: np.ndarray,
    prob: np.ndarray,
    delay: np.ndarray,
    explicit: dict[int, list[tuple[int, int]]],
    npts: int,
    ref: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray], int, int]:
    """Periods k0..k0+c-1: (packets and hash_bits per period and point, drops per period and
    link, the samples as columns k, point, hash, tai_ns, coll, flow, the number of samples, of
    collisions)."""
    nf = len(lens)
    base = spec.hash_bits
    base_mask = (1 << base) - 1
    nlinks = int(lid.max()) + 1 if lid.size else 1
    if spec.grow_prob:
        bits = base + (rng.random((c, npts)) < spec.grow_prob).astype(np.int64)
    else:
        bits = np.full((c, npts), base, dtype=np.int64)
    nseg = c * nf
    seg_k = np.arange(nseg) // nf  # segment = (period in chunk, flow)
    seg_f = np.arange(nseg) % nf
    ns = rng.binomial(spec.packets, 1.0 / (1 << base), nseg)
    seg = np.repeat(np.arange(nseg), ns)
    total = len(seg)
    sk, sf = seg_k[seg], seg_f[seg]
    h = (rng.integers(0, 1 << 32, total, dtype=np.int64) & ~np.int64(base_mask)) | (ref & base_mask)
    starts = (spec.first_period + k0 + np.arange(c, dtype=np.int64)) * spec.period_ns
    t = starts[sk] + rng.integers(0, spec.period_ns // 2, total, dtype=np.int64)
    keep = np.ones(total, dtype=bool)
    alive = np.full(nseg, spec.packets, dtype=np.int64)
    count = np.zeros((c, npts), dtype=np.int64)
    drops = np.zeros((c, nlinks), dtype=np.int64)
    seg_start = np.r_[0, np.cumsum(ns)[:-1]]
    rec: dict[str, list[np.ndarray]] = defaultdict(list)
    nsamp = ncoll = 0
    for j in range(path.shape[1]):
        act = lens[seg_f] > j
        pj = path[seg_f, j]
        np.add.at(count, (seg_k[act], pj[act]), alive[act])
        ps = path[sf, j]
        m = (np.int64(1) << bits[sk, ps]) - 1
        sel = keep & act[seg] & ((h & m) == (ref & m))
        coll = np.zeros(total, dtype=bool)
        if spec.collisions:
            idx = np.flatnonzero(sel & (lens[sf] - 1 == j))
            idx = idx[_rank_in_segment(seg, idx) < spec.collisions]
            coll[idx] = True
            ncoll += len(idx)
        for name, col in (("k", sk), ("point", ps), ("hash", h), ("tai_ns", t)):
            rec[name].append(col[sel])
        rec["coll"].append(coll[sel])
        rec["flow"].append(sf[sel])
        nsamp += int(sel.sum())
        lk = lens[seg_f] > j + 1  # segments with a link after this hop
        if not lk.any():
            break
        li = lid[seg_f, j]
        d = np.zeros(nseg, dtype=np.int64)
        pr = prob[seg_f, j]
        r = lk & (pr > 0)
        d[r] = rng.binomial(alive[r], pr[r])
        for kk in range(k0, k0 + c):
            for link, dv in explicit.get(kk, ()):
                d[lk & (seg_k == kk - k0) & (li == link)] = dv
        d = np.minimum(d, alive) * lk
        np.add.at(drops, (seg_k[lk], li[lk]), d[lk])
        nk = np.bincount(seg[keep], minlength=nseg)
        hit = (d > 0) & (nk > 0)
        ds = np.zeros(nseg, dtype=np.int64)
        if hit.any():
            ds[hit] = rng.hypergeometric(nk[hit], alive[hit] - nk[hit], d[hit])
        if ds.any():
            # ds[seg] random victims among each segment's kept samples
            key = np.where(keep, rng.random(total), 2.0)
            order = np.lexsort((key, seg))
            rank = np.arange(total) - seg_start[seg[order]]
            keep[order[rank < ds[seg[order]]]] = False
        alive -= d
        t = t + delay[sf, j]
        if spec.jitter_ns:
            t = t + rng.integers(0, spec.jitter_ns + 1, total, dtype=np.int64)
    cols = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in rec.items()}
    return count, bits, drops, cols, nsamp, ncoll


def _write_chunk(
    net: Network,
    spec: Spec,
    out: Path,
    k0: int,
    c: int,
    per_point: tuple[np.ndarray, np.ndarray],
    rec: dict[str, np.ndarray],
    points: list[Point],
    probes: list[str],
    probe_of: np.ndarray,
    flows: list[tuple[list[Point], tuple]],
) -> None:
    """One file per probe and period, each a slice of the chunk's samples sorted by (period,
    probe, point, flow)."""

    def ifname(p: Point) -> str:
        if spec.ifname_style == "lab":
            return net.ifname_aliases(p)[-1]
        return p.ifname

    count, bits = per_point
    npts = len(points)
    missing = np.zeros((c, npts), dtype=bool)
    for k, pid in spec.missing_points:
        for i, p in enumerate(points):
            if p.id == pid and k0 <= k < k0 + c:
                missing[k - k0, i] = True
    ok = ~missing[rec["k"], rec["point"]]
    rec = {k: v[ok] for k, v in rec.items()}
    order = np.lexsort((rec["flow"], rec["point"], probe_of[rec["point"]], rec["k"]))
    rec = {k: v[order] for k, v in rec.items()}
    m = len(rec["hash"])
    tup = list(zip(*(t for _, t in flows), strict=True)) if flows else [[], [], [], [], []]

    def strings(values: list[str], idx: np.ndarray) -> pa.Array:
        return pa.array(values, pa.string()).take(pa.array(idx, pa.int64()))

    src_idx = np.where(rec["coll"], len(flows), rec["flow"])
    samples = pa.table(
        {
            "ifname": strings([ifname(p) for p in points], rec["point"]),
            "direction": strings([p.direction for p in points], rec["point"]),
            "flowmon_id": pa.array(np.full(m, -1, dtype=np.int64)),
            "color": pa.array(((spec.first_period + k0 + rec["k"]) % 2).astype(np.int32)),
            "hash": pa.array(rec["hash"], pa.int64()),
            "tai_ns": pa.array(rec["tai_ns"], pa.int64()),
            "src_addr": strings([*tup[0], "198.19.255.254"], src_idx),
            "dst_addr": strings(list(tup[1]), rec["flow"]),
            "proto": pa.array(np.asarray(tup[2], dtype=np.int32)[rec["flow"]], pa.int32()),
            "src_port": pa.array(np.asarray(tup[3], dtype=np.int32)[rec["flow"]], pa.int32()),
            "dst_port": pa.array(np.asarray(tup[4], dtype=np.int32)[rec["flow"]], pa.int32()),
            "length": pa.array(np.full(m, 100, dtype=np.int32)),
        },
        schema=records.SAMPLES_SCHEMA,
    )
    file_key = rec["k"] * len(probes) + probe_of[rec["point"]]
    bounds = np.searchsorted(file_key, np.arange(c * len(probes) + 1))
    nsamp = np.zeros((c, npts), dtype=np.int64)
    np.add.at(nsamp, (rec["k"], rec["point"]), 1)
    for k in range(c):
        n = spec.first_period + k0 + k
        start = n * spec.period_ns
        for qi, probe in enumerate(probes):
            if (k0 + k, probe) in spec.missing_probes:
                continue
            crow = []
            for i, p in enumerate(points):
                if probe_of[i] != qi or missing[k, i]:
                    continue
                pk = int(count[k, i]) + spec.extra_packets.get((k0 + k, p.id), 0)
                t0 = start if pk else 0
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
                        "samples": int(nsamp[k, i]),
                        "hash_bits": int(bits[k, i]),
                        "hash_ref": spec.hash_ref & 0xFFFFFFFF,
                        "first_tai_ns": t0,
                        "last_tai_ns": t0,
                        "mean_tai_ns": t0,
                        "malformed": 0,
                        "schema_version": records.SCHEMA_VERSION,
                    }
                )
            lo, hi = bounds[k * len(probes) + qi], bounds[k * len(probes) + qi + 1]
            records.write_period(
                out, probe, n, records.counters_table(crow), samples.slice(lo, hi - lo), sync=False
            )
