"""``CalibratedModels``: route traced operator and collective rows to a cluster's stored models.

The stable interface the replay uses (``tracecal.predict``)::

    models = tracecal.calibrate.load("perlmutter", con=con, store_dir=model_store_dir(db))
    durations_ns = models.predict(rows)   # np.ndarray, NaN where no model covers the row

``rows`` is a polars frame of ``operators`` rows (``family``, ``phase``, shape columns; optionally
``cpu_op_name``/``name``) or of collective instances (``family = 'comm'``, ``collective``,
``size_bytes``, ``group_size``, ``nodes``, ``gpus_per_node``), or a mix.

Routing, per row: the candidates are the models of the row's family and direction (``direction_of``:
backward operators → bwd, others → fwd, GEMMs always fwd; collectives: the same collective and
topology ``nodes × gpus_per_node``).
A candidate whose source op is the row's operator name wins; otherwise the candidate whose training
samples lie nearest to the row's shape (log scale, per-feature standardised) serves it — e.g. a
traced ``aten::mm`` of shape 8192×6144×1536 goes to the published GEMM sweep that sampled the nearest
shapes. Rows without a candidate get NaN, which the replay counts as uncovered.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np
import polars as pl

from tracecal.calibrate.features import COMM_FAMILY, COMM_NUMERIC, SHAPE_NUMERIC, feature_frame
from tracecal.calibrate.fitting import ALL_OPS
from tracecal.calibrate.store import StoredModel

_FAR = 1e6  # added distance per domain feature the model trained on that a row lacks


AUTOGRAD_NODE = re.compile(r"Backward\d*$")
"""Autograd graph nodes (``ViewBackward0``, ``AddBackward0``): as leaf operators they did no sampled
tensor work of their own, so no model covers them."""


def direction_of(phase: str | None, family: str | None = None, name: str | None = None) -> str | None:
    """The sample direction a traced operator is predicted with, or None when no model applies.

    What matters is the operator, not the phase it ran in: a ``bwd`` sample times the backward
    kernel of a forward call (``aten::gelu_backward``, ``native_layer_norm_backward``), recorded with
    the forward shape; an ``aten::add_`` accumulating gradients in the backward pass is a forward
    add. So: a name containing ``backward`` → bwd, an autograd node → None, any other name → fwd,
    and without a name the phase decides. GEMMs are always fwd: every GEMM traced in a backward
    pass is one GEMM of its own recorded shape, while a ``bwd`` GEMM sample times two.
    """
    if family == "gemm":
        return "fwd"
    if name:
        if AUTOGRAD_NODE.search(name):
            return None
        return "bwd" if "backward" in name.lower() else "fwd"
    return "bwd" if phase == "bwd" else "fwd"


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

    def __init__(self, cluster: str, models: list[StoredModel]) -> None:
        self.cluster = cluster
        self.models = models
        self._by_slot: dict[tuple, list[StoredModel]] = defaultdict(list)
        for m in models:
            key = m.key
            if key.family == COMM_FAMILY:
                collective = m.meta.get("collective") or self._collective_of(m)
                self._by_slot[(COMM_FAMILY, collective, key.topology)].append(m)
            else:
                self._by_slot[(key.family, key.direction)].append(m)
        self._domains: dict[str, tuple[list[str], np.ndarray, np.ndarray, np.ndarray]] = {}

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

    def _distance(self, model: StoredModel, features: pl.DataFrame) -> np.ndarray:
        """Distance from each row to the nearest training sample of ``model``."""
        from sklearn.neighbors import KDTree

        columns, points, centre, spread = self._domain(model)
        query = (_log_domain(features, columns) - centre) / spread
        points = np.where(np.isfinite(points), points, 0.0)
        missing = ~np.isfinite(query)
        query = np.where(missing, 0.0, query)
        distance, _ = KDTree(points).query(query, k=1)
        # a missing feature counts as far (prefer models the row fully describes); a row missing all
        # of them is beyond every model
        far = np.where(missing.all(axis=1), np.inf, _FAR * missing.sum(axis=1))
        return distance[:, 0] + far

    def _route(self, frame: pl.DataFrame, candidates: list[StoredModel], family: str) -> np.ndarray:
        """Index into ``candidates`` per row of ``frame`` (all of one slot); -1 when a row has none
        of the shape features the models were trained on (it stays uncovered, not guessed)."""
        features = feature_frame(frame, family)
        distances = np.column_stack([self._distance(m, features) for m in candidates])
        choice = np.argmin(distances, axis=1)
        pooled = [j for j, m in enumerate(candidates) if m.key.op == ALL_OPS]
        if pooled:
            # sampled ops without a model of their own take the family's pooled model
            choice[:] = pooled[0]
        described = np.isfinite(distances)
        choice[~described[np.arange(len(choice)), choice]] = -1
        # an operator named like a model's source op (e.g. sampled aten::mm) uses that model
        for column in ("cpu_op_name", "op", "name"):
            if column not in frame.columns:
                continue
            names = frame.get_column(column).cast(pl.Utf8).to_list()
            for j, m in enumerate(candidates):
                hit = np.array([n == m.key.op for n in names], dtype=bool)
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
            choice = self._route(part, candidates, family)
            features = feature_frame(part, family)
            for j, model in enumerate(candidates):
                picked = np.flatnonzero(choice == j)
                if picked.size:
                    out[np.asarray(rows)[picked]] = model.model.predict(features[picked])
        return out
