"""``tracecal.decode.nesting`` answers the same on every batch: a batch with a NULL lane value anywhere
is answered by a polars plan, any other by a numpy sweep, and an interval in a NULL lane (which
matches no point and no other interval) must change no other answer."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from tracecal.decode import nesting
from tracecal.decode.nesting import covered, enclosing, parents

_IV = {"rank": pl.Int32, "tid": pl.Int64, "id": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64}
_PT = {"rank": pl.Int32, "tid": pl.Int64, "qid": pl.Int64, "t": pl.Int64}
LANE = ("rank", "tid")
NULL_LANE_ID = 10**9
"""Id of the interval that ``_with_a_null_lane`` adds."""


def _with_a_null_lane(iv: pl.DataFrame) -> pl.DataFrame:
    """``iv`` plus an interval whose thread is NULL, spanning every time the tests use."""
    return pl.concat([iv, pl.DataFrame([(0, None, NULL_LANE_ID, -100, 100)], schema=_IV, orient="row")])


@settings(max_examples=150, deadline=None)
@given(
    intervals=st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 60), st.integers(0, 15)), max_size=40
    ),
    points=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(-2, 80)), min_size=1, max_size=20),
)
def test_a_null_lane_changes_no_other_answer(intervals: list, points: list) -> None:
    # any overlaps (nested or partial), zero-length intervals; no two identical intervals on a lane
    # (their order is left to polars' unstable sort, see test_identical_intervals_later_id_inside)
    unique = list(dict.fromkeys((r, t, s, s + d) for r, t, s, d in intervals))
    iv = pl.DataFrame([(r, t, i * 3, s, e) for i, (r, t, s, e) in enumerate(unique)], schema=_IV, orient="row")
    pts = pl.DataFrame([(r, t, q * 7, x) for q, (r, t, x) in enumerate(points)], schema=_PT, orient="row")
    null_lane = _with_a_null_lane(iv)
    for outermost in (False, True):
        got = enclosing(iv, pts, lane=LANE, outermost=outermost).sort("qid")
        assert got.equals(enclosing(null_lane, pts, lane=LANE, outermost=outermost).sort("qid"))
    got = covered(iv, pts, lane=LANE).sort("qid")
    assert got.equals(covered(null_lane, pts, lane=LANE).sort("qid"))
    # half-open containment, counted by hand
    by_hand = [
        sum(r == pr and t == pt and s <= x < e for r, t, _, s, e in iv.iter_rows()) for pr, pt, _, x in pts.iter_rows()
    ]
    assert got["count"].to_list() == by_hand
    if iv.height:
        got = parents(iv, lane=LANE).sort("id")
        assert got.equals(parents(null_lane, lane=LANE).filter(pl.col("id") != NULL_LANE_ID).sort("id"))
        assert got.schema == {"id": pl.Int64, "parent_id": pl.Int64, "depth": pl.Int32}


def test_identical_intervals_later_id_inside() -> None:
    # profilers round times: an operator and the one it calls can have the same start and end
    iv = pl.DataFrame([(0, 0, 5, 0, 10), (0, 0, 6, 0, 10), (0, 0, 7, 2, 4)], schema=_IV, orient="row")
    assert dict(parents(iv, lane=LANE).select("id", "parent_id").iter_rows()) == {5: None, 6: 5, 7: 6}
    pts = pl.DataFrame([(0, 0, 1, 1), (0, 0, 2, 3)], schema=_PT, orient="row")
    inner = enclosing(iv, pts, lane=LANE).sort("qid")
    assert inner["id"].to_list() == [6, 7] and inner["depth"].to_list() == [2, 3]
    assert enclosing(iv, pts, lane=LANE, outermost=True).sort("qid")["id"].to_list() == [5, 5]


def test_null_lanes_and_string_lanes() -> None:
    # a NULL thread: the polars plan answers (NULL never matches a lane); string lanes get dense codes
    iv = pl.DataFrame(
        {"tag": ["a", "a", "b"], "tid": [1, None, 1], "id": [1, 2, 3], "ts_ns": [0, 0, 0], "end_ns": [10, 10, 10]}
    )
    pts = pl.DataFrame({"tag": ["a", "b", "a"], "tid": [1, 1, None], "qid": [1, 2, 3], "t": [5, 5, 5]})
    got = enclosing(iv, pts, lane=("tag", "tid")).sort("qid")
    assert got["id"].to_list() == [1, 3, None]
    strings_only = enclosing(iv.drop("tid"), pts.drop("tid"), lane=("tag",)).sort("qid")
    assert strings_only["id"].to_list() == [2, 3, 2] and strings_only["depth"].to_list() == [2, 1, 2]


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 2),
            st.sampled_from([5, 10**13, -(10**13)]),
            st.integers(0, 5),
            st.integers(0, 3),
            st.integers(-3, 0),
            st.integers(0, 4),
        ),
        max_size=40,
    ),
    far=st.booleans(),
)
def test_packed_sweep_order_equals_lexsort(rows: list, far: bool) -> None:
    cols = [np.array(c, dtype=np.int64) for c in zip(*rows, strict=True)] if rows else [np.zeros(0, np.int64)] * 6
    rank, tid, t, order, neg_dur, tie = cols
    if far and len(t):  # a time span too wide to pack: the lexsort itself
        t = t.copy()
        t[0] = -(2**62)
    lanes = [rank, tid]
    expected = np.lexsort((tie, neg_dur, order, t, *reversed(lanes)))
    assert np.array_equal(nesting.sweep_order(lanes, t, order, neg_dur, tie), expected)


def test_name_masks_equal_membership() -> None:
    names = ["ProfilerStep#1", None, "aten::mm", "ProfilerStep#2", "aten::mm", None, "x"]
    frame = pl.DataFrame({"name": names, "kind": ["a"] * len(names)})
    index = nesting.NameIndex(frame, [r"^ProfilerStep#", r"^nothing$"])
    for pattern in (r"^ProfilerStep#", r"^nothing$", r"mm$"):
        mask = frame.select(nesting.names_like(frame, pattern, index)).to_series()
        member = frame.select(index.like(pattern)).to_series()
        assert mask.to_list() == member.to_list()
        negated = frame.filter(~nesting.names_like(frame, pattern, index))  # NULL names stay out, as with is_in
        assert negated.height == frame.filter(~index.like(pattern)).height
    empty = pl.DataFrame({"name": [None, None]}, schema={"name": pl.Utf8})
    assert empty.select(nesting.names_like(empty, "x", nesting.NameIndex(empty))).to_series().to_list() == [None, None]
