"""``CalibratedModels``: route traced operator and collective rows to a cluster's stored models.

The stable interface the replay uses (``tracecal.predict``)::

    models = tracecal.calibrate.load("perlmutter", con, store_dir=model_store_dir(db))
    durations_ns = models.predict(rows)   # np.ndarray, NaN where no model covers the row

``rows`` is a polars frame of ``operators`` rows (``family``, ``phase``, shape columns; optionally
``cpu_op_name``/``name``) or of collective instances (``family = 'comm'``, ``collective``,
``size_bytes``, ``group_size``, ``nodes``, ``gpus_per_node``), or a mix.

Routing, per row: the candidates are the models of the row's family and direction (``direction_of``:
backward operators → bwd, others → fwd, GEMMs always fwd; collectives: the same collective and
topology ``nodes × gpus_per_node``).

Then the operator's kind decides (``op_kind``: the computation an op name or a sweep name stands
for, e.g. ``aten::native_layer_norm`` and the ``layernorm`` sweep are both ``layer_norm``, while
``RMSlayernorm`` and an ``RMSNorm`` module are ``rms_norm``): a named operator is served only by the
models of its own kind, and among several (the GEMM sweeps ``linear1`` ... ``linear_final`` are all
``matmul``) by the one whose training samples lie nearest to the row's shape (log scale, per-feature
standardised). Outside a sweep's grid that model extrapolates (its physical baseline carries the
scale), e.g. a backward ``aten::bmm`` with M = head dim stays on the ``bmm`` sweep, sampled with
M = sequence length. A named operator with no model of its kind never borrows another kind's sweep:
it takes the family's pooled model when there is one, else ``unsampled`` decides (``uncovered``:
NaN; ``baseline``: the family's bandwidth baseline, ``UNSAMPLED_FAMILIES`` only). Rows without a
name, and slots whose models have no kind, go to the nearest model. A candidate whose source op is
the row's operator name always wins. Rows without a candidate get NaN, which the replay counts as
uncovered.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np
import polars as pl

from tracecal.calibrate.estimators import PhysicalBaseline, import_sklearn
from tracecal.calibrate.features import COMM_FAMILY, COMM_NUMERIC, DTYPE_BYTES, SHAPE_NUMERIC, feature_frame
from tracecal.calibrate.fitting import ALL_OPS
from tracecal.calibrate.store import StoredModel
from tracecal.calibrate.sweep_level import SweepLevel

_FAR = 1e6  # added distance per domain feature the model trained on that a row lacks
SIZE_MARGIN = 4.0
"""A collective more than this factor below the smallest (or above the largest) message its sweep timed
is beyond the sweep: latency and protocol change with size, so it stays uncovered, not extrapolated."""


AUTOGRAD_NODE = re.compile(r"Backward\d*$")
"""Autograd graph nodes (``ViewBackward0``, ``AddBackward0``): as leaf operators they did no sampled
tensor work of their own, so no model covers them."""

FUNCTION_BACKWARD = re.compile(r"[^\d_]Backward$")
"""The backward node of a custom ``torch.autograd.Function`` (``<Class>Backward``, no number, unlike
the generated ``<Op>Backward0`` nodes of aten ops): its backward kernels run inside the node itself
(``ScaledUpperTriangMaskedSoftmaxBackward``, ``FlashAttnFuncBackward``), so it is the backward call of
its forward op."""

_OP_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("rms_norm", r"rms_?(layer_?)?norm"),
        ("layer_norm", r"layer_?norm"),
        ("flash_attention", r"flash_?att"),
        ("cudnn_attention", r"cudnn_att"),
        ("efficient_attention", r"efficient_att"),
        ("math_attention", r"attention_math"),
        ("masked_softmax", r"masked_?softmax"),
        ("log_softmax", r"log_?softmax"),
        ("softmax", r"softmax"),
        ("baddbmm", r"^baddbmm$"),
        ("bmm", r"^bmm$"),
        ("matmul", r"^(mm|addmm|_addmm_activation|matmul|linear\w*)$"),
        ("gelu", r"gelu"),
        ("rotary", r"rope|rotary"),
        ("add", r"^(res_)?add$"),
        ("embedding", r"embedding"),
        ("cross_entropy", r"cross_?entropy"),
        ("nll_loss", r"^nll_loss"),
    )
)
"""Ordered (first match wins) patterns over the lower-cased base name: RMS before layer norm, the
masked and log softmaxes before plain softmax; the SDPA backends (flash, cuDNN, memory-efficient,
math) are kinds of their own, so a traced ``_cudnn_attention_forward`` meets the samples of
``_scaled_dot_product_cudnn_attention``. Composite sweeps (``fillmask``: baddbmm, masked_fill and
softmax in one sample) have no kind: no single traced operator does their work."""

COMPOSITE_KINDS = ("rotary", "rms_norm")
"""Kinds whose published sweeps time a module of several kernels (a rotary embedding; an unfused
RMSNorm of norm, mul, div and add), so their time is not one kernel's traffic: left out of the
bandwidth baseline of unsampled operators."""

UNSAMPLED_FAMILIES = ("elementwise", "norm", "softmax")
"""Memory-bound families whose unsampled operators ``unsampled = "baseline"`` predicts from bytes
moved: there a kernel's time is its traffic over the memory bandwidth plus a launch floor."""


