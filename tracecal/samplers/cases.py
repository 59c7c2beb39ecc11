"""The compute operators the sampler can time: one ``OpSpec`` per (family, op), and how to build it.

What a sample times (the contract calibrate relies on):

- ``direction = "fwd"``: one call of ``op`` on inputs of the point's shape (e.g. ``aten::mm`` on
  ``[m, k] x [k, n]``), exactly the call a trace records as that CPU operator.
- ``direction = "bwd"``: the autograd backward of that call (``torch.autograd.grad`` of its output,
  the kernels of its ``*Backward0`` node), with the *forward* call's shape columns — the convention of
  the published samples (a ``linear1`` sample's ``B_dur`` belongs to the forward shape).

Dimension names per op are in ``OP_SPECS[...].dims`` (required) and ``.defaults`` (optional). Families
follow docs/decode.md#families: gemm, attention, softmax, norm, elementwise, embedding, loss, optimizer.

torch is imported inside the builders only (heavy; the CLI imports this module lazily anyway).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracecal.decode.shape_features import shape_row
from tracecal.errors import SampleError
from tracecal.samplers.grid import GridPoint

DTYPE_NAMES = ("float32", "float16", "bfloat16")
"""dtypes a grid may ask for; stored as these names in ``samples.dtype``."""

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

SDPA_BACKENDS = {
    "aten::_scaled_dot_product_flash_attention": "FLASH_ATTENTION",
    "aten::_scaled_dot_product_efficient_attention": "EFFICIENT_ATTENTION",
    "aten::_scaled_dot_product_cudnn_attention": "CUDNN_ATTENTION",
    "aten::_scaled_dot_product_attention_math": "MATH",
}
"""SDPA backend ops and the ``torch.nn.attention.SDPBackend`` that ``scaled_dot_product_attention``
is pinned to so that it dispatches to exactly that op (on CPU, FLASH_ATTENTION is the CPU flash
kernel ``_scaled_dot_product_flash_attention_for_cpu``; cuDNN and memory-efficient need CUDA)."""

OPTIMIZER_IMPLS = ("fused", "foreach", "forloop")
"""How an optimizer step runs: one fused multi-tensor kernel per state update (``fused=True``),
``_foreach_*`` multi-tensor ops (``foreach=True``), or a Python loop of per-parameter ops."""

OPTION_VALUES: dict[str, tuple[str, ...]] = {
    "impl": OPTIMIZER_IMPLS,
    "other_dtype": DTYPE_NAMES,
    "src_dtype": DTYPE_NAMES,
    "src": ("device", "pinned", "pageable"),
    "reduce": ("last", "all"),
}
"""Dimensions that name a variant instead of a size, with their allowed values (None: the default
variant, left out of the point)."""

TRACE_TYPE = {"float32": "float", "float16": "c10::Half", "bfloat16": "c10::BFloat16"}
"""How the profiler spells each dtype in ``Input type`` (for the trace-like record of a sample)."""


@dataclass
class Built:
    """A point made runnable: ``run()`` is the timed work; ``params`` are facts for ``params_json``
    (e.g. the attention backend actually used)."""

    run: Callable[[], Any]
    params: dict[str, Any] = field(default_factory=dict)


Builder = Callable[[dict[str, Any], Any, Any], tuple[Any, ...]]
"""(dims, torch dtype, torch device) -> (forward callable, tensors its backward differentiates[, facts
for params_json])."""


@dataclass(frozen=True)
class OpSpec:
    """One samplable op: family, op name, dimensions (required, and optional with defaults), whether
    it has a backward, the trace record of its forward call, and its builder."""

    family: str
    op: str
    dims: tuple[str, ...]
    defaults: tuple[tuple[str, Any], ...]
    has_backward: bool
    record: Callable[[dict[str, Any], str], tuple[list[Any], list[str], list[str]]]
    builder: Builder


def _torch() -> Any:
    import torch

    return torch


# --- trace records --------------------------------------------------------------------------------
# What a Kineto trace records for the forward call of a point: (Input Dims, Input type, Concrete Inputs).
# decode.shape_features.shape_row turns these into the shape columns, for samples exactly as for traced operators.

Record = tuple[list[Any], list[str], list[str]]


def _record_gemm(op: str) -> Callable[[dict[str, Any], str], Record]:
    def record(d: dict[str, Any], t: str) -> Record:
        m, n, k, b = d["m"], d["n"], d["k"], d.get("batch")
        if op == "aten::mm":
            return [[m, k], [k, n]], [t, t], ["", ""]
        if op == "aten::addmm":
            return [[n], [m, k], [k, n], [], []], [t, t, t, "Scalar", "Scalar"], ["", "", "", "1", "1"]
        if op == "aten::linear":
            return [[m, k], [n, k], [n]], [t, t, t], ["", "", ""]
        if op == "aten::bmm":
            return [[b, m, k], [b, k, n]], [t, t], ["", ""]
        return [[b, m, n], [b, m, k], [b, k, n], [], []], [t, t, t, "Scalar", "Scalar"], ["", "", "", "1", "1"]

    return record


def _record_attention(d: dict[str, Any], t: str) -> Record:
    b, h, sq, sk, hd = d["batch"], d["heads"], d["seq_q"], d["seq_k"], d["head_dim"]
    # aten::scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    dims = [[b, h, sq, hd], [b, h, sk, hd], [b, h, sk, hd], [], [], [], [], []]
    types = [t, t, t, "", "Scalar", "Scalar", "", "Scalar"]
    concrete = ["", "", "", "", "0.", str(bool(d["causal"])), "", "False"]
    return dims, types, concrete


_SDPA_CAUSAL_ARG = {
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_scaled_dot_product_attention_math": 5,
}
"""Position of ``is_causal`` in each backend op's signature (what a trace records in Concrete Inputs)."""


