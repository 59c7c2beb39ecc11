"""Quality flags: each rule on small sweeps built in code, and what they find in the Perlmutter data."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from tests.conftest import GPUMODELING25
from tracecal.samplers.quality import busbw_factor, flag_counts, flag_samples, reflag_cluster, trend_residuals
from tracecal.schema import SAMPLES, arrow_schema
from tracecal.sources.gpumodeling25.samples.importer import load_gpumodeling25
from tracecal.sql.connection import open_database
from tracecal.sql.samples import read_samples, sample_id, write_samples


def _frame(rows: list[dict]) -> pl.DataFrame:
    full = []
    for i, r in enumerate(rows):
        row = dict.fromkeys(SAMPLES.column_names)
        row.update(cluster="c", source="sampler", source_file="grid.yml", direction="fwd", dtype="float16")
        row.update(r)
        row["sample_id"] = row["sample_id"] or sample_id("c", "sampler", row["op"], row["direction"], {"i": i})
        full.append(row)
    return pl.from_arrow(pa.Table.from_pylist(full, schema=arrow_schema(SAMPLES)))  # type: ignore[return-value]


def _comm(collective: str, sizes: list[int], durs: list[float], nodes: int, gpn: int) -> list[dict]:
    return [
        {
            "family": "comm",
            "op": collective,
            "collective": collective,
            "size_bytes": s,
            "group_size": nodes * gpn,
            "nodes": nodes,
            "gpus_per_node": gpn,
            "median_ns": d,
        }
        for s, d in zip(sizes, durs, strict=True)
    ]


def _gemm(ms: list[int], durs: list[float], direction: str = "fwd", op: str = "aten::mm") -> list[dict]:
    return [
        {
            "family": "gemm",
            "op": op,
            "direction": direction,
            "m": m,
            "n": 1024,
            "k": 1024,
            "flops": 2.0 * m * 1024 * 1024,
            "median_ns": d,
        }
        for m, d in zip(ms, durs, strict=True)
    ]


def _reasons(frame: pl.DataFrame) -> list[str | None]:
    return [None if f is None else f.split(":")[0] for f in frame["quality_flag"].to_list()]


def test_invalid_durations() -> None:
    flagged = flag_samples(_frame(_gemm([1, 2, 3, 4, 5], [None, float("nan"), 0.0, -5.0, 10.0])))
    assert _reasons(flagged) == ["invalid_duration"] * 4 + [None]
    assert flagged["quality_flag"][0] == "invalid_duration: missing"


def test_busbw_factors_follow_nccl_tests() -> None:
    assert busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert busbw_factor("all_gather", 4) == pytest.approx(0.75)
    assert busbw_factor("send", 2) == 1.0
    assert busbw_factor(None, 2) is None


def test_junk_all_gather_rows_below_the_link_floor() -> None:
    # GH200-like all_gather on 4 nodes: 195 sizes, ~25 GB/s bus bandwidth, 38 failed rows at 117 us
    rng = np.random.default_rng(1)
    sizes = [int(s) for s in np.linspace(268e6, 1.2e9, 195) * 4]  # gathered totals in bytes
    durs = [0.75 * s / 25.0 * rng.uniform(0.95, 1.05) for s in sizes]
    junk = set(rng.choice(195, 38, replace=False).tolist())
    durs = [117_000.0 if i in junk else d for i, d in enumerate(durs)]
    flagged = flag_samples(_frame(_comm("all_gather", sizes, durs, 4, 1)))
    reasons = _reasons(flagged)
    assert {i for i, r in enumerate(reasons) if r} == junk
    assert all(r == "below_floor" for i, r in enumerate(reasons) if i in junk)


def test_tiny_collective_below_one_microsecond() -> None:
    flagged = flag_samples(_frame(_comm("all_reduce", [1024, 1024], [500.0, 8000.0], 1, 2)))
    assert _reasons(flagged) == ["below_floor", None]
    single_rank = flag_samples(_frame(_comm("all_reduce", [1024], [500.0], 1, 1)))
    assert _reasons(single_rank) == [None]


def test_off_trend_finds_slow_outliers_in_a_clean_sweep() -> None:
    rng = np.random.default_rng(2)
    ms = list(range(256, 256 * 101, 256))
    durs = [20_000 + m * 300 * rng.uniform(0.9, 1.1) for m in ms]
    for i in (10, 50, 90):
        durs[i] *= 6
    flagged = flag_samples(_frame(_gemm(ms, durs)))
    reasons = _reasons(flagged)
    assert [i for i, r in enumerate(reasons) if r] == [10, 50, 90]
    assert flagged["quality_flag"][50].startswith("off_trend: ") and "slower" in flagged["quality_flag"][50]


def test_off_trend_finds_optimizer_rows_of_seconds() -> None:
    # GH200-like first-stage optimizer: 585 rows of 10-100 ms, 48 of them 5-54 s
    rng = np.random.default_rng(3)
    params = np.sort(rng.integers(10_000_000, 1_000_000_000, 585))
    durs = params * 0.1 * rng.uniform(0.9, 1.1, 585)
    junk = rng.choice(585, 48, replace=False)
    durs[junk] = rng.uniform(5e9, 54e9, 48)
    rows = [
        {"family": "optimizer", "op": "adam", "params": int(p), "median_ns": float(d)}
        for p, d in zip(params, durs, strict=True)
    ]
    reasons = _reasons(flag_samples(_frame(rows)))
    assert {i for i, r in enumerate(reasons) if r} == set(junk.tolist())


def test_a_sweep_noisy_everywhere_is_left_to_calibration() -> None:
    # like Perlmutter all_gather 1x4: 20x spread of time per byte at equal size, no clear junk
    rng = np.random.default_rng(4)
    sizes = [int(s) for s in np.linspace(1e9, 4e9, 300)]
    durs = [s * 0.005 * math.exp(rng.uniform(0, math.log(20))) for s in sizes]
    flagged = flag_samples(_frame(_comm("all_gather", sizes, durs, 1, 4)))
    assert flagged["quality_flag"].null_count() == 300


def test_short_sweeps_are_not_judged() -> None:
    durs = [1000.0 * m for m in range(1, 16)]
    durs[7] *= 50
    assert flag_samples(_frame(_gemm(list(range(1, 16)), durs)))["quality_flag"].null_count() == 15


def test_duplicates_that_disagree() -> None:
    rows = _gemm([64, 64, 64], [1000.0, 1100.0, 10_000.0]) + _gemm([128, 128], [1000.0, 9000.0])
    rows += _gemm([256, 256], [1000.0, 1500.0])
    assert _reasons(flag_samples(_frame(rows))) == [None, None, "duplicate_disagrees"] + ["duplicate_disagrees"] * 2 + [
        None,
        None,
    ]


def test_backward_faster_than_half_the_forward_only_for_gemm_and_attention() -> None:
    rows = _gemm([64, 128], [1000.0, 1000.0]) + _gemm([64, 128], [300.0, 2100.0], direction="bwd")
    rows += [
        {"family": "loss", "op": "ce", "direction": d, "elements": 100, "median_ns": v}
        for d, v in (("fwd", 1000.0), ("bwd", 300.0))
    ]
    assert _reasons(flag_samples(_frame(rows))) == [None, None, "bwd_faster_than_fwd", None, None, None]


def test_flags_are_idempotent_and_keep_foreign_reasons() -> None:
    frame = _frame(_gemm([1, 2, 3], [None, 10.0, 10.0]))
    frame = frame.with_columns(pl.Series("quality_flag", [None, "sampler_error: OOM", None]))
    once = flag_samples(frame)
    assert once["quality_flag"].to_list() == ["invalid_duration: missing", "sampler_error: OOM", None]
    assert flag_samples(once).equals(once)
    assert flag_counts(once) == {"invalid_duration": 1, "sampler_error": 1}


def test_trend_residuals_are_zero_on_a_power_law() -> None:
    work = np.geomspace(1e3, 1e9, 50)
    assert np.allclose(trend_residuals(work, 5.0 * work**0.8), 0.0, atol=1e-9)


def test_reflag_cluster_judges_parts_together(db_path: Path, template_cache: Path) -> None:
    ms = list(range(1, 41))
    durs = [1000.0 * m for m in ms]
    durs[20] *= 10
    frame = _frame(_gemm(ms, durs))
    with open_database(db_path, cache_dir=template_cache) as con:
        # written in two parts of 20: neither part alone is a judged sweep
        write_samples(con, flag_samples(frame[:20]).to_arrow())
        write_samples(con, flag_samples(frame[20:]).to_arrow())
        assert read_samples(con, "c")["quality_flag"].null_count() == 40
        assert reflag_cluster(con, "c") == {"off_trend": 1}
        flagged = read_samples(con, "c", include_flagged=False)
    assert flagged.height == 39 and 21 not in flagged["m"].to_list()


@pytest.fixture(scope="module")
def perlmutter() -> pl.DataFrame:
    tables = [
        load_gpumodeling25(GPUMODELING25 / "samples" / d, "perlmutter")
        for d in ("perlmutter_a100_compute", "perlmutter_a100_nccl")
    ]
    return flag_samples(pl.from_arrow(pa.concat_tables(tables)))  # type: ignore[arg-type]


@pytest.mark.slow
def test_perlmutter_flags_are_few_and_where_expected(perlmutter: pl.DataFrame) -> None:
    flagged = perlmutter.filter(pl.col("quality_flag").is_not_null())
    # far from "half the data": well under 0.1 % of 127 785 samples
    assert 0 < flagged.height < 0.001 * perlmutter.height
    by_file = dict(flagged.group_by("source_file").len().iter_rows())
    # the slow outliers of all_reduce 1x4 (the per-topology file and the same rows in the pooled file)
    assert (
        by_file["NVIDIAA100-SXM4-80GB_allreduce_large_fp16_1_4.csv"]
        == by_file["NVIDIAA100-SXM4-80GB_allreduce_large_fp16.csv"]
    )
    slow = flagged.filter(pl.col("source_file").str.ends_with("_1_4.csv"))
    assert slow["quality_flag"].str.contains("slower").all()
    assert (slow["median_ns"] / slow["size_bytes"] > 4 * 0.0068).all()  # 4x the sweep's ~0.0068 ns/B


def test_broken_flash_backward_like_gh200() -> None:
    # GH200 flash_atten: backward/forward median 0.107 on 96.8 % of rows (A100: 3.1)
    rng = np.random.default_rng(5)
    seqs = [int(s) for s in rng.integers(512, 8192, 200)]
    fwd = [1e-3 * s * s for s in seqs]
    broken = set(rng.choice(200, 194, replace=False).tolist())
    bwd = [f * (0.107 if i in broken else 3.1) for i, f in enumerate(fwd)]
    rows = [
        {
            "family": "attention",
            "op": "flash",
            "direction": d,
            "seq_q": s,
            "seq_k": s,
            "heads": 8,
            "head_dim": 64,
            "batch": 4,
            "flops": 4.0 * 4 * 8 * s * s * 64,
            "median_ns": v,
            "source_file": f"row{i}",
        }
        for d, durs in (("fwd", fwd), ("bwd", bwd))
        for i, (s, v) in enumerate(zip(seqs, durs, strict=True))
    ]
    reasons = _reasons(flag_samples(_frame(rows)))
    assert {i - 200 for i, r in enumerate(reasons) if r == "bwd_faster_than_fwd"} == broken
    assert all(r is None for r in reasons[:200])