def op_kind(name: str | None) -> str | None:
    """The computation an operator or sweep name stands for (``layer_norm``, ``rms_norm``, ``bmm``,
    ``matmul``, ``add``, ...), the same for forward and backward; None when it is none of
    ``_OP_KINDS``.

    The namespace (``aten::``), an in-place ``_`` and a ``_backward``/``Backward`` suffix are
    dropped first: ``aten::native_layer_norm_backward`` and the ``layernorm`` sweep are
    ``layer_norm``, ``aten::add_`` and ``res_add`` are ``add``, ``FlashAttnFuncBackward`` and
    ``flash_atten`` are ``flash_attention``.
    """
    if not name:
        return None
    base = name.rsplit("::", 1)[-1].strip().lower()
    base = re.sub(r"(_backward(_data)?|backward\d*)$", "", base).rstrip("_")
    return next((kind for kind, pattern in _OP_KINDS if pattern.search(base)), None)


def direction_of(phase: str | None, family: str | None = None, name: str | None = None) -> str | None:
    """The sample direction a traced operator is predicted with, or None when no model applies.

    What matters is the operator, not the phase it ran in: a ``bwd`` sample times the backward
    kernel of a forward call (``aten::gelu_backward``, ``native_layer_norm_backward``), recorded with
    the forward shape; an ``aten::add_`` accumulating gradients in the backward pass is a forward
    add. So: a name containing ``backward`` → bwd, an autograd node → None, any other name → fwd,
    and without a name the phase decides. GEMMs are always fwd: every GEMM traced in a backward
    pass is one GEMM of its own recorded shape, while a ``bwd`` GEMM sample times two. A custom
    autograd Function's backward node (``FUNCTION_BACKWARD``) whose kind has models is bwd.
    """
    if family == "gemm":
        return "fwd"
    if name:
        if AUTOGRAD_NODE.search(name):
            return "bwd" if FUNCTION_BACKWARD.search(name) and op_kind(name) else None
        return "bwd" if "backward" in name.lower() else "fwd"
    return "bwd" if phase == "bwd" else "fwd"


UNSAMPLED_DEFAULT = "baseline"
"""What ``CalibratedModels`` does with a named operator that has no model of its kind."""

UNSAMPLED = -2
"""``_route``'s choice for a named operator without a model of its kind."""


def _names(frame: pl.DataFrame) -> list[str | None]:
    """Each row's operator name: the CPU operator, else the sample's op, else ``name``."""
    names: list[str | None] = [None] * frame.height
    for column in ("name", "op", "cpu_op_name"):  # later columns win
        if column in frame.columns:
            values = frame.get_column(column).cast(pl.Utf8).to_list()
            names = [v if v is not None else n for v, n in zip(values, names, strict=True)]
    return names