def _record_sdpa_backend(op: str) -> Callable[[dict[str, Any], str], Record]:
    def record(d: dict[str, Any], t: str) -> Record:
        b, h, sq, sk, hd = d["batch"], d["heads"], d["seq_q"], d["seq_k"], d["head_dim"]
        pos = _SDPA_CAUSAL_ARG[op]
        dims: list[Any] = [[b, h, sq, hd], [b, h, sk, hd], [b, h, sk, hd]] + [[] for _ in range(pos - 2)]
        types = [t, t, t] + ["Scalar"] * (pos - 2)
        concrete = [""] * (pos + 1)
        concrete[pos] = str(bool(d["causal"]))
        return dims, types, concrete

    return record


def _other_type(d: dict[str, Any], key: str, t: str) -> str:
    """The trace spelling of a second operand's dtype (``other_dtype``/``src_dtype``), else ``t``."""
    return TRACE_TYPE[d[key]] if d.get(key) else t


def _lhs(d: dict[str, Any]) -> list[int]:
    """The first operand of a row op: [tokens, hidden], or [broadcast, tokens, hidden] when the
    second operand ([tokens, hidden]) is broadcast over ``broadcast`` copies (a bias row, a
    position embedding added to every sequence of a batch)."""
    rows = [d["tokens"], d["hidden"]]
    return [d["broadcast"], *rows] if d.get("broadcast") else rows


