"""The macros the views share (``tracecal/sql/macros/``), checked on intervals small enough to add up
by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracecal.sql.connection import open_database


@pytest.mark.parametrize(
    ("intervals", "union_ns"),
    [
        ([(0, 10)], 10),
        ([(0, 10), (20, 25)], 15),  # apart
        ([(0, 10), (5, 12)], 12),  # overlapping
        ([(0, 10), (2, 4), (3, 12)], 12),  # nested, then one reaching past the outer end
        ([(0, 10), (10, 15)], 15),  # touching
        ([(0, 10), (0, 4), (0, 10)], 10),  # tied starts, in any order
        ([(5, 5), (7, 3), (0, 2)], 2),  # empty and reversed intervals cover nothing
    ],
)
def test_interval_union_counts_overlapped_time_once(
    db_path: Path, intervals: list[tuple[int, int]], union_ns: int, template_cache: Path
) -> None:
    rows = [("run", 0, 1, s, e) for s, e in intervals] + [("run", 1, 1, 0, 1000)]  # another rank stays apart
    with open_database(db_path, cache_dir=template_cache) as con:
        con.execute("CREATE TEMP TABLE spans (run_id VARCHAR, rank INTEGER, level INTEGER, s BIGINT, e BIGINT)")
        con.executemany("INSERT INTO spans VALUES (?, ?, ?, ?, ?)", rows)
        got = con.execute("SELECT rank, level, union_ns FROM interval_union('spans') ORDER BY rank").fetchall()
    assert got == [(0, 1, union_ns), (1, 1, 1000)]


def test_interval_union_reads_a_cte_of_the_calling_query(db_path: Path, template_cache: Path) -> None:
    with open_database(db_path, cache_dir=template_cache) as con:
        got = con.execute(
            "WITH levels AS (SELECT * FROM (VALUES ('run', 0, 1, 0, 4), ('run', 0, 2, 0, 4), ('run', 0, 2, 2, 9))"
            " AS v(run_id, rank, level, s, e))"
            " SELECT level, union_ns FROM interval_union('levels') ORDER BY level"
        ).fetchall()
    assert got == [(1, 4), (2, 9)]
