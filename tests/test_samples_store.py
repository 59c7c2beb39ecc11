"""The sample store: upsert by sample_id, reads, resumable ids, Parquet round trip, summaries."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracecal.errors import InputNotFoundError, SampleError
from tracecal.schema import SAMPLES
from tracecal.sql.connection import open_database
from tracecal.sql.samples import (
    existing_sample_ids,
    export_parquet,
    flag_counts,
    import_parquet,
    read_samples,
    sample_id,
    samples_overview,
    write_samples,
    write_samples_parquet,
)


def _rows(cluster: str, ms: list[int], *, family: str = "gemm", direction: str = "fwd", dur: float = 1000.0):
    rows = []
    for m in ms:
        features = {"m": m, "n": 64, "k": 32}
        rows.append(
            {
                "sample_id": sample_id(cluster, "sampler", "aten::mm", direction, features),
                "cluster": cluster,
                "device_name": "cpu",
                "family": family,
                "op": "aten::mm",
                "direction": direction,
                **features,
                "flops": 2.0 * m * 64 * 32,
                "median_ns": dur * m,
                "repeats": 5,
                "source": "sampler",
                "sampled_at": datetime(2026, 1, 1),
            }
        )
    return pa.Table.from_pylist(rows)


def test_sample_id_is_stable_and_order_independent() -> None:
    a = sample_id("c", "s", "op", "fwd", {"m": 4096.0, "n": 3})
    assert a == sample_id("c", "s", "op", "fwd", {"n": 3, "m": 4096})
    assert a != sample_id("c", "s", "op", "bwd", {"m": 4096, "n": 3})
    assert a != sample_id("c", "s", "op", "fwd", {"m": 4097, "n": 3})
    assert len(a) == 24


def test_write_fills_missing_columns_with_null_and_upserts(db_path: Path, template_cache: Path) -> None:
    with open_database(db_path, cache_dir=template_cache) as con:
        assert write_samples(con, _rows("local", [1, 2, 3])) == 3
        # the same ids again with new durations replace, a new id is added
        assert write_samples(con, _rows("local", [3, 4], dur=2000.0)) == 2
        frame = read_samples(con, "local")
    assert frame.height == 4
    assert frame.columns == SAMPLES.column_names
    by_m = dict(zip(frame["m"].to_list(), frame["median_ns"].to_list(), strict=True))
    assert by_m == {1: 1000.0, 2: 2000.0, 3: 6000.0, 4: 8000.0}
    assert frame["iqr_ns"].null_count() == 4  # absent, so NULL, never 0


def test_bad_batch_writes_nothing(db_path: Path, template_cache: Path) -> None:
    good = _rows("local", [1, 2])
    with open_database(db_path, cache_dir=template_cache) as con:
        write_samples(con, good)
        bad = pa.concat_tables([_rows("local", [5]), _rows("local", [5])])  # duplicate id
        with pytest.raises(SampleError, match="duplicate sample_id"):
            write_samples(con, bad)
        with pytest.raises(SampleError, match="not in the samples table"):
            write_samples(con, _rows("local", [6]).append_column("bogus", pa.array([1])))
        seven = _rows("local", [7])
        no_family = seven.set_column(seven.schema.get_field_index("family"), "family", pa.array([None], pa.string()))
        with pytest.raises(SampleError, match="no family"):
            write_samples(con, no_family)
        assert existing_sample_ids(con, "local") == set(good.column("sample_id").to_pylist())


def test_read_filters_and_unknown_cluster(db_path: Path, template_cache: Path) -> None:
    flagged = _rows("a", [10], direction="bwd").append_column("quality_flag", pa.array(["off_trend: test"]))
    with open_database(db_path, cache_dir=template_cache) as con:
        write_samples(con, pa.concat_tables([_rows("a", [1, 2]), _rows("b", [1])]))
        write_samples(con, flagged)
        assert read_samples(con, "a").height == 3
        assert read_samples(con, "a", include_flagged=False).height == 2
        assert read_samples(con, "a", direction="bwd")["m"].to_list() == [10]
        assert read_samples(con, "a", family="norm").is_empty()
        with pytest.raises(SampleError, match=r"no samples for cluster 'zzz' \(clusters with samples: a, b\)"):
            read_samples(con, "zzz")
        overview = samples_overview(con, "a").to_pylist()
        assert [(r["direction"], r["samples"], r["flagged"]) for r in overview] == [("bwd", 1, 1), ("fwd", 2, 0)]
        assert flag_counts(con).to_pylist() == [
            {"cluster": "a", "reason": "off_trend", "family": "gemm", "op": "aten::mm", "samples": 1}
        ]


def test_parquet_round_trip_between_databases(tmp_path: Path, template_cache: Path) -> None:
    out = tmp_path / "moved" / "local.parquet"
    with open_database(tmp_path / "one.duckdb", cache_dir=template_cache) as con:
        write_samples(con, pa.concat_tables([_rows("local", [1, 2, 3]), _rows("other", [9])]))
        assert export_parquet(con, out, cluster="local") == 3
        with pytest.raises(SampleError, match="no samples of cluster 'nope'"):
            export_parquet(con, tmp_path / "x.parquet", cluster="nope")
        original = read_samples(con, "local")
    assert not (tmp_path / "x.parquet").exists()
    assert pq.read_schema(out).metadata[b"tracecal.table"] == b"samples"
    with open_database(tmp_path / "two.duckdb", cache_dir=template_cache) as con:
        assert import_parquet(con, out) == 3
        assert import_parquet(con, out.parent, cluster="local") == 3  # idempotent: upsert
        moved = read_samples(con, "local")
        with pytest.raises(SampleError, match=r"holds no samples of cluster 'x' \(it holds: local\)"):
            import_parquet(con, out, cluster="x")
    assert moved.equals(original)


def test_every_sample_file_carries_table_schema_and_tracecal_version(tmp_path: Path, template_cache: Path) -> None:
    """An export and a sampler's hand-over file are written by one writer: the same metadata, and a
    batch that does not conform leaves no file (not even a partial one)."""
    from tracecal import __version__
    from tracecal.schema import SAMPLES_FILE_VERSION

    rows = _rows("local", [1, 2])
    handed_over, exported = tmp_path / "sampler.parquet", tmp_path / "export.parquet"
    assert write_samples_parquet(rows, handed_over) == 2
    with open_database(tmp_path / "x.duckdb", cache_dir=template_cache) as con:
        write_samples(con, rows)
        assert export_parquet(con, exported) == 2
    for path in (handed_over, exported):
        meta = pq.read_schema(path).metadata
        assert (meta[b"tracecal.table"], meta[b"tracecal.schema_version"], meta[b"tracecal.version"]) == (
            b"samples",
            str(SAMPLES_FILE_VERSION).encode(),
            __version__.encode(),
        )
    bad = tmp_path / "bad.parquet"
    with pytest.raises(SampleError, match=f"{bad}: 2 rows have no cluster"):
        write_samples_parquet(rows.drop_columns(["cluster"]), bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.parquet", "sampler.parquet", "x.duckdb"]


def test_import_parquet_bad_input(tmp_path: Path, db_path: Path, template_cache: Path) -> None:
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"x": [1]}), foreign)
    with open_database(db_path, cache_dir=template_cache) as con:
        with pytest.raises(InputNotFoundError, match="does not exist"):
            import_parquet(con, tmp_path / "missing.parquet")
        empty_dir = tmp_path / "empty"
        empty_dir.mkdir()
        with pytest.raises(InputNotFoundError, match=r"no \*\.parquet files in"):
            import_parquet(con, empty_dir)
        with pytest.raises(SampleError, match=r"junk\.parquet is not a readable Parquet file"):
            import_parquet(con, junk)
        with pytest.raises(SampleError, match=r"foreign\.parquet: columns x are not in the samples table"):
            import_parquet(con, foreign)
        assert con.execute("select count(*) from samples").fetchall() == [(0,)]


_POINTS = st.lists(
    st.tuples(
        st.integers(1, 1 << 40),
        st.one_of(st.none(), st.floats(0.5, 1e12, allow_nan=False)),
        st.one_of(st.none(), st.sampled_from(["float16", "bfloat16"])),
    ),
    min_size=1,
    max_size=20,
    unique_by=lambda t: t[0],
)


def test_round_trip_through_duckdb_keeps_values_and_nulls(db_path: Path, template_cache: Path) -> None:
    examples = iter(range(1_000_000))
    with open_database(db_path, cache_dir=template_cache) as con:  # one database; every example writes its own cluster

        @settings(max_examples=30, deadline=None)
        @given(_POINTS)
        def check(points: list[tuple[int, float | None, str | None]]) -> None:
            cluster = f"c{next(examples)}"
            rows = [
                {
                    "sample_id": sample_id(cluster, "sampler", "op", "fwd", {"m": m}),
                    "cluster": cluster,
                    "family": "gemm",
                    "op": "op",
                    "direction": "fwd",
                    "source": "sampler",
                    "m": m,
                    "median_ns": dur,
                    "dtype": dtype,
                }
                for m, dur, dtype in points
            ]
            write_samples(con, pa.Table.from_pylist(rows))
            back = read_samples(con, cluster).sort("m")
            expected = pl.DataFrame(rows).sort("m")
            assert back["m"].to_list() == expected["m"].to_list()
            assert back["median_ns"].to_list() == expected["median_ns"].to_list()
            assert back["dtype"].to_list() == expected["dtype"].to_list()

        check()


def test_listing_a_database_older_than_the_views_works_read_only(db_path: Path, template_cache: Path) -> None:
    with open_database(db_path, cache_dir=template_cache) as con:
        con.execute("DROP VIEW samples_overview")  # as written by a tracecal without the view
    with open_database(db_path, read_only=True) as con:
        assert samples_overview(con).num_rows == 0
