"""Regressor features per op family, derived from the shape columns traced operators and samples share.

The same function serves both sides of the product's join (docs/calibration.md#features): a frame of ``samples`` rows or
of ``operators`` / ``collectives`` rows carries ``schema.SHAPE_COLUMNS`` / ``schema.COMM_COLUMNS``, and
``feature_frame(frame, family)`` turns it into the numeric matrix a regressor sees. Shape columns alone
only let a model interpolate inside the sampled grid; the derived physics (flops, bytes moved,
arithmetic intensity, GEMM tile and wave counts, per-rank message size, ring steps) is what lets it
generalise and what the physical baselines are fitted on.

Missing inputs stay missing: a derived feature whose inputs are null is NaN (both XGBoost and the
scikit-learn forests handle NaN), never 0.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracecal.schema import COMM_COLUMNS, SHAPE_COLUMNS

COMPUTE_FAMILIES = ("gemm", "attention", "softmax", "norm", "elementwise", "embedding", "loss", "optimizer")
"""Families with a compute model (memcpy/memset/other are left to measured durations)."""

COMM_FAMILY = "comm"

DTYPE_BYTES = {
    "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "c10::half": 2, "c10::bfloat16": 2,
    "float32": 4, "float": 4, "fp32": 4, "tf32": 4, "int32": 4, "int": 4,
    "float64": 8, "double": 8, "int64": 8, "long": 8,
    "int8": 1, "uint8": 1, "bool": 1, "float8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip
"""Element size by dtype name (lower-cased; torch, Kineto and published spellings)."""

DEFAULT_SM_COUNT = 108
"""Streaming multiprocessors used for wave counts when the device is unknown (A100: 108). Only the
quantisation step changes with it; trees learn the scale from the data either way."""

GEMM_TILES = ((128, 128), (256, 128), (64, 64))
"""Output tile shapes (rows × columns) whose counts and waves are features: cuBLAS/CUTLASS kernels on
Ampere/Hopper use these, and duration steps where the tile count crosses a multiple of the SM count."""

BUSBW_FACTOR_STEPS = {
    # collective -> (ring steps as a function of n, bus-bandwidth factor as a function of n)
    "all_reduce": (lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n),
    "all_gather": (lambda n: n - 1, lambda n: (n - 1) / n),
    "reduce_scatter": (lambda n: n - 1, lambda n: (n - 1) / n),
    "all_to_all": (lambda n: n - 1, lambda n: (n - 1) / n),
    "broadcast": (lambda n: n - 1, lambda n: 1.0 + 0 * n),
    "reduce": (lambda n: n - 1, lambda n: 1.0 + 0 * n),
    "send": (lambda n: 1.0 + 0 * n, lambda n: 1.0 + 0 * n),
    "recv": (lambda n: 1.0 + 0 * n, lambda n: 1.0 + 0 * n),
}
"""nccl-tests definitions (docs/calibration.md#features): ring steps a message takes and the busbw factor."""

NCCL_CHUNK_BYTES = 512 * 1024
"""NCCL's Simple-protocol step (default ``NCCL_BUFFSIZE`` 4 MiB / ``NCCL_STEPS`` 8): a message moves in
steps of this size, and where it ends inside its last step can change the time. ``chunk_phase`` is
that position (0–1). Measured on the published Perlmutter sweeps: all_reduce on 2 nodes × 4 GPUs runs
±3 % apart by size mod 512 KiB; no other file shows it, hence ``informative_phase``."""

PHASE_BINS = 8
PHASE_ALPHA = 1e-4
"""Significance below which a sweep's duration is taken to depend on ``chunk_phase``."""

SHAPE_NUMERIC = tuple(c.name for c in SHAPE_COLUMNS if c.sql_type in ("BIGINT", "DOUBLE", "BOOLEAN"))
COMM_NUMERIC = tuple(c.name for c in COMM_COLUMNS)

PHYSICS_COLUMNS = {
    "compute": ("flops_derived", "bytes_moved"),
    "optimizer": ("flops_derived", "bytes_moved", "tensors"),
    "comm": ("ring_steps", "bus_bytes"),
}
"""Columns of ``feature_frame`` the physical baselines are linear in (besides a constant)."""


def _col(frame: pl.DataFrame, name: str) -> np.ndarray:
    """A column as float64 with NaN for null (or all-NaN when the frame lacks it)."""
    if name not in frame.columns:
        return np.full(frame.height, np.nan)
    series = frame.get_column(name)
    if series.dtype == pl.Boolean:
        series = series.cast(pl.Float64)
    return series.cast(pl.Float64, strict=False).fill_null(np.nan).to_numpy().astype(np.float64)


def element_bytes(frame: pl.DataFrame) -> np.ndarray:
    """Bytes per element from the ``dtype`` column; NaN when the dtype is unknown or absent."""
    if "dtype" not in frame.columns:
        return np.full(frame.height, np.nan)
    names = frame.get_column("dtype").cast(pl.Utf8).str.to_lowercase().str.replace("^torch\\.", "")
    mapping = pl.DataFrame({"dtype": list(DTYPE_BYTES), "size": [float(v) for v in DTYPE_BYTES.values()]})
    sizes = pl.DataFrame({"dtype": names}).join(mapping, on="dtype", how="left", maintain_order="left")
    return sizes.get_column("size").fill_null(np.nan).to_numpy().astype(np.float64)


def _gemm(frame: pl.DataFrame, sm_count: int) -> dict[str, np.ndarray]:
    m, n, k = _col(frame, "m"), _col(frame, "n"), _col(frame, "k")
    batch = np.where(np.isnan(_col(frame, "batch")), 1.0, _col(frame, "batch"))
    es = element_bytes(frame)
    es = np.where(np.isnan(es), 2.0, es)  # dtype unknown: fp16, the common training case; scale only
    out: dict[str, np.ndarray] = {}
    out["flops_derived"] = 2.0 * batch * m * n * k
    out["bytes_moved"] = es * batch * (m * k + k * n + m * n)
    out["intensity"] = out["flops_derived"] / out["bytes_moved"]
    for tm, tn in GEMM_TILES:
        tiles = batch * np.ceil(m / tm) * np.ceil(n / tn)
        waves = np.ceil(tiles / sm_count)
        out[f"tiles_{tm}x{tn}"] = tiles
        out[f"waves_{tm}x{tn}"] = waves
        # share of the last wave's SMs that have work: low values waste a whole wave
        out[f"wave_fill_{tm}x{tn}"] = tiles / (waves * sm_count)
    out["k_steps_32"] = np.ceil(k / 32)
    return out


def _attention(frame: pl.DataFrame, sm_count: int) -> dict[str, np.ndarray]:
    b = _col(frame, "batch")
    heads, sq, sk, hd = _col(frame, "heads"), _col(frame, "seq_q"), _col(frame, "seq_k"), _col(frame, "head_dim")
    causal = _col(frame, "causal")
    es = element_bytes(frame)
    es = np.where(np.isnan(es), 2.0, es)
    share = np.where(causal == 1.0, 0.5, 1.0)  # a causal mask skips half the score matrix
    out: dict[str, np.ndarray] = {}
    out["flops_derived"] = 4.0 * b * heads * sq * sk * hd * share
    out["bytes_moved"] = es * b * heads * hd * (2.0 * sq + 2.0 * sk)
    out["intensity"] = out["flops_derived"] / out["bytes_moved"]
    tiles = b * heads * np.ceil(sq / 128)
    out["tiles_q128"] = tiles
    out["waves_q128"] = np.ceil(tiles / sm_count)
    return out


def _memory_bound(frame: pl.DataFrame) -> dict[str, np.ndarray]:
    """softmax, norm, elementwise, embedding, loss, optimizer: time follows bytes touched."""
    es = element_bytes(frame)
    es = np.where(np.isnan(es), 2.0, es)
    elements = _col(frame, "elements")
    tokens, vocab, hidden, params = (_col(frame, c) for c in ("tokens", "vocab", "hidden", "params"))
    # the largest tensor the op streams through, whichever columns the family fills
    main = np.fmax(np.fmax(elements, tokens * vocab), np.fmax(tokens * hidden, params))
    io = _col(frame, "io_bytes")
    out: dict[str, np.ndarray] = {}
    out["bytes_moved"] = np.where(np.isnan(io), 2.0 * es * main, io)
    out["flops_derived"] = np.where(np.isnan(_col(frame, "flops")), main, _col(frame, "flops"))
    out["main_elements"] = main
    # the element size of the op's (output) dtype: a cast moves the same bytes either way, but
    # each way runs its own kernel (torch's float32 -> bfloat16 copy is vectorised, its general
    # cast is not); NaN where the dtype is unknown
    out["element_bytes"] = element_bytes(frame)
    return out


def _row_reduction(frame: pl.DataFrame) -> dict[str, np.ndarray]:
    """softmax, norm: rows × row length. Kernels pick their variant by the row length rounded up to
    a power of two (warp-per-row softmax/norm kernels unroll over next_pow2(width) / 32 elements per
    thread), and a causal mask skips half of each score row."""
    width, rows = _col(frame, "hidden"), _col(frame, "tokens")
    causal = _col(frame, "causal")
    with np.errstate(invalid="ignore", divide="ignore"):
        pow2 = np.exp2(np.ceil(np.log2(width)))
    out: dict[str, np.ndarray] = {}
    out["row_pow2"] = pow2
    out["row_fill"] = width / pow2  # share of the padded row that is real work
    out["padded_elements"] = rows * pow2
    out["live_elements"] = _col(frame, "elements") * np.where(causal == 1.0, 0.5, 1.0)
    return out


def _optimizer(frame: pl.DataFrame) -> dict[str, np.ndarray]:
    """Optimizer steps: multi-tensor kernels process tensors in chunks and launch per group of
    tensors, and a freshly built optimizer allocates state per tensor: tensor count and mean tensor
    size matter besides the parameter count."""
    tensors, params = _col(frame, "batch"), _col(frame, "params")
    out: dict[str, np.ndarray] = {}
    out["tensors"] = tensors
    out["params_per_tensor"] = params / tensors
    return out


def _comm(frame: pl.DataFrame) -> dict[str, np.ndarray]:
    size = _col(frame, "size_bytes")
    n = _col(frame, "group_size")
    nodes, gpn = _col(frame, "nodes"), _col(frame, "gpus_per_node")
    n = np.where(np.isnan(n), nodes * gpn, n)
    names = (
        frame.get_column("collective").cast(pl.Utf8).to_list()
        if "collective" in frame.columns
        else [None] * frame.height
    )
    steps = np.full(frame.height, np.nan)
    factor = np.full(frame.height, np.nan)
    for name, (steps_fn, factor_fn) in BUSBW_FACTOR_STEPS.items():
        mask = np.array([x == name for x in names], dtype=bool)
        if mask.any():
            steps[mask] = steps_fn(n[mask])
            factor[mask] = factor_fn(n[mask])
    out: dict[str, np.ndarray] = {}
    out["per_rank_bytes"] = size / n
    out["ring_steps"] = steps
    out["bus_bytes"] = size * factor
    out["inter_node"] = np.where(np.isnan(nodes), np.nan, (nodes > 1).astype(np.float64))
    out["chunk_phase"] = np.mod(size, NCCL_CHUNK_BYTES) / NCCL_CHUNK_BYTES
    return out


def feature_frame(frame: pl.DataFrame, family: str, *, sm_count: int = DEFAULT_SM_COUNT) -> pl.DataFrame:
    """Numeric features of ``frame``'s rows for a regressor of ``family``.

    Args:
        frame: rows carrying (some of) ``SHAPE_COLUMNS`` — or ``COMM_COLUMNS`` plus ``collective`` for
            ``family == "comm"``; samples, operators and collectives rows all qualify. Missing columns
            are treated as all-null.
        family: an op family (``COMPUTE_FAMILIES``) or ``"comm"``.
        sm_count: SMs of the target device, for GEMM/attention wave counts.

    Returns:
        One float64 column per feature, same row order and count as ``frame``; NaN where an input is
        null. The raw shape columns come first, then the derived ones. Which columns a model actually
        uses is decided at fit time (columns that are all-NaN or constant in the training data are
        dropped, see ``usable_features``).
    """
    raw = COMM_NUMERIC if family == COMM_FAMILY else SHAPE_NUMERIC
    columns: dict[str, np.ndarray] = {name: _col(frame, name) for name in raw}
    if family == "gemm":
        # a GEMM without a batch count is one GEMM (mm/addmm vs bmm): batch 1 by definition, so
        # samples and traced operators agree whichever way their decoder spelled it; a GEMM whose
        # M, N, K did not parse keeps batch NaN, or that one feature would route it to a model
        parsed = ~(np.isnan(columns["m"]) | np.isnan(columns["n"]) | np.isnan(columns["k"]))
        columns["batch"] = np.where(np.isnan(columns["batch"]) & parsed, 1.0, columns["batch"])
    if family == COMM_FAMILY:
        columns.update(_comm(frame))
    elif family == "gemm":
        columns.update(_gemm(frame, sm_count))
    elif family == "attention":
        columns.update(_attention(frame, sm_count))
    else:
        columns.update(_memory_bound(frame))
        if family in ("softmax", "norm"):
            columns.update(_row_reduction(frame))
        elif family == "optimizer":
            columns.update(_optimizer(frame))
    with np.errstate(invalid="ignore", divide="ignore"):
        for name in ("flops_derived", "bytes_moved", "bus_bytes", "main_elements", "params_per_tensor"):
            if name in columns:
                columns[f"log_{name}"] = np.log(np.where(columns[name] > 0, columns[name], np.nan))
    return pl.DataFrame({name: pl.Series(name, values, dtype=pl.Float64) for name, values in columns.items()})


def usable_features(features: pl.DataFrame) -> list[str]:
    """Columns that carry information in a training frame: not all-NaN and not constant."""
    keep = []
    for name in features.columns:
        values = features.get_column(name).to_numpy()
        finite = values[np.isfinite(values)]
        if finite.size and np.ptp(finite) > 0:
            keep.append(name)
    return keep


def informative_phase(features: pl.DataFrame, durations_ns: np.ndarray) -> bool:
    """Whether a collective sweep's duration depends on ``chunk_phase`` beyond its trend in size.

    One-way ANOVA of the leave-one-out residuals of a local-linear fit of log duration along log
    size (8 neighbours) across ``PHASE_BINS`` phase bins, significant at ``PHASE_ALPHA``. Decided on
    the training rows only; where the sweep shows no phase effect the feature is left out, as it would
    be noise for the trees to split on.
    """
    from scipy.stats import f_oneway

    from tracecal.calibrate.local import leave_one_out

    size = _col(features, "size_bytes")
    phase = _col(features, "chunk_phase")
    y = np.asarray(durations_ns, dtype=np.float64)
    keep = np.isfinite(size) & (size > 0) & np.isfinite(phase) & np.isfinite(y) & (y > 0)
    if keep.sum() < 4 * PHASE_BINS:
        return False
    order = np.argsort(size[keep], kind="stable")
    key, value = np.log(size[keep][order]), np.log(y[keep][order])
    residual = value - leave_one_out(key, value, 8)
    bins = np.minimum((phase[keep][order] * PHASE_BINS).astype(int), PHASE_BINS - 1)
    groups = [residual[bins == b] for b in range(PHASE_BINS) if (bins == b).sum() > 1]
    if len(groups) < 2:
        return False
    return bool(f_oneway(*groups).pvalue < PHASE_ALPHA)


def physics_columns(family: str) -> tuple[str, ...]:
    """The feature columns the physical baseline of ``family`` is linear in."""
    if family in PHYSICS_COLUMNS:
        return PHYSICS_COLUMNS[family]  # the optimizer adds a per-tensor cost
    return PHYSICS_COLUMNS["compute"]