def _record_rows(op: str) -> Callable[[dict[str, Any], str], Record]:
    def record(d: dict[str, Any], t: str) -> Record:
        x = [d["tokens"], d["hidden"]]
        h = d["hidden"]
        if op in ("aten::softmax", "aten::log_softmax"):
            return [x, [], []], [t, "Scalar", ""], ["", "-1", ""]
        if op in ("aten::sum", "aten::mean"):
            reduce = d.get("reduce")
            if reduce == "all":
                return [x, []], [t, ""], ["", ""]
            return [x, [], [], []], [t, "ScalarList", "Scalar", ""], ["", "[1]" if reduce else "[0]", "False", ""]
        if op == "aten::layer_norm":
            return (
                [x, [], [h], [h], [], []],
                [t, "ScalarList", t, t, "Scalar", "Scalar"],
                ["", f"[{h}]", "", "", "1e-05", "True"],
            )
        if op == "aten::rms_norm":
            return [x, [], [h], []], [t, "ScalarList", t, ""], ["", f"[{h}]", "", ""]
        if op == "aten::gelu":
            return [x, []], [t, "String"], ["", "none"]
        if op == "aten::silu":
            return [x], [t], [""]
        other = _other_type(d, "other_dtype", t)
        if op == "aten::add":
            return [_lhs(d), x, []], [t, other, "Scalar"], ["", "", "1"]
        return [_lhs(d), x], [t, other], ["", ""]  # aten::mul

    return record


INPLACE_OPS = ("aten::copy_", "aten::fill_", "aten::zero_", "aten::sqrt", "aten::lerp_", "aten::addcdiv_",
               "aten::addcmul_")  # fmt: skip
"""Single-tensor elementwise calls of a training step that are not activation functions: the
optimizer's per-parameter arithmetic (``torch.optim.AdamW`` without ``foreach``: sqrt, lerp_,
addcdiv_, addcmul_), gradient zeroing and initialisation (fill_, zero_) and layout copies (copy_).
Their costs differ several-fold at the same size (fill_ writes one tensor, addcdiv_ reads three and
writes one, sqrt allocates its output), so each is sampled as itself."""


def _record_inplace(op: str) -> Callable[[dict[str, Any], str], Record]:
    def record(d: dict[str, Any], t: str) -> Record:
        x = [d["tokens"], d["hidden"]]
        if op in ("aten::sqrt", "aten::zero_"):
            return [x], [t], [""]
        if op == "aten::fill_":
            return [x, []], [t, "Scalar"], ["", "0.5"]
        if op == "aten::copy_":
            return [x, x, []], [t, _other_type(d, "src_dtype", t), "Scalar"], ["", "", "False"]
        if op == "aten::lerp_":
            return [x, x, []], [t, t, "Scalar"], ["", "", "0.1"]
        return [x, x, x, []], [t, t, t, "Scalar"], ["", "", "", "0.1"]  # addcdiv_, addcmul_

    return record


def _build_inplace(op: str) -> Builder:
    def build(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Any, ...]:
        torch = _torch()
        shape = (d["tokens"], d["hidden"])
        # plain tensors (no autograd): the optimizer and gradient bookkeeping run outside the graph
        x, a = torch.randn(shape, dtype=dtype, device=device), torch.randn(shape, dtype=dtype, device=device)
        if op == "aten::copy_":
            a = _copy_source(torch, shape, getattr(torch, d.get("src_dtype") or str(dtype).split(".")[-1]), device, d)
        b = torch.rand(shape, dtype=dtype, device=device) + 1  # a positive divisor / radicand
        calls = {
            "aten::copy_": lambda: x.copy_(a),
            "aten::fill_": lambda: x.fill_(0.5),
            "aten::zero_": lambda: x.zero_(),
            "aten::sqrt": lambda: torch.sqrt(b),
            "aten::lerp_": lambda: x.lerp_(a, 0.1),
            "aten::addcdiv_": lambda: x.addcdiv_(a, b, value=0.1),
            "aten::addcmul_": lambda: x.addcmul_(a, b, value=0.1),
        }
        return calls[op], []

    return build


def _record_embedding(d: dict[str, Any], t: str) -> Record:
    dims = [[d["vocab"], d["hidden"]], [d["tokens"]], [], [], []]
    return dims, [t, "long int", "Scalar", "Scalar", "Scalar"], ["", "", "-1", "False", "False"]


def _record_cat(d: dict[str, Any], t: str) -> Record:
    # a TensorList has no element type in a trace: shape_columns takes the point's dtype
    return [[[d["tokens"], d["hidden"]] for _ in range(d["tensors"])], []], ["TensorList", "Scalar"], ["", "-1"]


