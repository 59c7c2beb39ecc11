"""Properties of the vectorised nesting and of the breakdown views (hypothesis)."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracecal.decode.nesting import covered, enclosing, parents
from tracecal.schema import ITERATIONS, OPERATORS
from tracecal.sql.connection import ensure_schema
from tracecal.sql.loaders import insert_frame


@st.composite
def call_trees(draw: st.DrawFn) -> list[tuple[int, int, int, int]]:
    """Properly nested intervals on a few threads: (tid, id, ts, end); no two identical intervals."""
    out: list[tuple[int, int, int, int]] = []

    def fill(tid: int, lo: int, hi: int, depth: int) -> None:
        t = lo
        while t < hi and depth < 5 and draw(st.booleans()):
            start = draw(st.integers(t, hi))
            end = draw(st.integers(start, hi))
            if (start, end) == (lo, hi):  # identical to the parent: ambiguous, skip
                break
            out.append((tid, len(out), start, end))
            if end > start:
                fill(tid, start, end, depth + 1)
            t = end + 1 if end == start else end

    for tid in range(draw(st.integers(1, 3))):
        fill(tid, 0, 200, 0)
    return out


def _frame(rows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema={"tid": pl.Int64, "id": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64}, orient="row"
    )


@settings(max_examples=100, deadline=None)
@given(trees=call_trees(), points=st.lists(st.tuples(st.integers(0, 2), st.integers(-5, 205)), max_size=30))
def test_children_inside_parents_and_innermost_enclosing(trees: list, points: list) -> None:
    iv = _frame(trees)
    got = dict(parents(iv).select("id", "parent_id").iter_rows())
    for tid, i, s, e in trees:
        # brute force: the shortest other interval of the thread that contains this one (half-open:
        # a zero-length event at a parent's end time is after the parent, not inside it)
        cands = [
            (pe - ps, j)
            for t, j, ps, pe in trees
            if t == tid and j != i and ps <= s and e <= pe and s < pe and (ps, pe) != (s, e)
        ]
        expected = min(cands)[1] if cands else None
        if got[i] is not None:
            p = next(x for x in trees if x[1] == got[i])
            assert p[0] == tid and p[2] <= s and e <= p[3] and s < p[3]  # children inside parents
        if expected is not None and got[i] is not None:
            length = {x[1]: x[3] - x[2] for x in trees}
            assert length[expected] == length[got[i]]  # the innermost parent (ties: either)
        assert (got[i] is None) == (expected is None)
    pts = pl.DataFrame(
        {"tid": [p[0] for p in points], "qid": list(range(len(points))), "t": [p[1] for p in points]},
        schema={"tid": pl.Int64, "qid": pl.Int64, "t": pl.Int64},
    )
    inner = dict(enclosing(iv, pts).select("qid", "id").iter_rows())
    counts = dict(covered(iv, pts, lane=("tid",)).select("qid", "count").iter_rows())
    for q, (tid, t) in enumerate(points):
        holding = [(e - s, j) for tt, j, s, e in trees if tt == tid and s <= t < e]
        assert counts[q] == len(holding)
        if not holding:
            assert inner[q] is None
        else:
            got_iv = next(x for x in trees if x[1] == inner[q])
            assert got_iv[2] <= t < got_iv[3] and got_iv[3] - got_iv[2] == min(holding)[0]


@pytest.fixture(scope="module")
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect(":memory:")
    ensure_schema(connection)
    yield connection
    connection.close()


COMPONENTS = ["compute_fwd", "compute_bwd", "optimizer", "comm_dp", "comm_tp", "memcpy", "other"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    acts=st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 1_000), st.integers(0, 300), st.sampled_from(COMPONENTS)),
        min_size=1,
        max_size=25,
    )
)
def test_breakdowns_sum_to_span(con: duckdb.DuckDBPyConnection, acts: list) -> None:
    con.execute("DELETE FROM operators; DELETE FROM iterations")
    rows = []
    for i, (rank, ts, dur, comp) in enumerate(acts):
        row = dict.fromkeys(OPERATORS.column_names)
        kind = "memcpy" if comp == "memcpy" else "kernel"
        family = "comm" if comp.startswith("comm") else ("memcpy" if kind == "memcpy" else "gemm")
        row.update(
            run_id="r",
            rank=rank,
            event_id=i,
            kind=kind,
            name=f"k{i}",
            ts_ns=ts,
            dur_ns=dur,
            family=family,
            component=comp,
            iteration=1,
            phase="fwd",
        )
        rows.append(row)
    ops = pl.DataFrame(
        rows,
        schema={
            c.name: pl.Int64
            if c.sql_type == "BIGINT"
            else (
                pl.Int32
                if c.sql_type == "INTEGER"
                else (pl.Float64 if c.sql_type == "DOUBLE" else (pl.Boolean if c.sql_type == "BOOLEAN" else pl.Utf8))
            )
            for c in OPERATORS.columns
        },
        orient="row",
    )
    insert_frame(con, OPERATORS, ops)
    spans = ops.group_by("rank").agg(
        pl.col("ts_ns").min().alias("s"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("e")
    )
    its = spans.select(
        pl.lit("r").alias("run_id"),
        pl.col("rank").cast(pl.Int32),
        pl.lit(1, dtype=pl.Int32).alias("iteration"),
        pl.lit("ProfilerStep#1").alias("marker"),
        pl.col("s").alias("cpu_start_ns"),
        pl.col("e").alias("cpu_end_ns"),
        pl.col("s").alias("gpu_start_ns"),
        pl.col("e").alias("gpu_end_ns"),
        pl.col("s").alias("aligned_start_ns"),
        pl.col("e").alias("aligned_end_ns"),
        (pl.col("e") - pl.col("s")).alias("dur_ns"),
    )
    insert_frame(con, ITERATIONS, its)
    comp = con.execute(
        "SELECT rank, sum(time_ns), any_value(span_ns), min(time_ns) FROM component_breakdown GROUP BY rank"
    ).fetchall()
    expected = {r: e - s for r, s, e in spans.iter_rows()}
    assert {r for r, *_ in comp} == set(expected)
    for rank, total, span, smallest in comp:
        assert total == span == expected[rank] and smallest >= 0
    temporal = con.execute(
        "SELECT rank, span_ns, compute_ns + communication_ns + memory_ns + idle_ns, least(compute_ns, "
        "communication_ns, memory_ns, idle_ns) FROM temporal_breakdown"
    ).fetchall()
    for rank, span, total, smallest in temporal:
        assert span == total == expected[rank] and smallest >= 0


def test_tied_intervals_after_a_gap_do_not_reopen_the_previous_island(con: duckdb.DuckDBPyConnection) -> None:
    # many identical intervals after a gap: every window over them must order the ties the same way
    con.execute("DELETE FROM operators; DELETE FROM iterations")
    intervals = [(0, 10)] + [(20, 10)] * 40
    rows = []
    for i, (ts, dur) in enumerate(intervals):
        row = dict.fromkeys(OPERATORS.column_names)
        row.update(
            run_id="r",
            rank=0,
            event_id=i,
            kind="kernel",
            name=f"k{i}",
            ts_ns=ts,
            dur_ns=dur,
            family="gemm",
            component="compute_fwd",
            iteration=1,
            phase="fwd",
        )
        rows.append(row)
    con.executemany(
        f"INSERT INTO operators ({', '.join(OPERATORS.column_names)}) VALUES "
        f"({', '.join('?' for _ in OPERATORS.column_names)})",
        [[r[c] for c in OPERATORS.column_names] for r in rows],
    )
    con.execute(
        "INSERT INTO iterations (run_id, rank, iteration, marker, cpu_start_ns, cpu_end_ns, gpu_start_ns, gpu_end_ns,"
        " aligned_start_ns, aligned_end_ns, dur_ns) VALUES ('r', 0, 1, 'ProfilerStep#1', 0, 30, 0, 30, 0, 30, 30)"
    )
    parts = dict(con.execute("SELECT component, time_ns FROM component_breakdown WHERE rank = 0").fetchall())
    assert parts == {"compute_fwd": 20, "idle": 10}
    temporal = con.execute("SELECT * FROM temporal_breakdown WHERE rank = 0").fetchall()
    assert temporal, "temporal_breakdown has a row for the rank"
