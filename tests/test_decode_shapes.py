"""Shape features and op families: the join between traced operators and microbenchmark samples."""

from __future__ import annotations

import orjson
import polars as pl
import pytest

from tracecal.decode import families
from tracecal.decode.families import FAMILIES, family_expr, family_of, with_family
from tracecal.decode.shape_features import family_shape_table, kernel_element_bytes, shape_features, shape_row
from tracecal.schema import SHAPE_COLUMNS


def test_gemm_shapes_and_flops() -> None:
    mm = shape_row("aten::mm", "[[8,512],[512,1024]]", '["float","float"]')
    assert (mm["m"], mm["n"], mm["k"], mm["batch"]) == (8, 1024, 512, 1)
    assert mm["flops"] == 2 * 8 * 1024 * 512
    assert mm["dtype"] == "float32"
    assert mm["io_bytes"] == (8 * 512 + 512 * 1024 + 8 * 1024) * 4
    addmm = shape_row(
        "aten::addmm", "[[1024],[8,512],[512,1024],[],[]]", '["c10::Half","c10::Half","c10::Half","Scalar","Scalar"]'
    )
    assert (addmm["m"], addmm["n"], addmm["k"], addmm["dtype"]) == (8, 1024, 512, "float16")
    bmm = shape_row("aten::baddbmm", "[[32,64,64],[32,64,128],[32,128,64],[],[]]", '["c10::BFloat16"]*3')
    assert bmm["dtype"] is None  # unparseable Input type -> NULL dtype, shapes still derived
    assert (bmm["batch"], bmm["m"], bmm["k"], bmm["n"]) == (32, 64, 128, 64)
    assert bmm["flops"] == 2 * 32 * 64 * 128 * 64
    lin = shape_row(
        "aten::linear", "[[4,128,512],[1024,512],[1024]]", '["c10::BFloat16","c10::BFloat16","c10::BFloat16"]'
    )
    assert (lin["m"], lin["n"], lin["k"]) == (512, 1024, 512)
    mat = shape_row("aten::matmul", "[[2,3,4,5],[2,3,5,6]]", '["float","float"]')
    assert (mat["batch"], mat["m"], mat["k"], mat["n"]) == (6, 4, 5, 6)


def test_attention_causal_from_concrete_inputs() -> None:
    dims = "[[2,16,1024,64],[2,16,1024,64],[2,16,1024,64],[],[],[],[]]"
    types = '["c10::BFloat16","c10::BFloat16","c10::BFloat16","Scalar","Scalar","Scalar",""]'
    causal = shape_row("aten::_scaled_dot_product_flash_attention", dims, types, '["","","","0.0","True","False",""]')
    full = shape_row("aten::_scaled_dot_product_flash_attention", dims, types, '["","","","0.0","False","True",""]')
    assert (causal["batch"], causal["heads"], causal["seq_q"], causal["seq_k"], causal["head_dim"]) == (
        2,
        16,
        1024,
        1024,
        64,
    )
    assert causal["causal"] is True and full["causal"] is False
    assert full["flops"] == 4 * 2 * 16 * 1024 * 1024 * 64
    assert causal["flops"] == full["flops"] / 2
    unknown = shape_row("aten::_scaled_dot_product_flash_attention", dims, types)
    assert unknown["causal"] is None  # no Concrete Inputs: not guessed


def test_other_families_and_missing_is_null() -> None:
    emb = shape_row(
        "aten::embedding", "[[50304,1024],[8,512],[],[],[]]", '["float","long int","Scalar","Scalar","Scalar"]'
    )
    assert (emb["tokens"], emb["vocab"], emb["hidden"]) == (4096, 50304, 1024)
    opt = shape_row("aten::_foreach_add_", "[[[10,10],[5]],[[10,10],[5]]]", '["TensorList","TensorList"]')
    assert opt["params"] == 105
    norm = shape_row("aten::native_layer_norm", "[[8,512,1024],[],[1024],[1024],[]]", '["c10::Half"]')
    assert (norm["elements"], norm["hidden"]) == (8 * 512 * 1024, 1024)
    none = shape_row("aten::mm", None, None)
    assert all(v is None for v in none.values())
    weird = shape_row("aten::mm", "not json", "[]")
    assert all(v is None for v in weird.values())