def _record_gather(d: dict[str, Any], t: str) -> Record:
    index = [d["tokens"], d["hidden"]]
    return [[d["rows"], d["hidden"]], [], index, []], [t, "Scalar", "long int", "Scalar"], ["", "0", "", "False"]


def _record_nll(d: dict[str, Any], t: str) -> Record:
    dims = [[d["tokens"], d["vocab"]], [d["tokens"]], [], [], []]
    return dims, [t, "long int", "", "Scalar", "Scalar"], ["", "", "", "1", "-100"]


def _record_loss(d: dict[str, Any], t: str) -> Record:
    dims = [[d["tokens"], d["vocab"]], [d["tokens"]], [], [], [], []]
    return dims, [t, "long int", "", "Scalar", "Scalar", "Scalar"], ["", "", "", "1", "-100", "0."]


def _record_optimizer(d: dict[str, Any], t: str) -> Record:
    # The parameters as one TensorList, as the foreach/fused optimizer kernels receive them.
    return [[[s] for s in _param_sizes(d)]], ["TensorList"], [""]


def _param_sizes(d: dict[str, Any]) -> list[int]:
    total, tensors = d["params"], d["tensors"]
    if tensors < 1 or total < tensors:
        raise SampleError(f"optimizer: need 1 ≤ tensors ≤ params (got tensors={tensors}, params={total})")
    return [total // tensors + (1 if i < total % tensors else 0) for i in range(tensors)]


# --- builders --------------------------------------------------------------------------------------
# Each allocates the point's tensors and returns (forward callable, tensors to differentiate w.r.t.).


def _rand(torch: Any, shape: list[int], dtype: Any, device: Any) -> Any:
    return torch.randn(*shape, dtype=dtype, device=device, requires_grad=True)


def _build_gemm(op: str) -> Builder:
    def build(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Any, ...]:
        torch = _torch()
        m, n, k, b = d["m"], d["n"], d["k"], d.get("batch", 1)
        if op == "aten::mm":
            a, w = _rand(torch, [m, k], dtype, device), _rand(torch, [k, n], dtype, device)
            return (lambda: torch.mm(a, w)), [a, w]
        if op == "aten::addmm":
            c, a, w = (
                _rand(torch, [n], dtype, device),
                _rand(torch, [m, k], dtype, device),
                _rand(torch, [k, n], dtype, device),
            )
            return (lambda: torch.addmm(c, a, w)), [c, a, w]
        if op == "aten::linear":
            x, w, bias = (
                _rand(torch, [m, k], dtype, device),
                _rand(torch, [n, k], dtype, device),
                _rand(torch, [n], dtype, device),
            )
            linear = torch.nn.functional.linear
            return (lambda: linear(x, w, bias)), [x, w, bias]
        a, w = _rand(torch, [b, m, k], dtype, device), _rand(torch, [b, k, n], dtype, device)
        if op == "aten::bmm":
            return (lambda: torch.bmm(a, w)), [a, w]
        c = _rand(torch, [b, m, n], dtype, device)
        return (lambda: torch.baddbmm(c, a, w)), [c, a, w]

    return build


def _build_attention(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Callable[[], Any], list[Any]]:
    torch = _torch()
    b, h, sq, sk, hd, causal = d["batch"], d["heads"], d["seq_q"], d["seq_k"], d["head_dim"], bool(d["causal"])
    q = _rand(torch, [b, h, sq, hd], dtype, device)
    k = _rand(torch, [b, h, sk, hd], dtype, device)
    v = _rand(torch, [b, h, sk, hd], dtype, device)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return (lambda: sdpa(q, k, v, is_causal=causal)), [q, k, v]


def _build_rows(op: str) -> Builder:
    def build(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Any, ...]:
        torch = _torch()
        f = torch.nn.functional
        t, h = d["tokens"], d["hidden"]
        x = _rand(torch, [t, h], dtype, device)
        if op == "aten::softmax":
            return (lambda: torch.softmax(x, -1)), [x]
        if op == "aten::log_softmax":
            return (lambda: torch.log_softmax(x, -1)), [x]
        if op in ("aten::layer_norm", "aten::rms_norm"):
            w = torch.ones(h, dtype=dtype, device=device, requires_grad=True)
            if op == "aten::rms_norm":
                return (lambda: f.rms_norm(x, (h,), w)), [x, w]
            bias = torch.zeros(h, dtype=dtype, device=device, requires_grad=True)
            return (lambda: f.layer_norm(x, (h,), w, bias)), [x, w, bias]
        if op == "aten::gelu":
            return (lambda: f.gelu(x)), [x]
        if op == "aten::silu":
            return (lambda: f.silu(x)), [x]
        if d.get("broadcast"):
            x = _rand(torch, [d["broadcast"], t, h], dtype, device)
        y = _rand(torch, [t, h], getattr(torch, d["other_dtype"]) if d.get("other_dtype") else dtype, device)
        if op == "aten::add":
            return (lambda: torch.add(x, y)), [x, y]
        return (lambda: torch.mul(x, y)), [x, y]

    return build


def _copy_source(torch: Any, shape: tuple[int, ...], dtype: Any, device: Any, d: dict[str, Any]) -> Any:
    """The source of a copy_: on the device (a device-to-device memcpy when the dtypes agree, a cast
    kernel when they differ), or in host memory, pinned or pageable (a host-to-device memcpy).

    Raises:
        RuntimeError: a host-to-device copy asked of a CPU sampler (the caller skips the point).
    """
    src = d.get("src") or "device"
    if src == "device":
        return torch.randn(shape, device=device).to(dtype)
    if torch.device(device).type != "cuda":
        raise RuntimeError(f"a host-to-device copy ({src} memory) needs a CUDA device")
    host = torch.randn(shape).to(dtype)
    return host.pin_memory() if src == "pinned" else host


def _build_sdpa_backend(op: str) -> Builder:
    def build(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Any, ...]:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        fwd, inputs = _build_attention(d, dtype, device)
        backend = getattr(SDPBackend, SDPA_BACKENDS[op])

        def pinned() -> Any:  # dispatches to this backend or raises: never a silent fallback
            with sdpa_kernel([backend]):
                return fwd()

        return pinned, inputs, {"backend": SDPA_BACKENDS[op].lower()}

    return build


def _build_reduction(op: str) -> Builder:
    def build(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Any, ...]:
        torch = _torch()
        x = _rand(torch, [d["tokens"], d["hidden"]], dtype, device)
        reduce = getattr(torch, op.split("::")[-1])
        if d.get("reduce") == "all":
            return (lambda: reduce(x)), [x]
        dim = -1 if d.get("reduce") == "last" else 0
        return (lambda: reduce(x, dim)), [x]

    return build


def _build_cat(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Callable[[], Any], list[Any]]:
    torch = _torch()
    xs = [_rand(torch, [d["tokens"], d["hidden"]], dtype, device) for _ in range(d["tensors"])]
    return (lambda: torch.cat(xs, -1)), xs


def _build_gather(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Callable[[], Any], list[Any]]:
    torch = _torch()
    src = _rand(torch, [d["rows"], d["hidden"]], dtype, device)
    rows = torch.randint(0, d["rows"], (d["tokens"], 1), device=device)
    index = rows.expand(d["tokens"], d["hidden"])  # whole rows, as an embedding lookup gathers them
    return (lambda: torch.gather(src, 0, index)), [src]


def _build_nll(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Callable[[], Any], list[Any]]:
    torch = _torch()
    logp = _rand(torch, [d["tokens"], d["vocab"]], dtype, device)
    target = torch.randint(0, d["vocab"], (d["tokens"],), device=device)
    nll = torch.nn.functional.nll_loss
    return (lambda: nll(logp, target)), [logp]


def _build_embedding(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Callable[[], Any], list[Any]]:
    torch = _torch()
    w = _rand(torch, [d["vocab"], d["hidden"]], dtype, device)
    idx = torch.randint(0, d["vocab"], (d["tokens"],), device=device)
    embedding = torch.nn.functional.embedding
    return (lambda: embedding(idx, w)), [w]


def _build_loss(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Callable[[], Any], list[Any]]:
    torch = _torch()
    logits = _rand(torch, [d["tokens"], d["vocab"]], dtype, device)
    target = torch.randint(0, d["vocab"], (d["tokens"],), device=device)
    cross_entropy = torch.nn.functional.cross_entropy
    return (lambda: cross_entropy(logits, target)), [logits]


def _build_optimizer(op: str) -> Builder:
    def build(d: dict[str, Any], dtype: Any, device: Any) -> tuple[Any, ...]:
        torch = _torch()
        params = [torch.nn.Parameter(torch.randn(s, dtype=dtype, device=device)) for s in _param_sizes(d)]
        for p in params:
            p.grad = torch.randn_like(p)
        cls = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam, "SGD": torch.optim.SGD}[op]
        impl = d.get("impl")
        if impl is not None:  # as traced: a fused step this device cannot run is skipped, not replaced
            flags = {"fused": {"fused": True}, "foreach": {"foreach": True}, "forloop": {"foreach": False}}[impl]
            try:
                opt = cls(params, lr=1e-4, **flags)
            except ValueError as exc:  # torch refuses fused= for this device or dtype
                raise RuntimeError(str(exc)) from exc
            opt.step()
            return opt.step, [], {"implementation": impl}
        # Fused (one multi-tensor kernel, like DeepSpeed/Apex FusedAdam in the published runs) where
        # torch supports it for this device and dtype, else foreach; the choice goes to params_json.
        try:
            opt, impl = cls(params, lr=1e-4, fused=True), "fused"
            opt.step()
        except (RuntimeError, ValueError):
            opt, impl = cls(params, lr=1e-4, foreach=True), "foreach"
            opt.step()
        # That first step allocated exp_avg/exp_avg_sq untimed: a training run times steady-state steps
        # (the published sampler timed a freshly constructed optimizer).
        return opt.step, [], {"implementation": impl}

    return build


