"""`tracecal export`: the measured timeline is a Kineto trace that ingests back to the same run, spans nest
on every thread, collectives are linked by flows, and the predicted timeline sits beside the measured one."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.conftest import KINETO
from tracecal.cli.main import app
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.predict import export as ex
from tracecal.predict.export_store import export_run
from tracecal.sources.kineto.parser import parse_kineto_file
from tracecal.sql.connection import open_database

DLRM = KINETO / "dlrm_8rank"

OPERATOR_COLUMNS = (
    "rank, kind, name, ts_ns, dur_ns, device, stream, correlation, runtime_name, runtime_ts_ns, runtime_dur_ns, "
    "cpu_op_name, cpu_op_ts_ns, cpu_op_dur_ns, input_dims, input_types, sequence_number, family, phase, "
    "component, iteration, link"
)
"""What must survive the round trip (``cpu_tid`` and ``scope_name`` too, except for spans moved to an
overlap thread: checked separately)."""
COLLECTIVE_COLUMNS = "rank, name, ts_ns, dur_ns, dtype, pg_name, pg_ranks, peer, role, iteration, stream, size_bytes"
ITERATION_COLUMNS = "rank, iteration, marker, cpu_start_ns, cpu_end_ns, gpu_start_ns, gpu_end_ns, dur_ns"
MATCHES = (
    "SELECT list(rank ORDER BY rank) AS ranks, list(ts_ns ORDER BY rank) AS starts FROM {t} WHERE {w} GROUP BY match_id"
)


class HalfModel:
    """A duration model that predicts half of every measured duration (the export only needs a replay)."""

    def predict(self, rows: pl.DataFrame) -> np.ndarray:
        return (rows["dur_ns"].cast(pl.Float64) * 0.5).to_numpy()


def _ingest(db: Path, run_dir: Path, run_id: str | None = None) -> None:
    with open_database(db) as con:
        ingest_runs(con, [run_dir], IngestOptions(workers=1, run_id=run_id) if run_id else IngestOptions(workers=1))


def _differences(db: Path, a: str, b: str, *, iteration: int | None = None, ops: str = OPERATOR_COLUMNS) -> dict:
    """Rows of A not in B and of B not in A (EXCEPT ALL) per table, and the match structures compared."""
    where = "run_id = ?" + ("" if iteration is None else f" AND iteration = {int(iteration)}")
    queries = {
        "operators": f"SELECT {ops} FROM operators WHERE {where}",
        "collectives": f"SELECT {COLLECTIVE_COLUMNS} FROM collectives WHERE {where}",
        "iterations": f"SELECT {ITERATION_COLUMNS} FROM iterations WHERE {where}",
        "matches": MATCHES.format(t="collectives", w=where + " AND match_id IS NOT NULL"),
    }
    out = {}
    with open_database(Path(db), read_only=True) as con:
        for name, q in queries.items():
            rows = con.execute(f"SELECT count(*) FROM ({q})", [a]).fetchall()[0][0]
            left = con.execute(f"SELECT count(*) FROM ({q} EXCEPT ALL {q})", [a, b]).fetchall()[0][0]
            right = con.execute(f"SELECT count(*) FROM ({q} EXCEPT ALL {q})", [b, a]).fetchall()[0][0]
            out[name] = (rows, left, right)
    return out


def _load(path: Path) -> dict[str, Any]:
    """A trace with its µs as Decimals (a float cannot hold a ns fraction of an epoch timestamp)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f, parse_float=Decimal)


def _spans(doc: dict[str, Any]) -> pl.DataFrame:
    rows = [
        (e["pid"], e["tid"], int(Decimal(e["ts"]) * 1000), int(Decimal(e.get("dur", 0)) * 1000))
        for e in doc["traceEvents"]
        if e["ph"] == "X"
    ]
    return pl.DataFrame(rows, schema=["pid", "tid", "ts_ns", "dur_ns"], orient="row")


@pytest.fixture(scope="module")
def dlrm_db(ingested_copy: Callable[..., Path]) -> Path:
    return ingested_copy(DLRM)


