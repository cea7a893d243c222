"""altmark analytics: cluster the network (RFC 9342) and compute loss and delay from the
probes' period records (docs/altmark-records.md), on DuckDB or Spark through Ibis."""

try:
    # Written by the release build (scripts/release) into the copy it builds from.
    from ._version import __version__
except ImportError:  # a checkout, e.g. the editable install of `make setup`
    __version__ = "0.0.0+unknown"