def _spec(family: str, op: str, dims: str, record: Any, builder: Any, bwd: bool = True, **defaults: Any) -> OpSpec:
    return OpSpec(family, op, tuple(dims.split()), tuple(defaults.items()), bwd, record, builder)


_ROWS = "tokens hidden"
OP_SPECS: dict[tuple[str, str], OpSpec] = {
    (s.family, s.op): s
    for s in [
        *(_spec("gemm", op, "m n k", _record_gemm(op), _build_gemm(op))
          for op in ("aten::mm", "aten::addmm", "aten::linear")),
        *(_spec("gemm", op, "batch m n k", _record_gemm(op), _build_gemm(op)) for op in ("aten::bmm", "aten::baddbmm")),
        _spec("attention", "aten::scaled_dot_product_attention", "batch heads seq_q seq_k head_dim",
              _record_attention, _build_attention, causal=False),
        *(_spec("attention", op, "batch heads seq_q seq_k head_dim", _record_sdpa_backend(op), _build_sdpa_backend(op),
                causal=False) for op in SDPA_BACKENDS),
        *(_spec("softmax", op, _ROWS, _record_rows(op), _build_rows(op))
          for op in ("aten::softmax", "aten::log_softmax")),
        *(_spec("norm", op, _ROWS, _record_rows(op), _build_rows(op)) for op in ("aten::layer_norm", "aten::rms_norm")),
        *(_spec("elementwise", op, _ROWS, _record_rows(op), _build_rows(op))
          for op in ("aten::gelu", "aten::silu", "aten::mul")),
        # add's backward only passes the gradient through: there is no kernel to time.
        _spec("elementwise", "aten::add", _ROWS, _record_rows("aten::add"), _build_rows("aten::add"), bwd=False,
              broadcast=None, other_dtype=None),
        *(_spec("elementwise", op, _ROWS, _record_inplace(op), _build_inplace(op), bwd=False)
          for op in INPLACE_OPS if op != "aten::copy_"),
        # a copy within the device (a memcpy when the dtypes agree, a cast kernel when not) or from host memory
        _spec("elementwise", "aten::copy_", _ROWS, _record_inplace("aten::copy_"), _build_inplace("aten::copy_"),
              bwd=False, src_dtype=None, src=None),
        # reductions: their backward is an expand, with no kernel to time
        *(_spec("elementwise", op, _ROWS, _record_rows(op), _build_reduction(op), bwd=False, reduce=None)
          for op in ("aten::sum", "aten::mean")),
        _spec("elementwise", "aten::cat", "tensors tokens hidden", _record_cat, _build_cat, bwd=False),
        # an embedding lookup as recent torch runs it (index_select through gather); its backward in
        # training is embedding_dense_backward, sampled as the bwd of aten::embedding
        _spec("elementwise", "aten::gather", "rows tokens hidden", _record_gather, _build_gather, bwd=False),
        _spec("embedding", "aten::embedding", "tokens vocab hidden", _record_embedding, _build_embedding),
        _spec("loss", "aten::cross_entropy_loss", "tokens vocab", _record_loss, _build_loss),
        _spec("loss", "aten::nll_loss", "tokens vocab", _record_nll, _build_nll),
        *(_spec("optimizer", f"Optimizer.step#{name}.step", "params", _record_optimizer, _build_optimizer(name),
                bwd=False, tensors=1, impl=None) for name in ("Adam", "AdamW", "SGD")),
    ]
}  # fmt: skip
"""Every (family, op) the compute sampler knows."""

