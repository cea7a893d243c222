"""Finding the record files an engine could not read, before it starts.

Every Parquet file a layout reads has its footer read (``pyarrow.parquet.read_metadata``: the
file's last bytes, no data) and its columns' names and types compared with what the metrics
need; a period directory must be named by a number as probes name it (no sign, no leading
zero). This finds a truncated file, one that is not Parquet at all, one of the wrong table and
a column of the wrong type, the same way whichever engine then runs, and names the file rather
than leaving the engine to fail with its own trace (DuckDB's, or a Java stack from Spark). A
file whose footer is sound but whose data pages are corrupt passes this check; when an engine
then fails, :func:`deep_check` reads the files through and names it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TUPLE = ("src_addr", "dst_addr", "proto", "src_port", "dst_port")

# The columns the metrics read from each table (docs/altmark-records.md); more are allowed.
RAW_COLUMNS = {
    "counters": ("ifname", "direction", "packets", "bytes", "hash_bits", "hash_ref", "malformed"),
    "samples": ("ifname", "direction", "hash", "tai_ns", *TUPLE),
}
COMPACT_COLUMNS = {
    "counters": (
        "probe",
        "period",
        "ifname",
        "direction",
        "packets",
        "bytes",
        "hash_bits",
        "hash_ref",
        "hash_ref_max",
        "malformed",
    ),
    "mps": ("mp", "probe", "ifname", "direction"),
    "flows": ("flow", *TUPLE),
    "samples": ("period", "mp", "hash", "tai_ns", "flow"),
}
# Of the columns above, those that hold text; every other one holds an integer.
STRING_COLUMNS = frozenset({"probe", "ifname", "direction", "src_addr", "dst_addr"})
RAW_TABLES = ("counters", "samples")
RAW_GLOB = "probe=*/period=*/part-0.parquet"

NOT_PARQUET = "not a Parquet file (truncated or corrupt)"


@dataclass(frozen=True)
class BadFile:
    path: str
    problem: str
    probe: str = ""  # raw layout: the probe and period the file holds
    period: str = ""

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


class BadFilesError(Exception):
    """Record files that cannot be read; hint says what to do about them."""

    def __init__(self, bad: Sequence[BadFile], hint: str) -> None:
        self.bad = list(bad)
        self.hint = hint
        super().__init__(self.message())

    def message(self, most: int = 10) -> str:
        if len(self.bad) == 1:
            return f"{self.bad[0]}; {self.hint}"
        lines = [str(b) for b in self.bad[:most]]
        if len(self.bad) > most:
            lines.append(f"… and {len(self.bad) - most} more")
        lines.append(f"{len(self.bad)} bad record files: {self.hint}")
        return "\n".join(lines)


def parquet_problem(path: str | Path, columns: Iterable[str] = (), what: str = "") -> str | None:
    """What is wrong with the Parquet file at path (its footer: the columns' names and types),
    or None."""
    try:
        if os.path.getsize(path) == 0:
            return "empty file (0 bytes): " + NOT_PARQUET
        md = pq.read_metadata(path)
    except OSError as e:
        if e.errno:  # the file system's refusal (permissions, a directory), not the content's
            return f"cannot read it: {e.strerror}"
        return NOT_PARQUET  # pyarrow's: e.g. a footer that does not deserialize
    except (pa.ArrowException, ValueError):
        return NOT_PARQUET  # no Parquet magic at the end: truncated, or not Parquet at all
    names = set(md.schema.names)
    missing = [c for c in columns if c not in names]
    if missing:
        return f"no column {', '.join(missing)}: not {what or 'a record file'}"
    try:
        schema = md.schema.to_arrow_schema()
    except (pa.ArrowException, ValueError):
        return NOT_PARQUET
    wrong = [
        f"{c} is {t} (want {'text' if c in STRING_COLUMNS else 'an integer'})"
        for c in columns
        if (t := _wrong_type(c, schema.field(c).type))
    ]
    if wrong:
        return f"column {', '.join(wrong)}: not usable as {what or 'a record file'}"
    return None


def _wrong_type(column: str, t: pa.DataType) -> pa.DataType | None:
    """t if a column of that name cannot hold it (text, or an integer), else None."""
    v = t.value_type if pa.types.is_dictionary(t) else t
    if column in STRING_COLUMNS:
        ok = pa.types.is_string(v) or pa.types.is_large_string(v)
    else:
        ok = pa.types.is_integer(v)
    return None if ok else t


@dataclass
class RawFiles:
    """The Hive-partitioned files of a dataset, per table: (path, probe, period) each."""

    files: dict[str, list[tuple[Path, str, str]]]

    def paths(self, table: str) -> list[Path]:
        return [p for p, _, _ in self.files[table]]


def raw_files(root: Path) -> RawFiles:
    out: dict[str, list[tuple[Path, str, str]]] = {}
    for t in RAW_TABLES:
        rows = []
        for p in sorted((root / t).glob(RAW_GLOB)):
            probe = p.parent.parent.name.removeprefix("probe=")
            period = p.parent.name.removeprefix("period=")
            rows.append((p, probe, period))
        out[t] = rows
    return RawFiles(out)


def check_raw(files: RawFiles) -> list[BadFile]:
    """The raw layout's bad files: unreadable footers, missing columns, period directories not
    named by a number as probes name them (no sign, no leading zero)."""
    bad = []
    for t in RAW_TABLES:
        what = f"a {t} record of docs/altmark-records.md"
        for p, probe, period in files.files[t]:
            problem = None
            if not period.isdecimal():
                problem = f"period={period} is not a period number"
            elif period != str(int(period)):
                # read as period int(period): beside the probe's own directory it would count twice
                problem = f"period={period} is not a probe's name for it (period={int(period)})"
            problem = problem or parquet_problem(p, RAW_COLUMNS[t], what)
            if problem:
                bad.append(BadFile(str(p), problem, probe, period))
    return bad


def compact_files(base: Path) -> dict[str, list[Path]]:
    """The files of DATA/compact/ per table (DuckDB writes part-0.parquet, Spark part-*.parquet;
    samples have one more directory level, chunk=N)."""
    out = {}
    for t in COMPACT_COLUMNS:
        pattern = "*/*.parquet" if t == "samples" else "*.parquet"
        out[t] = sorted((base / t).glob(pattern))
    return out


def check_compact(base: Path) -> list[BadFile]:
    bad = []
    for t, paths in compact_files(base).items():
        if not paths:
            bad.append(BadFile(str(base / t), "no Parquet files: the compacted copy is incomplete"))
        for p in paths:
            problem = parquet_problem(p, COMPACT_COLUMNS[t], f"a compact {t} file")
            if problem:
                bad.append(BadFile(str(p), problem))
    return bad


def deep_check(paths: Iterable[str | Path], batch_rows: int = 1 << 16) -> list[BadFile]:
    """The files among paths whose data cannot be read through (footer and every page), read
    batch by batch so that memory stays bounded: for after an engine failed, to name the file."""
    bad = []
    for p in paths:
        problem = parquet_problem(p)
        if problem is None:
            try:
                with pq.ParquetFile(p) as f:
                    for _ in f.iter_batches(batch_size=batch_rows):
                        pass
            except (pa.ArrowException, ValueError, OSError, EOFError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                problem = f"corrupt Parquet data ({first})"
        if problem:
            bad.append(BadFile(str(p), problem))
    return bad
