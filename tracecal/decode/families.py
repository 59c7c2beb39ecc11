"""Op families: which kind of work a traced operator or a sample is (docs/decode.md#families).

One rule, ordered regexes over the CPU operator name and the GPU kernel name, classifies traced
operators (the decoder) and microbenchmark samples (samplers, calibration) alike. Pure functions,
no I/O.

- ``family_of(cpu_op_name, kernel_name=None, kind=None) -> str`` for one operator;
- ``family_expr(cpu_op_name, kernel_name, kind) -> pl.Expr`` and ``with_family(frame)``: the same rule
  over a frame; ``families_of(triples)`` for a list of (op, kernel, kind) (the one implementation);
- ``cpu_op_family`` and ``kernel_families``: each half of the rule alone (the consistency check).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import polars as pl

FAMILIES = (
    "gemm",
    "attention",
    "softmax",
    "norm",
    "elementwise",
    "embedding",
    "loss",
    "optimizer",
    "memcpy",
    "memset",
    "comm",
    "other",
)
"""Every family an operator can have (docs/decode.md#families)."""

# Ordered rules: the first family whose CPU-op pattern matches wins; if no CPU-op pattern matches,
# the first family whose kernel pattern matches wins. Order matters: attention before softmax
# (flash kernels contain "softmax"), loss before softmax (log_softmax inside cross entropy is
# classified by its own CPU op), comm first (record_param_comms wraps other ops).
_RULES: tuple[tuple[str, str, str], ...] = (
    (
        "comm",
        r"(?i)(^nccl|^rccl|^gloo|^c10d::|record_param_comms|^ProcessGroup|all_reduce|allreduce|all_gather"
        r"|allgather|reduce_scatter|all_to_all|alltoall)",
        r"(?i)(^nccl|^rccl|ncclDevKernel|ncclKernel)",
    ),
    (
        "attention",
        r"(?i)(scaled_dot_product|flash_attn|flash_attention|_efficient_attention|FlashAttn|fmha"
        r"|_cudnn_attention|attention)",
        r"(?i)(flash_fwd|flash_bwd|flash::|fmha|attention|attn_fwd|attn_bwd)",
    ),
    (
        "gemm",
        r"(?i)^(aten::(mm|addmm|_addmm_activation|bmm|baddbmm|linear|matmul|mv|addmv|addbmm|einsum"
        r"|_scaled_mm|_int_mm)|MmBackward|AddmmBackward|BmmBackward|BaddbmmBackward)",
        r"(?i)(gemm|gemv|cutlass|cublas|Cijk_|wgmma|sm\d+_xmma|nvjet|hipblaslt|rocblas)",
    ),
    (
        "loss",
        r"(?i)(cross_entropy|nll_loss|mse_loss|binary_cross_entropy|l1_loss|smooth_l1|kl_div|CrossEntropy)",
        r"(?i)(nll_loss|cross_entropy)",
    ),
    (
        "softmax",
        r"(?i)(softmax)",
        r"(?i)(softmax)",
    ),
    (
        "norm",
        r"(?i)(layer_norm|rms_norm|group_norm|batch_norm|instance_norm|LayerNorm|RMSNorm|FusedLayerNorm|norm_)",
        r"(?i)(layer_norm|layernorm|rms_norm|rmsnorm|batch_norm|batchnorm|bn_fw|bn_bw|group_norm|welford)",
    ),
    (
        "embedding",
        r"(?i)(embedding)",
        r"(?i)(embedding|EmbeddingBag|embedding_bag)",
    ),
    (
        "optimizer",
        r"(?i)(_fused_adam|_fused_adamw|_fused_sgd|_foreach_|^Optimizer\.step|adam|adagrad|clip_grad"
        r"|multi_tensor)",
        r"(?i)(multi_tensor_apply|adam|fused_sgd|adagrad)",
    ),
    (
        "elementwise",
        r"(?i)^(aten::(add|sub|mul|div|neg|abs|exp|log|sqrt|rsqrt|pow|sigmoid|tanh|relu|gelu|silu|threshold"
        r"|hardtanh|leaky_relu|dropout|native_dropout|copy_|_to_copy|to|clone|contiguous|fill_|zero_|zeros"
        r"|ones|full|where|masked_fill|cat|stack|clamp|clamp_min|clamp_max|addcmul|addcdiv|lerp|sum|mean"
        r"|max|min|amax|argmax|cumsum|sort|index|index_select|index_add|gather|scatter|scatter_add|repeat"
        r"|expand|flip|roll|tril|triu|bitwise|eq|ne|lt|le|gt|ge|logical|sign|reciprocal|square|erf|sin|cos"
        r"|floor|ceil|round|fmod|remainder|maximum|minimum|norm|linalg_vector_norm|_foreach|glu|swiglu"
        r"|rotary|_unsafe_view|view|reshape|permute|transpose|t|narrow|slice|select|split|chunk|squeeze"
        r"|unsqueeze|flatten|constant_pad_nd|pad|empty|empty_like|zeros_like|ones_like|arange|randperm"
        r"|rand|randn|bernoulli_|uniform_|normal_|nonzero|unique|bincount|histc)\w*"
        r"|[A-Za-z]+Backward\d*$)",
        r"(?i)(elementwise|vectorized|unrolled|reduce_kernel|CatArrayBatchedCopy|FillFunctor|fill_kernel"
        r"|copy_kernel|index_elementwise|indexSelect|scatter_gather|gatherTopK|radixSort|DeviceScan"
        r"|DeviceRadix|DeviceReduce|DeviceSelect|DeviceCompact|DeviceSegmented|triu_tril|bitonic|sort"
        r"|dropout|gelu|silu|relu|tanh|sigmoid|add_kernel|mul_kernel|rotary|RoPE|bias|transpose|permute"
        r"|fused_dropout|upsample|pooling|pool|im2col|col2im|compute_|kernelPointwise|pointwise|triton_poi"
        r"|triton_red|triton_per)",
    ),
)
_COMPILED = tuple((fam, re.compile(cpu), re.compile(ker)) for fam, cpu, ker in _RULES)


def family_of(cpu_op_name: str | None, kernel_name: str | None = None, kind: str | None = None) -> str:
    """The op family (docs/decode.md#families) of one operator.

    Args:
        cpu_op_name: the innermost CPU operator (``aten::mm``), or a sample's op; None if unlinked.
        kernel_name: the GPU kernel name, or None (CPU-only traces, samples).
        kind: the activity kind (``kernel``, ``memcpy``, ``memset``, ``cpu_op``); memcpy and memset
            activities are their own families whatever launched them.

    Returns:
        One of ``FAMILIES``; ``other`` when nothing matches (never a guess).
    """
    return families_of([(cpu_op_name, kernel_name, kind)])[0]


def family_expr(
    cpu_op_name: pl.Expr | str = "cpu_op_name", kernel_name: pl.Expr | str = "name", kind: pl.Expr | str = "kind"
) -> pl.Expr:
    """``family_of`` as a polars expression over columns (names or expressions); returns a Utf8 expr
    named ``family``, computed once per distinct triple like ``with_family``."""
    cpu = pl.col(cpu_op_name) if isinstance(cpu_op_name, str) else cpu_op_name
    ker = pl.col(kernel_name) if isinstance(kernel_name, str) else kernel_name
    knd = pl.col(kind) if isinstance(kind, str) else kind
    triples = pl.struct(cpu.alias("cpu_op_name"), ker.alias("name"), knd.alias("kind"))
    return triples.map_batches(_family_series, return_dtype=pl.Utf8).alias("family")


def _family_series(triples: pl.Series) -> pl.Series:
    """``with_family``'s answer for a struct series of (cpu_op_name, name, kind)."""
    return with_family(triples.struct.unnest()).get_column("family")


def with_family(
    frame: pl.DataFrame, cpu_op_name: str = "cpu_op_name", kernel_name: str = "name", kind: str = "kind"
) -> pl.DataFrame:
    """``frame`` plus ``family`` (``family_of`` of the three columns), keeping the row order.

    The rule runs a few dozen regexes; operators repeat a few dozen to a few hundred (op, kernel,
    kind) triples, so it runs once per distinct triple (``families_of``) and is joined back.
    """
    keys = [cpu_op_name, kernel_name, kind]
    table = frame.select(keys).unique()
    families = families_of(list(table.iter_rows()))
    table = table.with_columns(pl.Series("family", families, dtype=pl.Utf8))
    return frame.join(table, on=keys, how="left", nulls_equal=True, maintain_order="left")


@lru_cache(maxsize=65536)
def _cpu_family(cpu_op_name: str) -> str | None:
    """The first family whose CPU-op pattern matches (``family_of``'s CPU step), else None."""
    return next((fam for fam, cpu, _ in _COMPILED if cpu.search(cpu_op_name)), None)


_KERNEL_FAMILIES: dict[str, tuple[bool, str | None]] = {}
"""Kernel name -> (an NCCL/RCCL kernel, first family whose kernel pattern matches): ``family_of``'s
kernel steps, kept for the process (kernel names repeat across traces of a workload)."""
POLARS_KERNEL_CHARS = 8192
"""From this many characters of new kernel names on, their patterns run in polars: Python's regex
engine's cost grows with the names, while polars pays a fixed cost to compile the 11 patterns once
per process, so short name sets (a CPU-only rank's "kernel" names are its short operator names) stay
in Python."""


def _kernel_families(kernel_names: Sequence[str]) -> None:
    """Fill ``_KERNEL_FAMILIES`` for the names not in it yet."""
    new = [k for k in dict.fromkeys(kernel_names) if k not in _KERNEL_FAMILIES]
    if not new:
        return
    if sum(map(len, new)) >= POLARS_KERNEL_CHARS:
        rules = [("comm", _RULES[0][2]), *[(fam, ker) for fam, _, ker in _RULES]]
        hits = pl.DataFrame({"k": new}).select(
            pl.col("k").str.contains(ker).alias(str(i)) for i, (_, ker) in enumerate(rules)
        )
        columns = [hits.get_column(str(i)).to_list() for i in range(len(rules))]
        for row, name in enumerate(new):
            first = next((rules[i][0] for i in range(1, len(rules)) if columns[i][row]), None)
            _KERNEL_FAMILIES[name] = (bool(columns[0][row]), first)
    else:
        for name in new:
            first = next((fam for fam, _, ker in _COMPILED if ker.search(name)), None)
            _KERNEL_FAMILIES[name] = (bool(_COMPILED[0][2].search(name)), first)


def cpu_op_family(cpu_op_name: str | None) -> str | None:
    """The family ``family_of``'s CPU-op rule alone gives ``cpu_op_name``; None when no CPU-op
    pattern matches (or no name), so a caller can tell "unknown" from a family."""
    return _cpu_family(cpu_op_name) if cpu_op_name else None


def kernel_families(kernel_names: Sequence[str | None]) -> list[str | None]:
    """The family ``family_of``'s kernel-name rule alone gives each name (``comm`` for NCCL/RCCL
    kernels); None where no kernel pattern matches or the name is null."""
    _kernel_families([k for k in kernel_names if k])
    return [_KERNEL_FAMILIES[k][1] if k else None for k in kernel_names]


def families_of(triples: list[tuple[str | None, str | None, str | None]]) -> list[str]:
    """The family rule, the one implementation behind ``family_of``, ``family_expr`` and ``with_family``,
    for each (cpu_op_name, kernel_name, kind): memcpy and memset activities are their own families; an
    NCCL/RCCL kernel is communication whatever op launched it; then the first CPU-op pattern that
    matches (Python's regexes: short names, cached), then the first kernel pattern
    (``_kernel_families``), else ``other``."""
    _kernel_families([k for _, k, _ in triples if k])
    out = []
    for cpu, kernel, kind in triples:
        if kind in ("memcpy", "memset"):
            out.append(kind)
            continue
        comm, kernel_family = _KERNEL_FAMILIES[kernel] if kernel else (False, None)
        if comm:
            out.append("comm")
            continue
        out.append((_cpu_family(cpu) if cpu else None) or kernel_family or "other")
    return out