FAMILIES = tuple(dict.fromkeys(f for f, _ in OP_SPECS))


def spec_for(point: GridPoint) -> OpSpec:
    """The OpSpec of a point. Raises SampleError for an unknown family/op (listing the known ones)."""
    spec = OP_SPECS.get((point.family, point.op))
    if spec is None:
        known = ", ".join(f"{f}:{o}" for f, o in OP_SPECS)
        raise SampleError(f"unknown family/op {point.family}:{point.op}; known: {known}")
    return spec


def resolved_dims(point: GridPoint) -> dict[str, Any]:
    """The point's dimensions with defaults filled in and ``seq`` expanded to ``seq_q``/``seq_k``.

    Optional dimensions whose default is None (``OPTION_VALUES`` variants, ``broadcast``) are left
    out unless given, so points without them keep their sample ids.

    Raises:
        SampleError: a required dimension is missing, a dimension is unknown, a size is not a
            positive integer, or a variant is not one of its ``OPTION_VALUES``.
    """
    spec = spec_for(point)
    dims = dict(spec.defaults)
    given = dict(point.dims)
    if "seq" in given and spec.family == "attention":
        seq = given.pop("seq")
        given.setdefault("seq_q", seq)
        given.setdefault("seq_k", seq)
    dims.update(given)
    allowed = set(spec.dims) | {k for k, _ in spec.defaults}
    unknown = sorted(set(dims) - allowed)
    missing = [d for d in spec.dims if d not in dims]
    if unknown or missing:
        raise SampleError(
            f"{point.family}:{point.op} takes dimensions {', '.join(sorted(allowed))}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    dims = {k: v for k, v in dims.items() if v is not None}  # an optional variant left at its default
    for name, value in dims.items():
        if name in OPTION_VALUES:
            if value not in OPTION_VALUES[name]:
                raise SampleError(
                    f"{point.family}:{point.op}: {name} must be one of {', '.join(OPTION_VALUES[name])}, not {value!r}"
                )
        elif name == "causal":
            if not isinstance(value, bool):
                raise SampleError(f"{point.family}:{point.op}: causal must be true or false, not {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SampleError(f"{point.family}:{point.op}: dimension {name} must be a positive integer, not {value!r}")
    return dims


def trace_record(point: GridPoint) -> tuple[list[Any], list[str], list[str]]:
    """(Input Dims, Input type, Concrete Inputs) a Kineto trace records for the point's forward call."""
    if point.dtype not in DTYPE_BYTES:
        raise SampleError(f"dtype {point.dtype!r} is not one of {', '.join(DTYPE_NAMES)}")
    return spec_for(point).record(resolved_dims(point), TRACE_TYPE[point.dtype])


def shape_columns(point: GridPoint) -> dict[str, Any]:
    """The ``SHAPE_COLUMNS`` values of a point, for either direction the forward call's: computed by
    ``decode.shape_features.shape_row`` from the trace record, the same function that fills ``operators``.

    Raises:
        SampleError: unknown op, bad dimensions, or a dtype outside ``DTYPE_NAMES``.
    """
    dims, types, concrete = trace_record(point)
    # A TensorList argument (cat, optimizer) has no element type in a trace; the sampler knows it,
    # as a traced operator's kernel name does (decode.shape_features.kernel_element_bytes).
    cols = shape_row(point.op, dims, types, concrete, list_element_bytes=DTYPE_BYTES.get(point.dtype))
    cols["dtype"] = cols["dtype"] or point.dtype
    return cols


def build(point: GridPoint, device: str, autograd: bool = True) -> Built:
    """Allocate the point's tensors on ``device`` and return what to time.

    ``fwd``: with ``autograd`` the call records its backward graph as in training (a traced training
    op's duration includes that); without, it runs under ``no_grad`` as in inference. ``bwd``: the
    forward runs once here and ``run`` computes the gradients of its output with the graph retained,
    so each repeat times the backward alone.

    Raises:
        SampleError: unknown op, bad dimensions, or ``bwd`` asked of an op without a backward.
        RuntimeError: torch cannot run the op for this dtype on this device (the caller skips it).
    """
    torch = _torch()
    spec = spec_for(point)
    dims = resolved_dims(point)
    if point.direction == "bwd" and not spec.has_backward:
        raise SampleError(f"{point.op} has no backward to sample; list it with directions: [fwd]")
    fwd, inputs, *info = spec.builder(dims, getattr(torch, point.dtype), torch.device(device))
    params: dict[str, Any] = dict(info[0]) if info else {}
    if point.op == "aten::scaled_dot_product_attention":  # the backend ops pin their own
        fwd, params["backend"] = _attention_backend(fwd, device, point.dtype)
    if point.direction == "fwd":
        if autograd:
            return Built(fwd, params)  # the output, and with it the graph, is dropped after each call
        no_grad = torch.no_grad

        def run_fwd() -> Any:
            with no_grad():
                return fwd()

        return Built(run_fwd, params)
    out = fwd()
    grad_out = torch.randn_like(out) if out.dim() else torch.ones_like(out)
    grad = torch.autograd.grad

    def run_bwd() -> Any:
        return grad(out, inputs, grad_out, retain_graph=True)

    return Built(run_bwd, params)


def _attention_backend(fwd: Callable[[], Any], device: str, dtype: str) -> tuple[Callable[[], Any], str]:
    """On CUDA with fp16/bf16, pin SDPA to the flash backend when it accepts the shape; else default.

    Pinning matters: the default dispatcher may silently pick the math backend for some shapes, and a
    sample must say which kernel it timed. (CUDA path: not exercised on the CPU-only CI machine.)
    """
    if not device.startswith("cuda") or dtype == "float32":
        return fwd, "default"
    torch = _torch()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def flash() -> Any:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return fwd()

    try:
        flash()
        torch.cuda.synchronize()
    except RuntimeError:
        return fwd, "default"
    return flash, "flash"
