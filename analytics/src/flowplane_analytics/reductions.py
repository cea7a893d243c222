"""Reductions Ibis lacks, defined once and lowered to each engine's fastest exact form.

``nearest_rank(x, pct)``: the nearest-rank percentile of the non-NULL values of x, i.e. the
value at 1-based rank ⌈pct·N/100⌉ in ascending order (N the count of non-NULL values; NULL when
N = 0). An integer definition: both lowerings below compute that rank without floating point.

- DuckDB: ``quantile_disc(x, pct/100 as DECIMAL)``. With a DECIMAL fraction DuckDB finds the
  rank in integer arithmetic, n − ⌊n·(1 − q)⌋, which is ⌈q·n⌉; a DOUBLE fraction would round.
  A selection per group, without the sort a rank window needs.
- Spark: the value at index ⌈pct·N/100⌉ − 1 of the group's sorted values (``get`` gives NULL for
  an empty group). Spark's own ``percentile_disc`` is slower than that.
"""

from __future__ import annotations

import ibis.expr.datatypes as dt
import ibis.expr.operations as ops
import ibis.expr.types as ir
import sqlglot.expressions as sge
from ibis.backends.sql.compilers.duckdb import DuckDBCompiler
from ibis.backends.sql.compilers.pyspark import PySparkCompiler
from ibis.common.annotations import attribute

__all__ = ["nearest_rank"]


class NearestRank(ops.Reduction):
    """The nearest-rank percentile pct (1..100) of arg's non-NULL values."""

    arg: ops.Value[dt.Integer]
    pct: int

    @attribute
    def dtype(self) -> dt.DataType:
        return self.arg.dtype


def nearest_rank(x: ir.IntegerColumn, pct: int) -> ir.IntegerScalar:
    if not 1 <= pct <= 100:
        raise ValueError(f"nearest_rank: pct {pct} is not in 1..100")
    return NearestRank(x, pct).to_expr()


def _duckdb(
    self: DuckDBCompiler, op: NearestRank, *, arg: sge.Expression, pct: int
) -> sge.Expression:
    q = sge.Cast(this=sge.Literal.number(f"{pct / 100:.2f}"), to=sge.DataType.build("DECIMAL(3,2)"))
    return self.agg.quantile_disc(arg, q)


def _spark(
    self: PySparkCompiler, op: NearestRank, *, arg: sge.Expression, pct: int
) -> sge.Expression:
    need = sge.IntDiv(this=sge.paren(self.f.count(arg) * pct + 99), expression=sge.convert(100))
    index = sge.Cast(this=need - 1, to=sge.DataType.build("INT"))
    return self.f.get(self.f.sort_array(self.f.collect_list(arg)), index)


DuckDBCompiler.visit_NearestRank = _duckdb  # type: ignore[attr-defined]
PySparkCompiler.visit_NearestRank = _spark  # type: ignore[attr-defined]
