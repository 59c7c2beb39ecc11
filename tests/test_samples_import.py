"""`--format gpumodeling25`: every published Perlmutter CSV imports, counts match, features are right."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import GPUMODELING25
from tracecal.decode.shape_features import shape_row
from tracecal.errors import InputNotFoundError, SampleError
from tracecal.schema import SAMPLES
from tracecal.sources.gpumodeling25.samples.importer import (
    import_gpumodeling25,
    load_gpumodeling25,
    published_errors,
    published_sample_id,
)
from tracecal.sources.gpumodeling25.samples.ops import padded_vocab_per_rank, stage_tensors
from tracecal.sql.connection import open_database
from tracecal.sql.samples import read_samples

COMPUTE = GPUMODELING25 / "samples" / "perlmutter_a100_compute"
NCCL = GPUMODELING25 / "samples" / "perlmutter_a100_nccl"
DEVICE = "NVIDIAA100-SXM4-80GB"


def _csv_rows(path: Path) -> tuple[list[str], int]:
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        return header, sum(1 for row in reader if row)


@pytest.fixture(scope="module")
def compute() -> pl.DataFrame:
    return pl.from_arrow(load_gpumodeling25(COMPUTE, "perlmutter"))  # type: ignore[return-value]


@pytest.fixture(scope="module")
def nccl() -> pl.DataFrame:
    return pl.from_arrow(load_gpumodeling25(NCCL, "perlmutter"))  # type: ignore[return-value]


def test_every_compute_csv_imports_with_one_row_per_csv_row_and_direction(compute: pl.DataFrame) -> None:
    files = sorted(p for p in COMPUTE.glob(f"{DEVICE}_*.csv"))
    assert len(files) == 22
    counts = dict(compute.group_by("source_file").len().iter_rows())
    for path in files:
        header, rows = _csv_rows(path)
        directions = sum(c in ("F_dur(us)", "B_dur(us)", "dur(us)", "dur") for c in header)
        assert counts[path.name] == rows * directions, path.name
    assert compute.height == sum(counts.values())
    assert compute.columns == SAMPLES.column_names
    assert compute["sample_id"].n_unique() == compute.height
    assert set(compute["device_name"]) == {DEVICE}
    assert set(compute["source"]) == {"imported:gpumodeling25"}
    assert compute["median_ns"].null_count() == 0
    assert compute["min_ns"].null_count() == compute.height  # unknown, so NULL, never 0


def test_every_nccl_csv_imports_and_pooled_files_are_marked(nccl: pl.DataFrame) -> None:
    files = sorted(NCCL.glob(f"{DEVICE}_*_fp16*.csv"))
    assert len(files) == 24
    counts = dict(nccl.group_by("source_file").len().iter_rows())
    assert counts == {p.name: _csv_rows(p)[1] for p in files}
    pooled = nccl.filter(pl.col("pooled"))
    assert set(pooled["source_file"]) == {
        f"{DEVICE}_allreduce_fp16.csv",
        f"{DEVICE}_allreduce_large_fp16.csv",
        f"{DEVICE}_allgather_large_fp16.csv",
    }
    # a pooled file holds exactly the rows of the per-topology files of its op
    per_topology = nccl.filter(~pl.col("pooled"))
    for op in ("allreduce", "allreduce_large", "allgather_large"):
        assert pooled.filter(pl.col("op") == op).height == per_topology.filter(pl.col("op") == op).height
    assert dict(nccl.group_by("op").agg(pl.col("collective").first()).iter_rows()) == {
        "allreduce": "all_reduce",
        "allreduce_large": "all_reduce",
        "allgather_large": "all_gather",
        "p2p": "send",
    }
    assert (nccl["group_size"] == nccl["nodes"] * nccl["gpus_per_node"]).all()


def _row(frame: pl.DataFrame, file_op: str, direction: str, **params: float) -> dict:
    hits = [
        r
        for r in frame.filter((pl.col("op") == file_op) & (pl.col("direction") == direction)).iter_rows(named=True)
        if all(json.loads(r["params_json"])[k] == v for k, v in params.items())
    ]
    assert hits, (file_op, params)
    return hits[0]


def test_linear1_features_by_hand(compute: pl.DataFrame) -> None:
    # first row of linear1: mp=1, b=2, l=1024, dim=5632, F_dur 1728.8 us
    r = _row(compute, "linear1", "fwd", mp=1, b=2, l=1024, dim=5632)
    assert (r["family"], r["tp"], r["dtype"]) == ("gemm", 1, "float16")
    assert (r["batch"], r["m"], r["k"], r["n"]) == (1, 2 * 1024, 5632, 3 * 5632)
    assert r["flops"] == 2.0 * 2048 * 16896 * 5632 == 389_768_282_112
    assert r["io_bytes"] == 2.0 * (2048 * 5632 + 5632 * 16896 + 2048 * 16896)
    assert r["median_ns"] == pytest.approx(1_728_800.0)
    assert _row(compute, "linear1", "bwd", mp=1, b=2, l=1024, dim=5632)["median_ns"] == pytest.approx(3_552_400.0)


def test_linear_final_pads_the_vocab_per_tp_rank(compute: pl.DataFrame) -> None:
    assert [padded_vocab_per_rank(t) for t in (1, 2, 4, 8, 16)] == [50304, 25216, 12672, 6400, 3200]
    r = _row(compute, "linear_final", "fwd", mp=2, b=2, l=1024, dim=2048)
    assert (r["m"], r["k"], r["n"], r["tp"]) == (2048, 2048, 25216, 2)
    assert r["median_ns"] == pytest.approx(887_800.0)
    emb = _row(compute, "embedding", "fwd", mp=4, b=2, l=1024, dim=2048)
    assert (emb["family"], emb["tokens"], emb["vocab"], emb["hidden"]) == ("embedding", 2048, 12672, 2048)


def test_attention_and_optimizer_features_by_hand(compute: pl.DataFrame) -> None:
    f = _row(compute, "flash_atten", "fwd", mp=1, b=4, h=16, l=1536, dim=3072)
    assert (f["family"], f["batch"], f["heads"], f["seq_q"], f["seq_k"], f["head_dim"], f["causal"]) == (
        "attention",
        4,
        16,
        1536,
        1536,
        192,
        False,
    )
    assert f["flops"] == 4.0 * 4 * 16 * 1536 * 1536 * 192
    b = _row(compute, "baddbmm", "fwd", mp=2, b=4, h=16, l=1024, dim=2048)
    assert (b["batch"], b["m"], b["k"], b["n"]) == (4 * 8, 1024, 128, 1024)
    opt = _row(compute, "middleStage_optimizer", "fwd", mp=1, dim=2048, encoders=4)
    h = 2048  # four encoders of 12h^2 weights + linear biases (3h+h+4h+h) + two LayerNorms (4h)
    assert (opt["family"], opt["params"]) == ("optimizer", 4 * (12 * h * h + 9 * h + 4 * h))
    legacy = _row(compute, "optimizer", "fwd", num_layers=2, hidden_size=256)
    assert legacy["params"] == 27_335_680
    assert (legacy["batch"], legacy["hidden"]) == (28, 256)  # the file's param_tensors and hidden_size


def test_stage_optimizers_carry_tensor_count_and_width(compute: pl.DataFrame) -> None:
    """12 tensors per encoder (2 LayerNorms and 4 biased Linears), +1 embedding on the first stage,
    +LayerNorm and vocab projection on the last; width = h; as a traced _fused_adam_ would give."""
    h, t = 2048, 2
    middle = _row(compute, "middleStage_optimizer", "fwd", mp=t, dim=h, encoders=4)
    first = _row(compute, "firstStage_optimizer", "fwd", mp=1, dim=h, encoders=11)
    last = _row(compute, "lastStage_optimizer", "fwd", mp=1, dim=h, encoders=4)
    assert (middle["batch"], first["batch"], last["batch"]) == (4 * 12, 11 * 12 + 1, 4 * 12 + 3)
    assert middle["hidden"] == first["hidden"] == last["hidden"] == h
    assert middle["params"] == 4 * (12 * h * h // t + 7 * h // t + 6 * h)  # biases 3h/t, h, 4h/t, h
    vocab = padded_vocab_per_rank(1)
    assert first["params"] == 11 * (12 * h * h + 9 * h + 4 * h) + vocab * h
    assert last["params"] == 4 * (12 * h * h + 9 * h + 4 * h) + 2 * h + vocab * h
    # the join: the same stage traced as _fused_adam_(params, grads, exp_avgs, exp_avg_sqs, ...)
    tensors = stage_tensors(t, h, 4, first=False, last=False)
    traced = shape_row("aten::_fused_adam_", json.dumps([tensors] * 4 + [[], []]), json.dumps(["TensorList"] * 6))
    keys = ("params", "batch", "hidden")
    assert {c: traced[c] for c in keys} == {c: middle[c] for c in keys}


def test_softmax_rows_carry_row_count_and_length(compute: pl.DataFrame) -> None:
    """[b·heads/t, l, l]: b·heads/t·l rows of length l, so b·heads/t and l are told apart."""
    r = _row(compute, "ScaledUpperTriangMaskedSoftmax", "fwd", mp=1, b=2, h=2, l=1088)
    assert (r["elements"], r["tokens"], r["hidden"], r["causal"]) == (2 * 2 * 1088 * 1088, 2 * 2 * 1088, 1088, True)
    s = _row(compute, "softmax", "bwd", mp=2, b=4, h=16, l=1024)
    assert (s["tokens"], s["hidden"]) == (4 * 8 * 1024, 1024)


def test_nccl_sizes_by_hand(nccl: pl.DataFrame) -> None:
    ar = _row(nccl, "allreduce", "fwd", shape=20971520, nodes=1, GPUsPerNode=2)
    assert (ar["size_bytes"], ar["group_size"], ar["median_ns"]) == (41_943_040, 2, pytest.approx(679_400.0))
    # all_gather: nccl-tests S is the gathered total, 8 ranks x 134217728 fp16 elements
    ag = nccl.filter(pl.col("source_file") == f"{DEVICE}_allgather_large_fp16_2_4.csv").row(0, named=True)
    assert (ag["size_bytes"], ag["group_size"], ag["nodes"], ag["gpus_per_node"]) == (2_147_483_648, 8, 2, 4)
    assert ag["pooled"] is False
    assert ag["median_ns"] == pytest.approx(432_505_800.0)


def test_published_errors_are_percent() -> None:
    compute = published_errors(COMPUTE)
    row = compute.filter((pl.col("op") == "baddbmm") & (pl.col("direction") == "fwd")).row(0, named=True)
    assert row["published_mape_pct"] == pytest.approx(6.837965451488083)
    assert row["published_model"] == "rforest" and row["topology"] is None
    assert json.loads(row["published_config"])["n_estimators"] == 400
    assert compute.filter(pl.col("op") == "firstStage_optimizer")["direction"].to_list() == ["fwd"]
    nccl = published_errors(NCCL)
    worst = nccl.filter((pl.col("op") == "allgather_large") & (pl.col("topology") == "1x4")).row(0, named=True)
    assert worst["published_mape_pct"] == pytest.approx(76.76704972150518)
    assert nccl.filter(pl.col("topology") == "pooled").height == 3
    assert compute.height == 39 and nccl.height == 24


def _copy(names: list[str], src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(src / name, dst / name)
    return dst


def test_import_writes_and_reimport_replaces(tmp_path: Path, db_path: Path) -> None:
    small = _copy([f"{DEVICE}_layernorm_fp16.csv"], COMPUTE, tmp_path / "s")
    _copy([f"{DEVICE}_allgather_large_fp16_8_1.csv"], NCCL, small)
    with open_database(db_path) as con:
        calls: list[tuple[int, int, str]] = []
        first = import_gpumodeling25(con, small, "perlmutter", progress=lambda *a: calls.append(a))
        again = import_gpumodeling25(con, small, "perlmutter")
        stored = read_samples(con, "perlmutter")
    assert first.files == 2 and first.samples == 351 * 2 + 88
    assert calls == [
        (1, 2, f"{DEVICE}_allgather_large_fp16_8_1.csv"),
        (2, 2, f"{DEVICE}_layernorm_fp16.csv"),
    ]
    assert again.samples == first.samples and stored.height == first.samples


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, db_path: Path) -> None:
    with open_database(db_path) as con:
        with pytest.raises(InputNotFoundError, match="does not exist"):
            import_gpumodeling25(con, tmp_path / "nope", "perlmutter")
        with pytest.raises(InputNotFoundError, match="subdirectories perlmutter_a100_compute"):
            import_gpumodeling25(con, GPUMODELING25 / "samples", "perlmutter")
        bad = _copy([f"{DEVICE}_res_add_fp16.csv"], COMPUTE, tmp_path / "bad")
        (bad / f"{DEVICE}_gelu_fp16.csv").write_text("mp,b,seq,dim,F_dur(us)\n1,2,1024,2048,10\n")
        with pytest.raises(SampleError, match=r"gelu_fp16\.csv: unexpected columns mp, b, seq, dim") as exc:
            import_gpumodeling25(con, bad, "perlmutter")
        assert "\n" not in str(exc.value)
        (bad / f"{DEVICE}_gelu_fp16.csv").write_text("mp,b,l,dim,F_dur(us)\n1,2,1024,2048,ten\n")
        with pytest.raises(SampleError, match="a value is not a number"):
            import_gpumodeling25(con, bad, "perlmutter")
        (bad / f"{DEVICE}_gelu_fp16.csv").write_text("mp,b,l,dim,F_dur(us)\n3,2,1024,2048,10\n")
        with pytest.raises(SampleError, match=r"gelu_fp16\.csv:2: 4h/mp = 8192/3 is not a whole number"):
            import_gpumodeling25(con, bad, "perlmutter")
        (bad / f"{DEVICE}_gelu_fp16.csv").unlink()
        (bad / f"{DEVICE}_conv2d_fp16.csv").write_text("b,c,F_dur(us)\n1,2,3\n")
        with pytest.raises(SampleError, match="'conv2d' is not a known gpumodeling25 op"):
            import_gpumodeling25(con, bad, "perlmutter")
        (bad / f"{DEVICE}_conv2d_fp16.csv").unlink()
        (bad / f"{DEVICE}_p2p_fp16_2_1.csv").write_text("shape,nodes,GPUsPerNode,dur(us)\n100,1,2,5\n")
        with pytest.raises(SampleError, match=r"p2p_fp16_2_1\.csv:2: nodes=1, GPUsPerNode=2 contradict"):
            import_gpumodeling25(con, bad, "perlmutter")
        assert con.execute("SELECT count(*) FROM samples").fetchall() == [(0,)]


def test_ids_name_file_and_row(compute: pl.DataFrame) -> None:
    # calibration recovers the published train/test split from these ids: row 0 is the first CSV row
    name = f"{DEVICE}_linear1_fp16.csv"
    first = compute.filter(pl.col("sample_id") == published_sample_id("perlmutter", "linear1", "bwd", name, 0))
    assert first.height == 1
    assert json.loads(first["params_json"][0]) == {
        "mp": 1,
        "b": 2,
        "l": 1024,
        "dim": 5632,
        "F_dur(us)": 1728.8,
        "B_dur(us)": 3552.4,
    }
