"""Writing result tables: a readable table (default), CSV, JSON or Parquet."""

from __future__ import annotations

import datetime
import decimal
import json
import sys
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

FORMATS = ("table", "csv", "json", "parquet")


def emit(
    df: pd.DataFrame, fmt: str, output: str | None = None, stream: TextIO | None = None
) -> None:
    stream = stream or sys.stdout
    if fmt == "parquet":
        if not output:
            raise ValueError("--format parquet needs --output FILE")
        df.to_parquet(output, index=False)
        return
    if fmt == "table":
        text = df.to_string(index=False, na_rep="-") if len(df) else "(no rows)"
        text += "\n"
    elif fmt == "csv":
        text = df.to_csv(index=False)
    elif fmt == "json":
        rows = df.astype(object).where(df.notna(), None).to_dict("records")
        text = "".join(json.dumps(r, default=_scalar) + "\n" for r in rows)
    else:
        raise ValueError(f"--format {fmt!r}: want one of {', '.join(FORMATS)}")
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
