"""`collect`: pull the period records from probes' REST APIs (GET /periods, GET /periods/{n})
into a Hive-partitioned dataset, a local directory or s3://BUCKET/PREFIX (storage.py).

Many probes at once, each on its own worker, so a slow or dead probe holds up no other.
Idempotent and resumable: a period whose counters file is already in the dataset is never
fetched again (one listing per probe), and every file is written whole (counters last), so a
run killed at any point leaves whole periods only and the next run carries on. A probe that
does not answer is retried (with a growing pause) and then reported, never skipped in silence.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from . import records, storage

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
    rows: int = 0  # counters and samples rows fetched
    seconds: float = 0.0

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
            raise ValueError(f"unknown option {k!r} (want token-file=PATH)")
    if "://" not in url:
        raise ValueError(f"{url!r} has no scheme: want http://{url}")
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
    end: float | None = None,
) -> requests.Response:
    """GET path, retried on no answer and on 5xx (pauses backoff, 2·backoff, …), all within
    the probe's deadline `end` (time.monotonic())."""
    headers = {"Authorization": f"Bearer {src.token}"} if src.token else {}
    last = ""
    for attempt in range(retries + 1):
        left = timeout
        if end is not None:
            left = min(timeout, end - time.monotonic())
            if left <= 0:
                raise ProbeError(f"GET {path}: deadline passed ({last or 'slow answers'})")
        res.attempts += 1
        try:
            r = sess.get(src.url + path, headers=headers, timeout=left)
        except requests.RequestException as e:
            last = _why(e)
        else:
            if r.status_code in (200, 404):
                return r
            if r.status_code in (401, 403):
                raise ProbeError(f"GET {path}: {r.status_code} (bearer token missing or wrong)")
            if r.status_code < 500:
                raise ProbeError(f"GET {path}: {r.status_code} {r.text[:200]}")
            last = f"HTTP {r.status_code}"
        if attempt < retries:
            pause = backoff * (2**attempt)
            if end is not None and time.monotonic() + pause >= end:
                raise ProbeError(f"GET {path}: deadline passed ({last})")
            sleep(pause)
    tries = f"{retries + 1} attempts" if retries else "1 attempt"
    raise ProbeError(f"GET {path}: no answer after {tries} ({last})")


def _why(e: requests.RequestException) -> str:
    """Why a GET got no answer, in a few words: the innermost socket error's reason (Connection
    refused, Name or service not known, Remote end closed connection without response) where
    there is one, not urllib3's nested repr; else the exception as requests words it."""
    if isinstance(e, requests.Timeout):
        return "timed out"
    todo: list[object] = [e]
    seen: set[int] = set()
    while todo:
        c = todo.pop(0)
        if not isinstance(c, BaseException) or id(c) in seen:
            continue
        seen.add(id(c))
        if isinstance(c, OSError) and not isinstance(c, requests.RequestException):
            if c.strerror:
                return str(c.strerror)
            if str(c):  # e.g. http.client.RemoteDisconnected: a message, no errno
                return str(c)
        todo += [getattr(c, "reason", None), *c.args, c.__cause__, c.__context__]
    return f"{type(e).__name__}: {e}"


class _Claims:
    """Which source collects which probe id: two URLs answering the same id would write the
    same files, so the second is refused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_probe: dict[str, str] = {}

    def claim(self, probe: str, url: str) -> None:
        with self._lock:
            other = self._by_probe.setdefault(probe, url)
        if other != url:
            raise ProbeError(f"answers probe id {probe!r}, which {other} answers too")


def _collect_one(
    src: Source,
    root: storage.Root,
    claims: _Claims,
    retries: int,
    backoff: float,
    timeout: float,
    deadline: float | None,
    keep_json: bool,
    sleep: Callable[[float], None],
    log: Callable[[str], None],
) -> Result:
    res = Result(url=src.url)
    t0 = time.monotonic()
    end = t0 + deadline if deadline else None
    try:
        with requests.Session() as sess:

            def get(path: str) -> requests.Response:
                return _get(sess, src, path, res, retries, backoff, timeout, sleep, end)

            r = get("/periods")
            if r.status_code != 200:
                raise ProbeError(f"GET /periods: {r.status_code}")
            body: dict[str, Any] = r.json()
            res.probe = str(body["probe"])
            claims.claim(res.probe, src.url)
            periods = [int(n) for n in body.get("periods") or []]
            res.listed = len(periods)
            have = set(records.complete_periods(root, res.probe))
            for n in periods:
                if n in have:
                    res.present += 1
                    continue
                r = get(f"/periods/{n}")
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
                res.rows += len(obj.get("counters") or []) + len(obj.get("samples") or [])
                log(f"{res.probe}: period {n}")
    except (ProbeError, ValueError, KeyError, TypeError) as e:
        res.error = str(e)
        if res.fetched or res.listed:
            left = res.listed - res.present - len(res.fetched) - len(res.missing)
            res.error += f" ({len(res.fetched)} periods fetched, {left} left for the next run)"
    res.seconds = time.monotonic() - t0
    return res


def collect(
    sources: Sequence[Source],
    root: str | Path,
    retries: int = 3,
    backoff: float = 1.0,
    timeout: float = 10.0,
    keep_json: bool = True,
    parallel: int = 8,
    deadline: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = lambda _: None,
) -> list[Result]:
    """Collects every source into root (a directory or s3://BUCKET/PREFIX), `parallel`
    probes at a time, each probe's periods one after another; results in the sources'
    order. A probe that is slow or down holds one worker only: each request has `timeout`,
    each probe `deadline` seconds in all (None: no limit), then it is reported and left."""
    dest = storage.Root(root)
    dest.make()
    dest.remove_stale_temporaries()
    claims = _Claims()

    def one(src: Source) -> Result:
        return _collect_one(
            src, dest, claims, retries, backoff, timeout, deadline, keep_json, sleep, log
        )

    if not sources:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(sources)))) as pool:
        return list(pool.map(one, sources))