def test_dlrm_round_trip_gives_back_operators_collectives_iterations(dlrm_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "dlrm_8rank_export"
    result = CliRunner().invoke(app, ["export", "dlrm_8rank", "--db", str(dlrm_db), "-o", str(out), "--split-ranks"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [f"rank{r}.pt.trace.json.gz" for r in range(8)] + ["run.json"]
    db = tmp_path / "rt.duckdb"
    _ingest(db, DLRM)
    _ingest(db, out)
    diffs = _differences(db, "dlrm_8rank", "dlrm_8rank_export", ops=OPERATOR_COLUMNS + ", cpu_tid, scope_name")
    assert diffs == {
        "operators": (2244, 0, 0),
        "collectives": (64, 0, 0),
        "iterations": (8, 0, 0),
        "matches": (8, 0, 0),
    }


def test_dlrm_single_file_nests_names_ranks_and_links_collectives(dlrm_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "dlrm.json.gz"
    result = CliRunner().invoke(app, ["export", "dlrm_8rank", "--db", str(dlrm_db), "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = _load(out)
    assert doc["distributedInfo"] == {"world_size": 8, "backend": "nccl"}
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert names == {r + 1: f"rank {r}" for r in range(8)}
    spans = _spans(doc)
    assert spans.height == 19_789 and ex.check_nesting(spans) == 0
    flows = pl.DataFrame([(e["id"], e["ph"], e["pid"]) for e in doc["traceEvents"] if e["ph"] in "stf"],
                         schema=["id", "ph", "pid"], orient="row")  # fmt: skip
    # the 8 matched instances, each through its 8 ranks: one start, six steps, one finish
    per_flow = flows.group_by("id").agg(pl.col("ph").sort().str.join(""), pl.col("pid").n_unique())
    assert per_flow.height == 8 and set(per_flow["ph"]) == {"fs" + "t" * 6} and set(per_flow["pid"]) == {8}
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert {"family", "phase", "component", "measured_dur_ns", "stream", "device"} <= set(kernels[0]["args"])


@pytest.mark.slow
def test_workload_iteration_round_trip(tiny_workload: Callable[[int, int], Path], tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    _ingest(db, tiny_workload(2, 64), "gpt")
    out = tmp_path / "gpt_export"
    with open_database(db, read_only=True) as con:
        best = con.execute("SELECT iteration FROM best_iteration WHERE run_id = 'gpt'").fetchall()[0][0]
        result = export_run(con, "gpt", out, iteration=best, split_ranks=True)
    _ingest(db, out)
    # one iteration exported: the order of collectives within their group restarts, the rest survives
    diffs = _differences(db, "gpt", "gpt_export", iteration=best)
    assert all(left == right == 0 for _, left, right in diffs.values()), diffs
    assert diffs["collectives"][0] > 0 and diffs["matches"][0] > 0 and diffs["iterations"][0] == 2
    # gloo work ranges outlive their scope on the main thread: they move to an overlap thread, the
    # only operators whose thread and enclosing scope change
    assert result.tracks.moved_spans > 0
    moved = _differences(db, "gpt", "gpt_export", iteration=best, ops=OPERATOR_COLUMNS + ", cpu_tid, scope_name")
    assert 0 < moved["operators"][1] == moved["operators"][2] <= result.tracks.moved_spans
    for path in out.glob("*.json.gz"):
        assert ex.check_nesting(_spans(_load(path))) == 0


def test_both_adds_a_predicted_process_per_rank(dlrm_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "both.json"
    with open_database(dlrm_db, read_only=True) as con:
        result = export_run(con, "dlrm_8rank", out, what="both", model=HalfModel())
    assert result.iteration == 10 and result.prediction is not None
    doc = _load(out)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert names == {**{r + 1: f"rank {r}" for r in range(8)},
                     **{r + 1 + ex.PREDICTED_PID_OFFSET: f"rank {r} (predicted)" for r in range(8)}}  # fmt: skip
    predicted = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] > ex.PREDICTED_PID_OFFSET]
    kernels = [e for e in predicted if e["cat"] == "kernel" and e["args"]["family"] != "comm"]
    # a predicted span lasts its replayed duration: half the measured one (collective members, which
    # wait for their last member, excluded)
    assert kernels and all(
        int(Decimal(e["dur"]) * 1000) == e["args"]["predicted_dur_ns"] <= e["args"]["measured_dur_ns"] for e in kernels
    )
    assert sum(e["args"]["predicted_dur_ns"] for e in kernels) < 0.6 * sum(
        e["args"]["measured_dur_ns"] for e in kernels
    )
    measured_kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["pid"] < 100)
    assert measured_kernel["args"]["predicted_dur_ns"] <= measured_kernel["args"]["measured_dur_ns"]
    assert ex.check_nesting(_spans(doc)) == 0
    # collective members of the replay are linked too, under their own ids
    ids = {e["id"] for e in doc["traceEvents"] if e["ph"] == "s"}
    assert len(ids) == 16 and sum(i >= ex.PREDICTED_FLOW_ID_OFFSET for i in ids) == 8


def test_bad_input_is_one_line_and_writes_nothing(dlrm_db: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "x.json"
    cases = {
        ("nope",): "no run 'nope'",
        ("dlrm_8rank", "--iteration", "99"): "has no iteration 99",
        ("dlrm_8rank", "--what", "predicted"): "calibrate --cluster",
        ("dlrm_8rank", "--what", "predicted", "--cluster", "nowhere"): "calibrate --cluster nowhere",
        ("dlrm_8rank", "--what", "all"): "unknown --what",
    }
    for args, message in cases.items():
        result = runner.invoke(app, ["export", *args, "--db", str(dlrm_db), "-o", str(out)])
        assert result.exit_code == 2 and message in result.output and result.output.count("\n") <= 2, result.output
    suffix = runner.invoke(app, ["export", "dlrm_8rank", "--db", str(dlrm_db), "-o", str(tmp_path / "x.txt")])
    assert suffix.exit_code == 2 and "name a .json or .json.gz file" in suffix.output
    (tmp_path / "file").write_text("")  # a file where the output's directory should be
    blocked = tmp_path / "file" / "x.json"
    unwritable = runner.invoke(app, ["export", "dlrm_8rank", "--db", str(dlrm_db), "-o", str(blocked)])
    assert unwritable.exit_code == 2 and "cannot write" in unwritable.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_lanes_move_only_spans_that_do_not_nest() -> None:
    # [0,10) holds [1,3) and [3,9); [8,12) starts inside [3,9) and ends after it: lane 1; [20,25): lane 0
    starts = np.array([0, 1, 3, 8, 20])
    ends = np.array([10, 3, 9, 12, 25])
    assert ex.nesting_lanes(starts, ends).tolist() == [0, 0, 0, 1, 0]
    spans = pl.DataFrame({"pid": [1] * 5, "tid": [7] * 5, "ts_ns": starts, "dur_ns": ends - starts})
    assert ex.check_nesting(spans) == 1


def test_event_times_are_exact_microsecond_text_that_reads_back_as_the_same_nanoseconds(tmp_path: Path) -> None:
    ns = [0, 1, 999, 1000, 1500, 4884159656875035, 1694128201428123500, -2500]
    durations = [1500, 2000, *ns[2:]]
    spans = pl.DataFrame({"pid": 1, "tid": 1, "name": "op", "cat": "cpu_op", "ts_ns": ns, "dur_ns": durations})
    text = "".join(ex.event_lines(spans))
    written = re.findall(r'"ts":([^,]*),', text)
    assert written[:5] == ["0", "0.001", "0.999", "1", "1.500"] and written[-1] == "-2.500"
    trace = tmp_path / "exported.json"
    trace.write_text('{"traceEvents": [' + text + "]}")
    events = parse_kineto_file(trace).events
    assert isinstance(events, pa.Table)
    assert events.column("ts_ns").to_pylist() == ns
    assert events.column("dur_ns").to_pylist() == durations


def _walk_lanes(starts: list[int], ends: list[int]) -> list[int]:
    """Reference: one stack of open ends per lane; a span goes to the first lane where it ends inside
    the innermost span still open (or nothing is open)."""
    stacks: list[list[int]] = []
    lanes = []
    for s, e in zip(starts, ends, strict=True):
        for stack in stacks:
            while stack and stack[-1] <= s:
                stack.pop()
        lane = next((k for k, stack in enumerate(stacks) if not stack or e <= stack[-1]), len(stacks))
        if lane == len(stacks):
            stacks.append([])
        stacks[lane].append(e)
        lanes.append(lane)
    return lanes


@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 6)), min_size=1, max_size=14))
def test_nesting_lanes_agree_with_a_stack_walk(spans: list[tuple[int, int]]) -> None:
    # sorted as a thread is: by start, longest first; ties, empty spans and touching ends included
    ordered = sorted(spans, key=lambda sd: (sd[0], -sd[1]))
    starts = np.array([s for s, _ in ordered])
    ends = np.array([s + d for s, d in ordered])
    assert ex.nesting_lanes(starts, ends).tolist() == _walk_lanes(starts.tolist(), ends.tolist())