@pytest.mark.parametrize(
    ("cpu", "kernel", "kind", "family"),
    [
        ("aten::mm", "volta_sgemm_128x32_nt", "kernel", "gemm"),
        (None, "volta_sgemm_128x32_nt", "kernel", "gemm"),
        (
            "aten::mm",
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            "kernel",
            "comm",
        ),
        ("record_param_comms", "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "kernel", "comm"),
        ("aten::copy_", "Memcpy HtoD (Pageable -> Device)", "memcpy", "memcpy"),
        ("aten::zero_", "Memset (Device)", "memset", "memset"),
        ("aten::_softmax", "softmax_warp_forward", "kernel", "softmax"),
        ("aten::_scaled_dot_product_flash_attention", "flash_fwd_kernel", "kernel", "attention"),
        ("aten::native_layer_norm", "vectorized_layer_norm_kernel", "kernel", "norm"),
        ("aten::embedding_dense_backward", "embedding_backward_kernel", "kernel", "embedding"),
        ("aten::nll_loss_forward", "nll_loss_forward_reduce_cuda_kernel_2d", "kernel", "loss"),
        ("aten::_fused_adam_", "multi_tensor_apply_kernel", "kernel", "optimizer"),
        ("aten::gelu", "vectorized_elementwise_kernel", "kernel", "elementwise"),
        ("aten::add_", None, "cpu_op", "elementwise"),
        (None, "my_custom_kernel", "kernel", "other"),
        ("my::custom_op", None, "cpu_op", "other"),
    ],
)
def test_family_scalar_and_expression_agree(cpu: str | None, kernel: str | None, kind: str, family: str) -> None:
    assert family_of(cpu, kernel, kind) == family
    frame = pl.DataFrame(
        {"cpu_op_name": [cpu], "name": [kernel], "kind": [kind]},
        schema={"cpu_op_name": pl.Utf8, "name": pl.Utf8, "kind": pl.Utf8},
    )
    assert frame.select(family_expr()).item() == family
    assert family in FAMILIES


def test_shape_features_frame_matches_scalar() -> None:
    frame = pl.DataFrame(
        {
            "cpu_op_name": ["aten::mm", "aten::mm", "aten::gelu", None],
            "input_dims": ["[[8,512],[512,1024]]", "[[8,512],[512,1024]]", "[[4,4]]", None],
            "input_types": ['["float","float"]', '["float","float"]', '["c10::Half"]', None],
            "x": [1, 2, 3, 4],
        }
    )
    out = shape_features(frame)
    assert out.height == 4 and out["x"].to_list() == [1, 2, 3, 4]
    assert set(c.name for c in SHAPE_COLUMNS) <= set(out.columns)
    assert out["flops"].to_list()[:2] == [2 * 8 * 1024 * 512] * 2
    assert out["elements"].to_list()[2] == 16 and out["dtype"].to_list()[2] == "float16"
    assert out.row(3, named=True)["m"] is None


def test_cpu_flash_attention_reads_causality_from_its_own_signature() -> None:
    # Input Dims / Concrete Inputs as torch 2.13 records SDPA(is_causal=True) on the CPU
    dims = "[[2,4,16,8],[2,4,16,8],[2,4,16,8],[],[],[],[]]"
    fwd = shape_row("aten::_scaled_dot_product_flash_attention_for_cpu", dims, None, '["","","","0.","True","",""]')
    assert (fwd["batch"], fwd["heads"], fwd["seq_q"], fwd["head_dim"], fwd["causal"]) == (2, 4, 16, 8, True)
    bwd = shape_row(
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        "[[2,4,16,8],[2,4,16,8],[2,4,16,8],[2,4,16,8],[2,4,16,8],[2,4,16],[],[],[],[]]",
        None,
        '["","","","","","","0.","True","",""]',
    )
    assert (bwd["heads"], bwd["seq_q"], bwd["causal"]) == (4, 16, True)


def test_aten_flash_attention_forward_uses_the_batch_seq_heads_layout() -> None:
    row = shape_row(
        "aten::_flash_attention_forward",
        "[[3,141,12,64],[3,141,12,64],[3,141,12,64],[],[],[],[],[],[],[]]",
        None,
        '["","","","","","141","141","0.","False","False"]',
    )
    assert (row["batch"], row["seq_q"], row["heads"], row["head_dim"], row["causal"]) == (3, 141, 12, 64, False)


def test_softmax_and_norm_record_rows_and_the_reduced_width() -> None:
    # [b, heads, l, l] scores: rows b*heads*l, each a softmax over l (dim -1 from Concrete Inputs)
    sm = shape_row("aten::_softmax", "[[2,16,1024,1024],[],[]]", '["c10::Half","Scalar","Scalar"]', '["","-1","False"]')
    assert (sm["elements"], sm["tokens"], sm["hidden"]) == (2 * 16 * 1024 * 1024, 2 * 16 * 1024, 1024)
    # softmax over dim 2 of [2, 3, 5, 7]: 5 long rows, 2*3*7 of them
    other = shape_row("aten::_softmax", "[[2,3,5,7],[],[]]", '["float","Scalar","Scalar"]', '["","2","False"]')
    assert (other["tokens"], other["hidden"]) == (42, 5)
    # no Concrete Inputs: the last dimension, the softmax rule
    assert shape_row("aten::_softmax", "[[6,10]]", '["float"]')["hidden"] == 10
    # backward: dim is argument 2 of _softmax_backward_data(grad, output, dim, dtype)
    bwd = shape_row(
        "aten::_softmax_backward_data",
        "[[4,8],[4,8],[],[]]",
        '["float","float","Scalar","Scalar"]',
        '["","","0","6"]',
    )
    assert (bwd["tokens"], bwd["hidden"]) == (8, 4)
    norm = shape_row("aten::native_layer_norm", "[[8,512,1024],[],[1024],[1024],[]]", '["c10::Half"]')
    assert (norm["tokens"], norm["hidden"]) == (8 * 512, 1024)


def test_optimizer_counts_tensors_and_width_from_the_tensor_list() -> None:
    # _fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, ...) as
    # Kineto records it: one TensorList per argument
    params = [[3072, 1024], [3072], [1024, 1024], [1024], [1024], [1024]]
    dims = orjson.dumps([params, params, params, params, [], [[]] * 6, [], []]).decode()
    types = '["TensorList","TensorList","TensorList","TensorList","TensorList","TensorList","Scalar","Scalar"]'
    opt = shape_row("aten::_fused_adamw_", dims, types)
    assert opt["params"] == 3072 * 1024 + 3072 + 1024 * 1024 + 3 * 1024
    assert opt["batch"] == 6  # tensors updated: the first list's length
    assert opt["hidden"] == 1024  # three 1-D tensors of 1024 against one of 3072
    assert opt["dtype"] is None  # a TensorList has no element type in the trace
    flat = shape_row("aten::_foreach_mul_", "[[[10,10],[10,10]],[]]", '["TensorList","Scalar"]')
    assert (flat["params"], flat["batch"], flat["hidden"]) == (200, 2, None)  # no 1-D tensor: NULL width
    # 1-D buffers only (how the sampler times a flat parameter list): no weight matrix, no width
    buffers = shape_row("aten::_fused_adam_", [[[5], [5], [3]]], ["TensorList"])
    assert (buffers["params"], buffers["batch"], buffers["hidden"]) == (13, 3, None)


FAMILY_TRIPLES = [
    ("aten::mm", "volta_sgemm_128x32_nt", "kernel", "gemm"),
    (None, "volta_sgemm_128x32_nt", "kernel", "gemm"),
    ("aten::mm", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "kernel", "comm"),
    ("record_param_comms", "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "kernel", "comm"),
    ("aten::copy_", "Memcpy HtoD (Pageable -> Device)", "memcpy", "memcpy"),
    ("aten::_softmax", "softmax_warp_forward", "kernel", "softmax"),
    ("aten::_scaled_dot_product_flash_attention", "flash_fwd_kernel", "kernel", "attention"),
    ("my::op", "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "kernel",
     "elementwise"),
    ("my::op", "Cijk_Ailk_Bljk_SB_MT64x64x16", "kernel", "gemm"),
    (None, "my_custom_kernel", "kernel", "other"),
    ("", "", "kernel", "other"),
    ("aten::add_", None, "cpu_op", "elementwise"),
    (None, None, None, "other"),
]  # fmt: skip
"""(CPU operator, kernel, kind, family): the CPU operator decides unless the kernel is NCCL's or the
activity a copy; an unknown CPU operator leaves it to the kernel."""


@pytest.mark.parametrize("polars_from", [0, 10**9])
def test_every_family_entry_point_gives_the_rule_on_both_kernel_paths(
    polars_from: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernel names are matched in polars from POLARS_KERNEL_CHARS characters of new names on, else by Python's
    regexes: ``with_family``, ``family_expr`` and ``family_of`` all give the rule's answer. Names seen before
    are remembered for the process, so each run marks its kernel names with a tag no pattern matches, to make
    them new."""
    monkeypatch.setattr(families, "POLARS_KERNEL_CHARS", polars_from)
    tag = f" #{polars_from}"
    triples = [(cpu, f"{kernel}{tag}" if kernel else kernel, kind) for cpu, kernel, kind, _ in FAMILY_TRIPLES]
    expected = [family for *_, family in FAMILY_TRIPLES]
    schema = {"cpu_op_name": pl.Utf8, "name": pl.Utf8, "kind": pl.Utf8}
    frame = pl.DataFrame(triples, schema=schema, orient="row")
    assert with_family(frame)["family"].to_list() == expected
    assert frame.select(family_expr())["family"].to_list() == expected
    assert [family_of(*t) for t in triples] == expected


def test_elementwise_bytes_count_each_tensor_at_its_own_dtype() -> None:
    x, n = [64, 128], 64 * 128
    bf16, fp32 = "c10::BFloat16", "float"
    io = lambda name, dims, types: shape_row(name, dims, types)["io_bytes"]  # noqa: E731
    # copy_ writes its destination without reading it: a cast is neither copy of its two dtypes
    assert io("aten::copy_", [x, x, []], [bf16, fp32, "Scalar"]) == n * (4 + 2)
    assert io("aten::copy_", [x, x, []], [fp32, bf16, "Scalar"]) == n * (2 + 4)
    assert io("aten::copy_", [x, x, []], [bf16, bf16, "Scalar"]) == n * (2 + 2)
    # out of place: the output takes torch's promoted dtype; in place: self's own
    assert io("aten::add", [x, [128], []], [bf16, fp32, "Scalar"]) == n * 2 + 128 * 4 + n * 4
    assert io("aten::add_", [x, x, []], [bf16, fp32, "Scalar"]) == n * 2 + n * 4 + n * 2
    assert io("aten::mul", [x, x], ["c10::Half", bf16]) == n * (2 + 2 + 4)  # half with bf16 gives float32
    assert io("aten::gt", [x, x], [fp32, fp32]) == n * (4 + 4 + 1)  # a comparison writes bool
    # a gather reads its index and the rows it names, with or without an out= tensor
    gather = [[1000, 128], [], [64, 128], []]
    assert io("aten::gather", gather, [fp32, "Scalar", "long int", "Scalar"]) == n * (8 + 2 * 4)
    assert io("aten::gather", [*gather, [64, 128]], [fp32, "Scalar", "long int", "Scalar", fp32]) == n * (8 + 2 * 4)
    # same-dtype ops are as before: every input read, the output written
    assert io("aten::add", [x, x, []], [fp32, fp32, "Scalar"]) == 3 * n * 4


def test_a_tensor_list_takes_the_element_size_its_kernel_names() -> None:
    cat = (
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<at::native::(anonymous "
        "namespace)::OpaqueType<2u>, unsigned int, 3, 128, 1, 16, 16>"
    )
    frame = pl.DataFrame(
        {
            "cpu_op_name": ["aten::cat", "aten::cat"],
            "name": [cat, "some_kernel"],
            "kind": ["kernel", "kernel"],
            "input_dims": ["[[[8,16],[8,16]],[]]"] * 2,
            "input_types": ['["TensorList","Scalar"]'] * 2,
            "cpu_concrete_inputs": ['["","-1"]'] * 2,
        }
    )
    table = family_shape_table(frame).sort("name")
    assert table["io_bytes"].to_list() == [None, 2 * 2 * 8 * 16 * 2]  # read and written, 2 bytes each
    assert table["dtype"].to_list() == [None, None]  # 2 bytes: bf16 or fp16, not guessed
    assert kernel_element_bytes(cat) == 2 and kernel_element_bytes("ampere_sgemm") is None
