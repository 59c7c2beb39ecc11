"""``misaligned_ops``: rows whose CPU operator and kernel cannot belong together.

Hand-built rows check each rule; the published Perlmutter encoder tables check it on real data: the
tables whose ops and kernels agree (GPT-20B 4_4_8 and 8_4_4, every rank) flag nothing, the ones the
published decoder misaligned by position flag rows.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from conftest import GPUMODELING25

from tracecal.decode.consistency import misaligned_ops

RUNS = GPUMODELING25 / "runs" / "perlmutter"
LN_KERNEL = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::Half, float>(int, float)"
GEMM_KERNEL = "ampere_fp16_s16816gemm_fp16_128x256_ldg8_f2f_stages_64x3_tn"
SUM_KERNEL = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::Half, at::native::func_wrapper<float>>>"


def _rows(*rows: tuple) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={"cpu_op_name": pl.Utf8, "input_dims": pl.Utf8, "input_types": pl.Utf8, "kernel_name": pl.Utf8,
                "dur_ns": pl.Int64},
        orient="row",
    )  # fmt: skip


def test_each_rule_by_hand() -> None:
    frame = _rows(
        # a GEMM op carrying a layer-norm kernel: families disagree
        ("aten::addmm", "[[4608], [8192, 6144], [6144, 4608], [], []]", None, LN_KERNEL, 190_000),
        # the same op with its own GEMM kernel
        ("aten::addmm", "[[4608], [8192, 6144], [6144, 4608], [], []]", None, GEMM_KERNEL, 1_800_000),
        # a sum over 42M fp16 elements in 3 us: 28 TB/s, impossible
        ("aten::sum", "[[2048, 4, 5120], [], [], []]", '["c10::Half", "", "", ""]', SUM_KERNEL, 3_000),
        # the same sum in 100 us: 0.8 TB/s
        ("aten::sum", "[[2048, 4, 5120], [], [], []]", '["c10::Half", "", "", ""]', SUM_KERNEL, 100_000),
        # without Input type one byte per element is assumed: 14 TB/s is still impossible
        ("aten::sum", "[[2048, 4, 5120], [], [], []]", None, SUM_KERNEL, 3_000),
        # nothing to judge: no CPU op, an unclassified kernel, no duration
        (None, None, None, LN_KERNEL, 1_000),
        ("aten::mul", "[[8192], []]", None, "kernel_0", 1_000),
        ("aten::sum", "[[2048, 4, 5120], [], [], []]", None, SUM_KERNEL, None),
    )
    assert misaligned_ops(frame).to_list() == [True, False, True, False, True, False, False, False]
    assert misaligned_ops(frame, max_bandwidth=1e20).to_list()[2] is False  # the ceiling is the threshold


def test_missing_column_raises() -> None:
    with pytest.raises(ValueError, match="kernel_name"):
        misaligned_ops(pl.DataFrame({"cpu_op_name": ["aten::mm"], "input_dims": ["[]"], "input_types": [None],
                                     "dur_ns": [1]}))  # fmt: skip


def _table(path: Path) -> pl.DataFrame:
    raw = pl.read_csv(path, infer_schema_length=0, null_values=["None", "null", ""])
    return raw.select(
        pl.col("cpu_op_1").alias("cpu_op_name"),
        pl.col("cpu_op_1_input_dim").alias("input_dims"),
        pl.lit(None, pl.Utf8).alias("input_types"),
        pl.col("kernel").alias("kernel_name"),
        (pl.col("kernel_dur(us)").cast(pl.Float64) * 1000).alias("dur_ns"),
    )


def test_published_tables() -> None:
    tables = sorted(RUNS.glob("*/*/[0-9]/encoder_*.csv"))
    assert len(tables) == 30
    flagged = {f"{p.parents[2].name}/{p.parent.name}/{p.stem}": int(misaligned_ops(_table(p)).sum()) for p in tables}
    aligned = {k: v for k, v in flagged.items() if k.startswith(("GPT_20B_4_4_8", "GPT_20B_8_4_4"))}
    assert len(aligned) == 12 and set(aligned.values()) == {0}
    # positionally misaligned: an addmm with a layer-norm kernel, sums with 3 us kernels, ...
    assert flagged["GPT_20B_4_8_4_32_4/0/encoder_fwd"] > 0 and flagged["GPT_20B_4_8_4_32_4/0/encoder_bwd"] > 0
    assert sum(v > 0 for k, v in flagged.items() if k.startswith("llama")) >= 4
    assert flagged["GPT_20B_4_8_4_32_4/1/encoder_fwd"] == 0 and flagged["GPT_20B_4_8_4_32_4/1/encoder_bwd"] == 0
