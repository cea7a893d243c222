"""DuckDB analyses a dataset larger than its memory limit by spilling to disk."""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from flowplane_analytics import clusters, engine, metrics, synth


def test_duckdb_spills(tmp_path, lab6):
    root = tmp_path / "ds"
    # every packet sampled (hash_bits 0): ~750,000 samples, far more than 128 MB once joined
    truth = synth.generate(lab6, synth.Spec(periods=1, packets=4000, hash_bits=0, seed=2), root)
    assert truth.samples > 700_000
    cs = clusters.resolve(lab6)
    m, a = metrics.membership(lab6, cs)

    def run(**kw):
        con = engine.connect(engine.Options(threads=1, **kw))
        if kw.get("temp_dir") is None:
            con.con.execute("SET temp_directory = ''")  # nowhere to spill
        return con.execute(metrics.delay(engine.load(con, root), m, a))

    unlimited = run()
    with pytest.raises(duckdb.OutOfMemoryException):
        run(memory_limit="128MB")  # does not fit in 128 MB ...
    spilled = run(memory_limit="128MB", temp_dir=str(tmp_path / "spill"))  # ... but spills
    k = ["period", "cluster"]
    pd.testing.assert_frame_equal(
        spilled.sort_values(k).reset_index(drop=True),
        unlimited.sort_values(k).reset_index(drop=True),
    )
    assert unlimited.matched.sum() > 700_000
