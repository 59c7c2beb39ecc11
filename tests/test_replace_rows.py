"""``replace_rows``: the one delete-then-insert of the package, atomic, by condition or by key."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from tracecal.schema import MODELS
from tracecal.sql.connection import NEW_ROWS, open_database, replace_rows


def _models(*rows: tuple[str, str, str, int]) -> pa.Table:
    """``models`` rows with model_id, cluster, family, n_train (other columns NULL: ignored here)."""
    ids, clusters, families, n_train = (list(c) for c in zip(*rows, strict=True)) if rows else ([], [], [], [])
    return pa.table({"model_id": ids, "cluster": clusters, "family": families, "n_train": n_train})


def _stored(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, str, int]]:
    query = "SELECT model_id, cluster, family, n_train FROM models ORDER BY model_id"
    return [tuple(r) for r in con.execute(query).fetchall()]


def test_replace_rows_deletes_by_condition_inserts_and_returns_what_it_deleted(
    db_path: Path, template_cache: Path
) -> None:
    with open_database(db_path, cache_dir=template_cache) as con:
        replace_rows(
            con, MODELS, _models(("a", "x", "gemm", 1), ("b", "x", "norm", 2), ("c", "y", "gemm", 3)), where="false"
        )
        gone = replace_rows(
            con, MODELS, _models(("d", "x", "gemm", 4)), where="cluster = ? AND family = ?", params=["x", "gemm"],
            returning=("model_id",),
        )  # fmt: skip
        assert gone == [("a",)]
        assert _stored(con) == [("b", "x", "norm", 2), ("c", "y", "gemm", 3), ("d", "x", "gemm", 4)]
        assert replace_rows(con, MODELS, None, where="cluster = ?", params=["x"]) == []  # delete only
        assert _stored(con) == [("c", "y", "gemm", 3)]


def test_replace_rows_upserts_by_key_through_the_new_rows_view(db_path: Path, template_cache: Path) -> None:
    with open_database(db_path, cache_dir=template_cache) as con:
        replace_rows(con, MODELS, _models(("a", "x", "gemm", 1), ("b", "x", "norm", 2)), where="false")
        replace_rows(
            con, MODELS, _models(("b", "x", "norm", 20), ("e", "x", "loss", 5)),
            where=f"model_id IN (SELECT model_id FROM {NEW_ROWS})",
        )  # fmt: skip
        assert _stored(con) == [("a", "x", "gemm", 1), ("b", "x", "norm", 20), ("e", "x", "loss", 5)]


def test_replace_rows_is_all_or_nothing(db_path: Path, template_cache: Path) -> None:
    """An insert that fails (a value the column cannot hold) leaves the deleted rows in place."""
    with open_database(db_path, cache_dir=template_cache) as con:
        replace_rows(con, MODELS, _models(("a", "x", "gemm", 1)), where="false")
        bad = pa.table({"model_id": ["z"], "cluster": ["x"], "family": ["gemm"], "n_train": ["many"]})
        with pytest.raises(duckdb.Error):
            replace_rows(con, MODELS, bad, where="cluster = ?", params=["x"])
        assert _stored(con) == [("a", "x", "gemm", 1)]
        replace_rows(con, MODELS, _models(("f", "x", "gemm", 6)), where="cluster = ?", params=["x"])  # usable after
        assert _stored(con) == [("f", "x", "gemm", 6)]
