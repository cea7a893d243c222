"""Writing result tables: a readable table (default), CSV, JSON or Parquet."""

from __future__ import annotations

import datetime
import decimal
import json
import re
import sys
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

FORMATS = ("table", "csv", "json", "parquet")


def check(fmt: str, output: str | None = None) -> None:
    """ValueError for a format and output that cannot go together: the command line checks
    this before doing any work."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: want one of {', '.join(FORMATS)}")
    if fmt == "parquet" and not output:
        raise ValueError("--format parquet writes a file: add --output FILE (-o FILE)")


def _natural(names: pd.Series) -> pd.Series:
    """Sort keys that put C2 before C10 (the numbers zero-padded)."""
    return names.astype(str).map(lambda s: re.sub(r"\d+", lambda m: m.group().zfill(20), s))


def readable_order(df: pd.DataFrame) -> pd.DataFrame:
    """df with its clusters in numeric order within each period (C1, C2, …, C10; the engines
    order names as text: C1, C10, C2); rows that tie keep their order."""
    keys = [c for c in ("period", "cluster") if c in df.columns]
    if "cluster" not in keys or not len(df):
        return df
    return df.sort_values(
        keys, key=lambda c: _natural(c) if c.name == "cluster" else c, kind="stable"
    ).reset_index(drop=True)


def emit(
    df: pd.DataFrame, fmt: str, output: str | None = None, stream: TextIO | None = None
) -> None:
    stream = stream or sys.stdout
    check(fmt, output)
    df = readable_order(df)
    if fmt == "parquet":
        assert output
        df.to_parquet(output, index=False)
        return
    if fmt == "table":
        # na_rep covers NaN and None, not the nullable integers' <NA>
        shown = df.assign(
            **{
                c: df[c].astype(object).where(df[c].notna(), "-")
                for c in df.columns
                if isinstance(df[c].dtype, pd.Int64Dtype)
            }
        )
        text = shown.to_string(index=False, na_rep="-") if len(df) else "(no rows)"
        text += "\n"
    elif fmt == "csv":
        text = df.to_csv(index=False)
    else:  # json
        rows = df.astype(object).where(df.notna(), None).to_dict("records")
        text = "".join(json.dumps(r, default=_scalar) + "\n" for r in rows)
    if output:
        Path(output).write_text(text)
    else:
        stream.write(text)


def _scalar(v: Any) -> Any:
    """JSON for what engines hand back: exact sums as Decimal, NumPy scalars, timestamps."""
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if hasattr(v, "item"):
        return v.item()
    if isinstance(v, (datetime.date, datetime.datetime, pd.Timestamp)):
        return v.isoformat()
    return str(v)
