"""`collect`: pull the period records from probes' REST APIs (GET /periods, GET /periods/{n})
into a Hive-partitioned dataset directory.

Idempotent and resumable: a period whose counters file is already in the dataset is never
fetched again, and every period is written atomically (counters last), so an interrupted run
leaves whole periods only and the next run carries on. A probe that does not answer is retried
(with a growing pause) and then reported, never skipped in silence.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from . import records

TOKEN_ENV = "FLOWPLANE_ALTMARK_TOKEN"


@dataclass
class Source:
    url: str
    token: str | None = None


@dataclass
class Result:
    url: str
    probe: str = ""
    listed: int = 0
    fetched: list[int] = field(default_factory=list)
    present: int = 0
    missing: list[int] = field(default_factory=list)  # listed, then 404 when fetched
    error: str = ""
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return not self.error


class ProbeError(Exception):
    pass


def parse_source(spec: str, default_token: str | None) -> Source:
    """URL[,token-file=PATH]"""
    url, *opts = spec.split(",")
    token = default_token
    for o in opts:
        k, _, v = o.partition("=")
        if k == "token-file":
            token = Path(v).read_text().strip()
        else:
            raise ValueError(f"--probe {spec!r}: unknown option {k!r} (want token-file=PATH)")
    if "://" not in url:
        url = "http://" + url
    return Source(url.rstrip("/"), token)


def default_token(token_file: str | None) -> str | None:
    if token_file:
        return Path(token_file).read_text().strip() or None
    return os.environ.get(TOKEN_ENV, "").strip() or None


def _get(
    sess: requests.Session,
    src: Source,
    path: str,
    res: Result,
    retries: int,
    backoff: float,
    timeout: float,
    sleep: Callable[[float], None],
) -> requests.Response:
    headers = {"Authorization": f"Bearer {src.token}"} if src.token else {}
    last = ""
    for attempt in range(retries + 1):
        res.attempts += 1
        try:
            r = sess.get(src.url + path, headers=headers, timeout=timeout)
        except requests.RequestException as e:
            last = f"{type(e).__name__}: {e}"
        else:
            if r.status_code in (200, 404):
                return r
            if r.status_code in (401, 403):
                raise ProbeError(f"GET {path}: {r.status_code} (bearer token missing or wrong)")
            if r.status_code < 500:
                raise ProbeError(f"GET {path}: {r.status_code} {r.text[:200]}")
            last = f"HTTP {r.status_code}"
        if attempt < retries:
            sleep(backoff * (2**attempt))
    raise ProbeError(f"GET {path}: no answer after {retries + 1} attempts ({last})")


def collect(
    sources: Sequence[Source],
    root: str | Path,
    retries: int = 3,
    backoff: float = 1.0,
    timeout: float = 10.0,
    keep_json: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = lambda _: None,
) -> list[Result]:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    records.remove_stale_temporaries(root)
    out: list[Result] = []
    with requests.Session() as sess:
        for src in sources:
            res = Result(url=src.url)
            out.append(res)
            try:
                r = _get(sess, src, "/periods", res, retries, backoff, timeout, sleep)
                if r.status_code != 200:
                    raise ProbeError(f"GET /periods: {r.status_code}")
                body: dict[str, Any] = r.json()
                res.probe = str(body["probe"])
                periods = [int(n) for n in body.get("periods") or []]
                res.listed = len(periods)
                for n in periods:
                    if records.is_complete(root, res.probe, n):
                        res.present += 1
                        continue
                    r = _get(sess, src, f"/periods/{n}", res, retries, backoff, timeout, sleep)
                    if r.status_code == 404:
                        res.missing.append(n)
                        continue
                    obj = r.json()
                    if str(obj.get("probe")) != res.probe or int(obj.get("period", -1)) != n:
                        raise ProbeError(
                            f"GET /periods/{n}: answered probe {obj.get('probe')!r} period "
                            f"{obj.get('period')!r}, want {res.probe!r} {n}"
                        )
                    records.write_period_json(root, obj, keep_json=keep_json)
                    res.fetched.append(n)
                    log(f"{res.probe}: period {n}")
            except (ProbeError, ValueError, KeyError) as e:
                res.error = str(e)
    return out
