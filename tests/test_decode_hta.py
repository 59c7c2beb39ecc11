"""HolisticTraceAnalysis (HTA 0.5) as a reference: tracecal's per-rank temporal breakdown, iteration
counts and NCCL kernel counts must agree with HTA's on the same shared traces."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import KINETO

from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.sql.connection import open_database

CASES = {
    "dlrm_8rank": KINETO / "dlrm_8rank",
    "sampled_2_of_128": KINETO / "sampled_2_of_128",
    "a100_ddp_rank0_of_2": KINETO / "single" / "a100_ddp_rank0_of_2.json.gz",
}


@pytest.mark.slow
@pytest.mark.parametrize("run_id", sorted(CASES))
def test_temporal_breakdown_iterations_and_nccl_kernels_agree_with_hta(run_id: str, tmp_path: Path) -> None:
    hta = pytest.importorskip("hta.trace_analysis")
    path = CASES[run_id]
    logging.disable(logging.WARNING)  # HTA logs every parsed file
    try:
        if path.is_dir():
            analysis = hta.TraceAnalysis(trace_dir=str(path), include_last_profiler_step=True)
        else:
            analysis = hta.TraceAnalysis(
                trace_files={0: str(path)}, trace_dir=str(path.parent), include_last_profiler_step=True
            )
        reference = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
        sym = analysis.t.symbol_table.get_sym_table()
        nccl = {
            rank: int(df[df["stream"].ne(-1)]["name"].map(lambda i: sym[i]).str.match(r"^nccl.*Kernel").sum())
            for rank, df in analysis.t.traces.items()
        }
        steps = len(analysis.get_profiler_steps())
    finally:
        logging.disable(logging.NOTSET)

    db = tmp_path / "t.duckdb"
    with open_database(db) as con:
        ingest_runs(con, [path], IngestOptions(workers=2))
    with open_database(Path(db), read_only=True) as con:
        ours = {
            r[0]: r[1:]
            for r in con.execute(
                "SELECT rank, compute_pct, non_compute_pct, idle_pct FROM temporal_breakdown"
            ).fetchall()
        }
        iterations = dict(con.execute("SELECT rank, count(*) FROM iterations GROUP BY rank").fetchall())
        collectives = dict(con.execute("SELECT rank, count(*) FROM collectives GROUP BY rank").fetchall())

    assert set(ours) == set(reference.index)
    for rank, (compute, non_compute, idle) in ours.items():
        ref = reference.loc[rank]
        assert abs(compute - ref["compute_time_pctg"]) <= 1.0
        assert abs(non_compute - ref["non_compute_time_pctg"]) <= 1.0
        assert abs(idle - ref["idle_time_pctg"]) <= 1.0
        assert iterations[rank] == steps
        assert collectives.get(rank, 0) == nccl[rank]
