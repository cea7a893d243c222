"""altmark analytics: cluster the network (RFC 9342) and compute loss and delay from the
probes' period records (docs/altmark-records.md), on DuckDB or Spark through Ibis."""

__version__ = "0.1.0"
