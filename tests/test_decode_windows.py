"""Decoding a rank in windows of iterations gives the rows of decoding it whole (docs/decode.md#windows).

Each run is decoded whole, then again with ``WINDOW_EVENTS`` so small that every iteration is a
window of its own; ``operators``, ``collectives``, ``iterations`` and the ranks' clock columns must
be the same rows (``EXCEPT ALL`` both ways). Real traces from ``../shared`` (several ProfilerSteps on
GPU ranks, a CPU-only gloo rank, an Nsight run without markers) and the reference workload (two gloo
ranks matched across), and tiny traces built in code whose outcome depends on the context rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from decode_helpers import events, kernel, launch, op, step

import tracecal.pipeline.decode as pipeline_decode
from tests.conftest import KINETO, NSYS
from tracecal.decode.iterations import iteration_windows
from tracecal.decode.link import with_end
from tracecal.decode.rank import decode_ranks
from tracecal.decode.windows import RankWindow, crossing_windows, events_per_iteration, window_firsts
from tracecal.ingest.shards import write_shard
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.schema import EVENTS, arrow_schema
from tracecal.sql.connection import open_database
from tracecal.sql.event_store import EventStore, rank_file, refresh_events_view
from tracecal.vocabulary import ParallelLayout

COMPARED = {
    "operators": "*",
    "collectives": "*",
    "iterations": "*",
    "ranks": "run_id, rank, clock_offset_ns, clock_residual_ns",
}
"""The rows decode writes, per table (of ``ranks``, only the columns decode sets)."""
ONE_RANK = ParallelLayout(world_size=1)

SHARED_RUNS = {
    "a100_ddp": KINETO / "single" / "a100_ddp_rank0_of_2.json.gz",  # GPU, 3 ProfilerSteps, NCCL
    "v100_resnet50": KINETO / "single" / "v100_resnet50_2021_schema.pt.trace.json.gz",  # GPU, 6 steps
    "mi300x_resnet": KINETO / "single" / "mi300x_ddp_resnet_rank0_of_8.json.gz",  # ROCm, 3 steps
    "cpu_gloo": KINETO / "single" / "cpu_gloo_rank-34_of_300.pt.trace.json.gz",  # CPU-only gloo, 5 steps
    "sampled": KINETO / "sampled_2_of_128",  # 2 GPU ranks, 2 steps each, matched across
    "nsys_no_markers": NSYS / "mfu_2gpu_after.sqlite.gz",  # 2 ranks, no markers: one window each
}


@pytest.fixture(scope="module")
def shared_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    """The shared runs ingested (and so decoded whole) once for the module."""
    root = tmp_path_factory.mktemp("windows")
    run_dirs = []
    for run_id, source in SHARED_RUNS.items():
        run_dir = root / run_id  # the run is named after its directory
        run_dir.mkdir()
        for path in sorted(source.iterdir()) if source.is_dir() else [source]:
            (run_dir / path.name).symlink_to(path)
        run_dirs.append(run_dir)
    with open_database(root / "shared.duckdb") as con:
        ingest_runs(con, run_dirs, IngestOptions(workers=1))
        yield con


def _windows_used(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every iteration its own window; the returned list grows by one per window decoded."""
    monkeypatch.setattr(pipeline_decode, "WINDOW_EVENTS", 1)
    used: list[int] = []
    whole = pipeline_decode.decode_ranks

    def spy(frame: Any, **kwargs: Any) -> Any:
        if kwargs.get("window") is not None:
            used.append(kwargs["window"].iterations.height)
        return whole(frame, **kwargs)

    monkeypatch.setattr(pipeline_decode, "decode_ranks", spy)
    return used


def _differences(con: duckdb.DuckDBPyConnection, run_id: str, decode: Callable[[], object]) -> dict[str, int]:
    """Rows of each decoded table that ``decode`` adds or removes from the run's current rows."""
    for table, columns in COMPARED.items():
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE before_{table} AS SELECT {columns} FROM {table} WHERE run_id = ?", [run_id]
        )
    decode()
    out = {}
    for table, columns in COMPARED.items():
        after = f"SELECT {columns} FROM {table} WHERE run_id = $run_id"
        removed = f"SELECT count(*) FROM (SELECT * FROM before_{table} EXCEPT ALL {after})"
        added = f"SELECT count(*) FROM ({after} EXCEPT ALL SELECT * FROM before_{table})"
        out[table] = sum(con.execute(q, {"run_id": run_id}).fetchall()[0][0] for q in (removed, added))
    return out