def _as_forward_call(frame: pl.DataFrame, family: str) -> pl.DataFrame:
    """Backward operators described like the forward call a ``bwd`` sample is keyed by.

    A ``bwd`` sample carries its forward call's features and the whole backward's time (the
    published convention), while a traced backward op's ``io_bytes`` and ``flops`` count its own
    arguments (``native_layer_norm_backward`` reads the gradient, the input and the statistics:
    1.5x the forward's bytes). Its ``elements`` and attention dimensions are the forward's, so the
    forward's traffic and work are recomputed from them: an element-wise, norm or softmax call reads
    and writes its tensor once; attention reads q, k, v and writes o, and its flops are the
    forward's (``shape_row`` multiplies a backward's by 2.5)."""
    columns = set(frame.columns)
    if family in UNSAMPLED_FAMILIES and {"elements", "dtype", "io_bytes"} <= columns:
        size = pl.col("dtype").cast(pl.Utf8).replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Float64)
        return frame.with_columns((2.0 * pl.col("elements") * size).alias("io_bytes"))
    if family == "attention" and {"flops", "io_bytes", "batch", "heads", "seq_q", "head_dim", "dtype"} <= columns:
        size = pl.col("dtype").cast(pl.Utf8).replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Float64)
        tensor = pl.col("batch") * pl.col("heads") * pl.col("seq_q") * pl.col("head_dim")
        return frame.with_columns((pl.col("flops") / 2.5).alias("flops"), (4.0 * tensor * size).alias("io_bytes"))
    return frame


def _topology(nodes: object, gpus_per_node: object) -> str | None:
    if nodes is None or gpus_per_node is None:
        return None
    return f"{int(nodes)}x{int(gpus_per_node)}"  # type: ignore[call-overload]


def _log_domain(frame: pl.DataFrame, columns: list[str]) -> np.ndarray:
    values = frame.select(columns).to_numpy().astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.log(np.where(values > 0, values, np.nan))


