"""Writing result tables: a readable table (default), CSV, JSON or Parquet."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

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
        text = df.to_json(orient="records", lines=True) if len(df) else ""
    else:
        raise ValueError(f"--format {fmt!r}: want one of {', '.join(FORMATS)}")
    if output:
        Path(output).write_text(text)
    else:
        stream.write(text)