def _rows(con: duckdb.DuckDBPyConnection, table: str, run_id: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]).fetchall()[0][0]


@pytest.mark.parametrize(
    ("run_id", "windows"),
    [
        ("a100_ddp", 3),
        ("v100_resnet50", 6),
        ("mi300x_resnet", 3),
        ("cpu_gloo", 5),
        ("sampled", 4),
        ("nsys_no_markers", 0),
    ],
)
def test_windows_give_the_whole_rank_rows_on_shared_traces(
    shared_db: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch, run_id: str, windows: int
) -> None:
    con = shared_db
    assert _rows(con, "operators", run_id) > 0 and _rows(con, "iterations", run_id) > 0
    used = _windows_used(monkeypatch)
    assert _differences(con, run_id, lambda: pipeline_decode.decode_stored_run(con, run_id)) == dict.fromkeys(
        COMPARED, 0
    )
    # one iteration per window; a rank without markers is one window, decoded whole
    assert used == [1] * windows


def test_windows_give_the_whole_rank_rows_on_matched_gloo_ranks(
    tiny_workload: Callable[[int, int], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_database(tmp_path / "t.duckdb") as con:
        (report,) = ingest_runs(con, [tiny_workload(2, 64)], IngestOptions(workers=1)).runs
        assert report.decode is not None and report.decode.matched_instances > 0
        used = _windows_used(monkeypatch)
        run_id = report.run_id
        assert _differences(con, run_id, lambda: pipeline_decode.decode_stored_run(con, run_id)) == dict.fromkeys(
            COMPARED, 0
        )
        assert len(used) == _rows(con, "iterations", run_id) > 2


def _store(con: duckdb.DuckDBPyConnection, run_id: str, rows: list[dict[str, Any]]) -> None:
    """A one-rank run of ``rows`` (``decode_helpers`` events) in the database, not decoded."""
    store = EventStore(con)
    run_dir = store.new_run_dir(run_id)
    write_shard(events(rows).to_arrow().cast(arrow_schema(EVENTS)), rank_file(run_dir, 0))
    con.execute("INSERT INTO runs (run_id, world_size, events_dir) VALUES (?, 1, ?)", [run_id, store.relative(run_dir)])
    con.execute("INSERT INTO ranks (run_id, rank) VALUES (?, 0)", [run_id])
    refresh_events_view(con)


def test_context_rows_link_scope_and_phase_work_launched_after_a_window_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [
        step(1, 100, 1000),  # 0: [100, 1100); window 0
        {"kind": "user_annotation", "name": "train_loop", "ts": 50, "dur": 3000, "tid": 2},  # 1: all of tid 2
        op("aten::add", 200, 50),  # 2
        launch(61, 210),  # 3
        op("aten::mm", 1000, 300, tid=2, external_id=9),  # 4: crosses into window 1
        {"kind": "user_annotation", "name": "## backward ##", "ts": 1050, "dur": 500, "tid": 3},  # 5: crosses too
        step(2, 1100, 1000),  # 6: [1100, 2100); window 1
        launch(62, 1150, tid=2, external_id=9),  # 7: inside aten::mm (a context row of window 1)
        launch(63, 1200, tid=3),  # 8: under ## backward ## (a context row), no CPU operator
        kernel("elementwise_kernel", 61, 1120, 10),  # 9: runs in window 1's time, launched in window 0
        kernel("volta_sgemm_128x64_nn", 62, 1160, 50),  # 10
        kernel("elementwise_kernel", 63, 1210, 10),  # 11
        op("aten::relu", 2150, 10),  # 12: after the last step
    ]
    with open_database(tmp_path / "t.duckdb") as con:
        _store(con, "tiny", rows)
        pipeline_decode.decode_stored_run(con, "tiny")
        used = _windows_used(monkeypatch)
        assert _differences(con, "tiny", lambda: pipeline_decode.decode_stored_run(con, "tiny")) == dict.fromkeys(
            COMPARED, 0
        )
        assert used == [1, 1]
        got = con.execute(
            "SELECT event_id, iteration, link, cpu_op_name, scope_name, phase FROM operators ORDER BY event_id"
        ).fetchall()
    # each answer needs a context row of window 1: aten::mm's External id, the scopes around the launch
    assert got == [
        (9, 1, "time", "aten::add", None, "fwd"),
        (10, 2, "external_id", "aten::mm", "train_loop", "bwd"),
        (11, 2, "none", None, "## backward ##", "bwd"),
    ]


def test_a_cpu_operator_crossing_a_window_start_is_output_once_and_only_if_a_leaf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [
        step(1, 100, 1000),  # 0: [100, 1100)
        op("c10d::allreduce_", 1000, 5, input_dims="[[[16]]]"),  # 1
        op("aten::long", 1000, 300, tid=2),  # 2: crosses into window 1 and encloses aten::add there
        op("aten::short", 1050, 100, tid=3),  # 3: crosses, encloses nothing: a leaf, output once
        {"kind": "user_annotation", "name": "gloo:all_reduce", "ts": 1010, "dur": 290, "tid": 4,
         "input_dims": "[[16]]"},  # 4: gloo work crossing the window start
        step(2, 1100, 1000),  # 5: [1100, 2100)
        op("aten::add", 1150, 20, tid=2),  # 6: nested in aten::long
        op("aten::mul", 1200, 10),  # 7
    ]  # fmt: skip
    with open_database(tmp_path / "t.duckdb") as con:
        _store(con, "tiny", rows)
        pipeline_decode.decode_stored_run(con, "tiny")
        used = _windows_used(monkeypatch)
        assert _differences(con, "tiny", lambda: pipeline_decode.decode_stored_run(con, "tiny")) == dict.fromkeys(
            COMPARED, 0
        )
        assert used == [1, 1]
        names = con.execute("SELECT name, iteration FROM operators ORDER BY event_id").fetchall()
        instances = con.execute("SELECT event_id, name, seq_in_group FROM collectives").fetchall()
    assert names == [("c10d::allreduce_", 1), ("aten::short", 1), ("gloo:all_reduce", 1), ("aten::add", 2),
                     ("aten::mul", 2)]  # fmt: skip
    assert instances == [(4, "all_reduce", 0)]


def test_a_window_without_gpu_activity_of_a_gpu_rank_has_no_cpu_leaf_operators() -> None:
    frame = events([step(1, 0, 100), op("aten::add", 10, 5)])
    iterations = iteration_windows(with_end(frame))
    none = np.zeros(0, dtype=np.int64)
    as_gpu = decode_ranks(frame, layout=ONE_RANK, window=RankWindow(iterations, True, none, none))
    as_cpu = decode_ranks(frame, layout=ONE_RANK, window=RankWindow(iterations, False, none, none))
    assert (as_gpu.operators.height, as_cpu.operators.height) == (0, 1)
    assert as_gpu.iterations.get_column("dur_ns").to_list() == [100]  # no GPU work: the CPU span


def test_iterations_group_into_windows_up_to_the_budget_and_split_only_where_the_start_grows() -> None:
    assert window_firsts([0, 10, 20, 30], [4, 4, 4, 4], 8) == [0, 2]
    assert window_firsts([0, 10, 20, 30], [4, 9, 1, 4], 8) == [0, 1, 2]  # a larger iteration is its own
    assert window_firsts([0, 10, 10, 30], [4, 4, 4, 4], 4) == [0, 1, 3]  # equal starts stay together


def test_an_interval_is_context_for_the_windows_whose_start_it_strictly_contains() -> None:
    """Window w starts at bounds[w - 1]: an interval is context for it when start < bound < end; one
    that starts or ends exactly at a bound is not context for that window."""
    bounds = [100, 200, 300]
    ids = np.arange(6, dtype=np.int64)
    starts = np.array([10, 100, 150, 50, 250, 310], dtype=np.int64)
    ends = np.array([100, 201, 350, 120, 300, 400], dtype=np.int64)
    found, first, last = crossing_windows(ids, starts, ends, bounds)
    assert found.tolist() == [1, 2, 3]
    assert dict(zip(found.tolist(), zip(first.tolist(), last.tolist(), strict=True), strict=True)) == {
        1: (2, 2),  # starts at window 1's start, crosses window 2's
        2: (2, 3),
        3: (1, 1),
    }


def test_events_count_for_the_last_iteration_starting_at_or_before_them() -> None:
    """Events before the first iteration, and events without a time, count for the first iteration."""
    starts = [100, 200, 300]
    ts = np.array([5, 100, 150, 199, 200, 250, 300, 999, 0], dtype=np.int64)
    missing = np.array([False] * 8 + [True])
    assert events_per_iteration(starts, ts, missing).tolist() == [5, 2, 2]
    assert events_per_iteration(starts, ts[:8]).tolist() == [4, 2, 2]