class CalibratedModels:
    """A cluster's calibrated regressors behind one ``predict(frame) -> durations_ns``."""

    def __init__(self, cluster: str, models: list[StoredModel], *, unsampled: str = UNSAMPLED_DEFAULT) -> None:
        if unsampled not in ("uncovered", "baseline"):
            raise ValueError(f"unsampled must be 'uncovered' or 'baseline', not {unsampled!r}")
        self.cluster = cluster
        self.models = models
        self.unsampled = unsampled
        self._baselines: dict[tuple, PhysicalBaseline | None] = {}
        self._by_slot: dict[tuple, list[StoredModel]] = defaultdict(list)
        for m in models:
            key = m.key
            if key.family == COMM_FAMILY:
                collective = m.meta.get("collective") or self._collective_of(m)
                self._by_slot[(COMM_FAMILY, collective, key.topology)].append(m)
            else:
                self._by_slot[(key.family, key.direction)].append(m)
        self._domains: dict[str, tuple[list[str], np.ndarray, np.ndarray, np.ndarray]] = {}
        self._sizes: dict[str, tuple[float, float]] = {}
        self._levels: dict[str, SweepLevel] = {}

    @staticmethod
    def _collective_of(model: StoredModel) -> str | None:
        values = model.training.get_column("collective").drop_nulls().unique().to_list()
        return values[0] if len(values) == 1 else None

    def families(self) -> list[str]:
        """Families with at least one model."""
        return sorted({m.key.family for m in self.models})

    def _domain(self, model: StoredModel) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """The model's training shapes in standardised log space (cached)."""
        mid = str(model.directory)
        if mid not in self._domains:
            raw = COMM_NUMERIC if model.key.family == COMM_FAMILY else SHAPE_NUMERIC
            columns = [c for c in model.meta["features"] if c in raw]
            if not columns:
                columns = [c for c in model.meta["physical_columns"]]
            feats = feature_frame(model.training, model.key.family)
            points = _log_domain(feats, columns)
            centre = np.nanmean(points, axis=0)
            spread = np.nanstd(points, axis=0)
            spread = np.where(np.isfinite(spread) & (spread > 0), spread, 1.0)
            self._domains[mid] = (columns, (points - centre) / spread, centre, spread)
        return self._domains[mid]

    def _size_range(self, model: StoredModel) -> tuple[float, float]:
        """The smallest and largest message its samples timed (cached)."""
        key = str(model.directory)
        if key not in self._sizes:
            sizes = model.training.get_column("size_bytes").cast(pl.Float64).drop_nulls().to_numpy()
            self._sizes[key] = (float(sizes.min()), float(sizes.max())) if sizes.size else (0.0, np.inf)
        return self._sizes[key]

    def sweep_level(self, model: StoredModel) -> SweepLevel:
        """The level of a collective model's sweep (``sweep_level``; cached)."""
        key = str(model.directory)
        if key not in self._levels:
            collective = model.meta.get("collective") or self._collective_of(model)
            self._levels[key] = SweepLevel.of(model.training, model.model.baseline_, collective)
        return self._levels[key]

    def _distance(self, model: StoredModel, features: pl.DataFrame) -> np.ndarray:
        """Distance from each row to the nearest training sample of ``model``."""
        columns, points, centre, spread = self._domain(model)
        query = (_log_domain(features, columns) - centre) / spread
        points = np.where(np.isfinite(points), points, 0.0)
        missing = ~np.isfinite(query)
        query = np.where(missing, 0.0, query)
        distance, _ = import_sklearn("sklearn.neighbors").KDTree(points).query(query, k=1)
        # a missing feature counts as far (prefer models the row fully describes); a row missing all
        # of them is beyond every model
        far = np.where(missing.all(axis=1), np.inf, _FAR * missing.sum(axis=1))
        return distance[:, 0] + far

    def _route(self, frame: pl.DataFrame, candidates: list[StoredModel], family: str) -> np.ndarray:
        """Index into ``candidates`` per row of ``frame`` (all of one slot); -1 when a row has none
        of the shape features the models were trained on (it stays uncovered, not guessed), and
        ``UNSAMPLED`` when a named operator has no model of its kind (see the module docstring)."""
        features = feature_frame(frame, family)
        distances = np.column_stack([self._distance(m, features) for m in candidates])
        choice = np.argmin(distances, axis=1)
        pooled = [j for j, m in enumerate(candidates) if m.key.op == ALL_OPS]
        if pooled:
            # sampled ops without a model of their own take the family's pooled model
            choice[:] = pooled[0]
        kinds = [None if m.key.op == ALL_OPS else op_kind(m.key.op) for m in candidates]
        names = _names(frame)
        if any(kinds):
            row_kinds = [op_kind(n) if n is not None else None for n in names]
            for kind in set(row_kinds):
                rows = np.array([n is not None and k == kind for n, k in zip(names, row_kinds, strict=True)])
                if not rows.any():
                    continue
                own = [j for j, k in enumerate(kinds) if kind is not None and k == kind]
                if own:
                    # the distance only chooses among the op's own sweeps
                    choice[rows] = np.asarray(own)[np.argmin(distances[rows][:, own], axis=1)]
                else:
                    choice[rows] = pooled[0] if pooled else UNSAMPLED
        described = np.isfinite(distances)
        if family == COMM_FAMILY and "size_bytes" in frame.columns:
            sizes = frame.get_column("size_bytes").cast(pl.Float64).to_numpy()
            for j, m in enumerate(candidates):
                lo, hi = self._size_range(m)
                described[:, j] &= (sizes >= lo / SIZE_MARGIN) & (sizes <= hi * SIZE_MARGIN)
        picked = choice >= 0
        rows_picked = np.flatnonzero(picked)
        uncovered = rows_picked[~described[rows_picked, choice[rows_picked]]]
        choice[uncovered] = -1
        # an operator named like a model's source op (e.g. sampled aten::mm) uses that model
        for column in ("cpu_op_name", "op", "name"):
            if column not in frame.columns:
                continue
            column_names = frame.get_column(column).cast(pl.Utf8).to_list()
            for j, m in enumerate(candidates):
                hit = np.array([n == m.key.op for n in column_names], dtype=bool)
                choice[hit & described[:, j]] = j
        return choice

    def predict(self, frame: pl.DataFrame) -> np.ndarray:
        """Predicted durations (ns) of ``frame``'s rows, NaN where no model covers a row.

        Args:
            frame: operators and/or collective rows (see the module docstring).

        Returns:
            float64 array with one value per row, in row order.
        """
        out = np.full(frame.height, np.nan)
        if frame.height == 0 or "family" not in frame.columns:
            return out
        indexed = frame.with_row_index("_row")
        families = indexed.get_column("family").cast(pl.Utf8).to_list()
        if "phase" in indexed.columns:
            phases = indexed.get_column("phase").cast(pl.Utf8).to_list()
        else:
            phases = [None] * indexed.height
        names: list[str | None] = [None] * indexed.height
        for column in ("name", "cpu_op_name"):  # the CPU operator's name wins over a kernel name
            if column in indexed.columns:
                values = indexed.get_column(column).cast(pl.Utf8).to_list()
                names = [v if v is not None else n for v, n in zip(values, names, strict=True)]
        slots: dict[tuple, list[int]] = defaultdict(list)
        comm = {}
        if COMM_FAMILY in families:
            collectives = (
                indexed.get_column("collective").cast(pl.Utf8).to_list()
                if "collective" in indexed.columns
                else [None] * indexed.height
            )
            nodes = indexed.get_column("nodes").to_list() if "nodes" in indexed.columns else [None] * indexed.height
            gpn = (
                indexed.get_column("gpus_per_node").to_list()
                if "gpus_per_node" in indexed.columns
                else [None] * indexed.height
            )
            comm = {"collective": collectives, "nodes": nodes, "gpn": gpn}
        for i, family in enumerate(families):
            slot: tuple[Any, ...]
            if family == COMM_FAMILY:
                slot = (COMM_FAMILY, comm["collective"][i], _topology(comm["nodes"][i], comm["gpn"][i]))
            else:
                direction = direction_of(phases[i], family, names[i])
                if direction is None:
                    continue
                slot = (family, direction)
            if slot in self._by_slot:
                slots[slot].append(i)
        for slot, rows in slots.items():
            candidates = self._by_slot[slot]
            part = indexed[rows]
            family = slot[0]
            if slot[1:] == ("bwd",):
                part = _as_forward_call(part, family)
            choice = self._route(part, candidates, family)
            features = feature_frame(part, family)
            baseline = self.unsampled_baseline(slot) if family in UNSAMPLED_FAMILIES else None
            # no kernel ends before the launch floor, however far below its sweep a small op lies
            floor = float(baseline.coef_[0]) if baseline is not None else 0.0
            for j, model in enumerate(candidates):
                picked = np.flatnonzero(choice == j)
                if picked.size:
                    predicted = np.maximum(model.model.predict(features[picked]), floor)
                    if family == COMM_FAMILY:
                        # a traced collective at its sweep's level, not at its nearest samples
                        level = self.sweep_level(model)
                        predicted = level.predict(features[picked], model.model.baseline_, predicted)
                    out[np.asarray(rows)[picked]] = predicted
            picked = np.flatnonzero(choice == UNSAMPLED)
            if picked.size and baseline is not None and self.unsampled == "baseline":
                known = picked[np.isfinite(features.get_column("bytes_moved").to_numpy()[picked])]
                out[np.asarray(rows)[known]] = baseline.predict(features[known])
        return out

    def unsampled_baseline(self, slot: tuple) -> PhysicalBaseline | None:
        """``launch floor + bytes moved / bandwidth`` fitted on the samples of the slot's
        single-kernel sweeps (one family and direction; ``COMPOSITE_KINDS`` and kind-less sweeps
        left out), for operators of that family without a sweep of their own; None outside
        ``UNSAMPLED_FAMILIES`` or without such sweeps. Cached."""
        if slot not in self._baselines:
            family = slot[0]
            baseline = None
            if family in UNSAMPLED_FAMILIES:
                single = [
                    m.training
                    for m in self._by_slot[slot]
                    if op_kind(m.key.op) is not None and op_kind(m.key.op) not in COMPOSITE_KINDS
                ]
                if not single:
                    self._baselines[slot] = None
                    return None
                training = pl.concat(single, how="diagonal_relaxed")
                durations = training.get_column("median_ns").cast(pl.Float64).to_numpy()
                features = feature_frame(training, family)
                keep = np.isfinite(durations) & (durations > 0) & np.isfinite(features["bytes_moved"].to_numpy())
                if keep.any():
                    baseline = PhysicalBaseline(("bytes_moved",)).fit(features.filter(keep), durations[keep])
            self._baselines[slot] = baseline
        return self._baselines[slot]
