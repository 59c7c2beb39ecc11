"""Predict a stored run at another parallel layout: rebuild, decode and replay it with the same engine.

A run of a source that can re-lay out its runs (``Source.relayout`` in the registry: a decoded GPT-NeoX
run) is rebuilt by that source (``relayout_source.SourceRelayout``); a traced run of the reference
workload (``tracecal workload run``) by ``relayout_workload.rebuild_workload_at``, as a run folder of
rank traces. The rebuilt iteration is stored in a scratch database the caller makes
(``Session.scratch_database``), decoded there by the same code as an ingest, loaded and replayed like
any stored run (``predict_stored_run``), and summarised: the slowest stage's iteration, the throughput
at the global batch the layout runs, its component split, its idle share, the share of CPU-side gaps
kept as traced, and the operators no model covers at their new shape. The caller's database is only read.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl

from tracecal.errors import PredictionError, RunNotFoundError
from tracecal.predict.components import COMPONENTS
from tracecal.predict.durations import DurationModel
from tracecal.predict.layouts import Layout
from tracecal.predict.relayout_source import LayoutPlan, SourceRelayout
from tracecal.predict.relayout_workload import RUN_JSON, WorkloadRelayout, read_config, rebuild_workload_at
from tracecal.predict.run import Prediction, slack_report
from tracecal.predict.store import predict_stored_run
from tracecal.sources.registry import load, relayout_formats, source_named

COMPONENT_ORDER = (*COMPONENTS, "idle")
"""The components a re-layout reports, in the replay's priority order, idle last."""


@dataclass(frozen=True)
class LayoutPrediction:
    """One run predicted at one layout.

    Attributes:
        run_id: the source run.
        layout: the layout predicted (batch values resolved from the source run).
        iteration_ns: the slowest stage's replayed iteration.
        samples: the global batch of one iteration (DP · micro-batches · micro-batch size).
        components: the slowest stage's split: component, ms, share (of its iteration).
        idle_share: the slowest stage's idle time over its iteration (the pipeline bubble shows there and
            in exposed ``comm_pp``: a receive spans the wait for its sender).
        gap_share: CPU-side gaps kept as traced on its critical path, over its iteration.
        uncovered: operators whose duration no model gave (name, family, share of operator time).
        prediction: the replay.
        relayout: how the run was laid out at the target (layers per stage, partition rule, notes).
    """

    run_id: str
    layout: Layout
    iteration_ns: int
    samples: int
    components: pl.DataFrame
    idle_share: float
    gap_share: float | None
    uncovered: pl.DataFrame
    prediction: Prediction
    relayout: LayoutPlan
    notes: list[str] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        """Samples per second."""
        return self.samples / (self.iteration_ns / 1e9) if self.iteration_ns else 0.0


def _stored_run(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[Path, str]:
    """A stored run's source path and format.

    Raises:
        RunNotFoundError: no such run."""
    row = con.execute("SELECT source_path, format FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        raise RunNotFoundError(f"no run {run_id!r} in the database; ingest it with trace-ingest")
    return Path(row[0]), row[1]


def workload_run_dir(con: duckdb.DuckDBPyConnection, run_id: str) -> Path | None:
    """The folder of a stored traced run of the reference workload (its ``run.json`` says so), else None.

    Raises:
        RunNotFoundError: no such run."""
    folder, _ = _stored_run(con, run_id)
    if not (folder / RUN_JSON).is_file():
        return None
    try:
        read_config(folder)
    except PredictionError:
        return None
    return folder


def source_relayout(con: duckdb.DuckDBPyConnection, run_id: str) -> SourceRelayout | None:
    """A stored run as its source rebuilds it at other layouts (the registry's ``Source.relayout``), or
    None when its source re-lays out no run.

    Raises:
        RunNotFoundError: no such run. PredictionError: its folder is no longer there.
    """
    path, fmt = _stored_run(con, run_id)
    source = source_named(fmt)
    if source.relayout is None:
        return None
    folder = source.stored_run_folder(path)
    if folder is None:
        raise PredictionError(f"run {run_id}: its {fmt} run folder {path} is no longer there; --layout reads it")
    return load(source.relayout)(folder)


def rebuilder(con: duckdb.DuckDBPyConnection, run_id: str) -> SourceRelayout | Path:
    """What rebuilds a stored run at another layout: its source, else (a run of the reference workload)
    its folder.

    Raises:
        RunNotFoundError: no such run. PredictionError: neither, or its folder is no longer there.
    """
    relayout = source_relayout(con, run_id)
    if relayout is not None:
        return relayout
    folder = workload_run_dir(con, run_id)
    if folder is None:
        raise PredictionError(
            f"run {run_id} is a {_stored_run(con, run_id)[1]} trace: --layout rebuilds runs of the reference "
            f"workload (`tracecal workload run`, whose run.json states the model) and runs of "
            f"{', '.join(relayout_formats())}, the frameworks whose schedule and partition are known"
        )
    return folder


def run_layout(con: duckdb.DuckDBPyConnection, run_id: str) -> Layout:
    """The layout a stored run ran at: as its source reads it, or a workload run's run.json."""
    from tracecal.predict.relayout_workload import source_layout as workload_layout

    how = rebuilder(con, run_id)
    return workload_layout(read_config(how)[0]) if isinstance(how, Path) else how.layout


ScratchDatabase = Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]]
"""Makes a fresh, empty tracecal database, removed when its context ends (``Session.scratch_database``)."""


def predict_layout(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    target: Layout,
    *,
    scratch: ScratchDatabase,
    mode: str = "predicted",
    model: DurationModel | None = None,
    gpus: int | None = None,
    replay: str = "fitted",
    work_dir: Path | None = None,
) -> LayoutPrediction:
    """Rebuild ``run_id`` at ``target``, store it in a ``scratch`` database, replay it there (``mode``:
    predicted with ``model``, or measured: the source's durations on the new shapes as the re-layout sets
    them) and summarise it. ``work_dir``: where a rebuilt workload run's traces are written for the while.

    Raises:
        LayoutError: the model cannot run at ``target``. PredictionError, RunNotFoundError: see
        ``rebuilder`` and ``predict_iteration``.
    """
    from tracecal.pipeline.ingest import ingest_folder_run

    how = rebuilder(con, run_id)
    if isinstance(how, Path):
        return _predict_workload_layout(con, run_id, how, target, scratch, mode, model, gpus, replay, work_dir)
    rebuilt = how.rebuild(target, gpus=gpus)
    new_id = f"{run_id}@{rebuilt.plan.layout.text}"
    with scratch() as fresh:
        ingest_folder_run(fresh, new_id, rebuilt.run, _stored_run(con, run_id)[1], rebuilt.folder)
        # one replay: the other one (``compare``) adds nothing a layout comparison reads
        _, pred = predict_stored_run(fresh, new_id, mode=mode, model=model, replay=replay, compare=False)
    return summarise(run_id, rebuilt.plan, pred, rebuilt.run.notes)


def _predict_workload_layout(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    folder: Path,
    target: Layout,
    scratch: ScratchDatabase,
    mode: str,
    model: DurationModel | None,
    gpus: int | None,
    replay: str,
    work_dir: Path | None,
) -> LayoutPrediction:
    """A workload run rebuilt at ``target`` from its best iteration, ingested and replayed in a scratch
    database."""
    from tracecal.pipeline.ingest import IngestOptions, ingest_runs
    from tracecal.predict.relayout_workload import PARTITION_RULE, source_layout, target_config

    cfg = read_config(folder)[0]
    new = target_config(cfg, target, gpus=gpus)
    if (new.pp, new.tp, new.dp, new.micro_batches, new.micro_batch_size) == (
        cfg.pp, cfg.tp, cfg.dp, cfg.micro_batches, cfg.micro_batch_size
    ):  # fmt: skip
        # its own layout: the run as traced, the graph today's predict replays
        _, pred = predict_stored_run(con, run_id, mode=mode, model=model, replay=replay, compare=False)
        own = WorkloadRelayout(
            folder, cfg, source_layout(cfg), source_layout(cfg), [cfg.layers_per_stage] * cfg.pp, PARTITION_RULE,
            ["the run's own layout: its trace is replayed as traced"],
        )  # fmt: skip
        return summarise(run_id, own, pred, own.notes)
    best = con.execute("SELECT iteration FROM best_iteration WHERE run_id = ?", [run_id]).fetchone()
    new_id = f"{run_id}@{target.text}"
    with (
        scratch() as fresh,
        tempfile.TemporaryDirectory(prefix="tracecal-run-", dir=work_dir) as out,
    ):
        plan = rebuild_workload_at(folder, target, Path(out) / new_id, step=best[0] if best else None, gpus=gpus)
        ingest_runs(fresh, [plan.out_dir], IngestOptions(run_id=new_id, workers=1))
        _, pred = predict_stored_run(fresh, new_id, mode=mode, model=model, replay=replay, compare=False)
    return summarise(run_id, plan, pred, plan.notes)


def summarise(run_id: str, plan: LayoutPlan, pred: Prediction, notes: list[str]) -> LayoutPrediction:
    """The iteration, throughput, split, idle and gap shares and uncovered operators of a replay."""
    it = pred.components.filter(pl.col("component") == "iteration").sort("predicted_ns", descending=True)
    slow = it.row(0, named=True)
    rank, span = int(slow["rank"]), int(slow["predicted_ns"])
    comps = (
        pred.components.filter((pl.col("rank") == rank) & pl.col("component").is_in(COMPONENT_ORDER))
        .select("component", (pl.col("predicted_ns") / 1e6).alias("ms"), (pl.col("predicted_ns") / span).alias("share"))
        .with_columns(pl.col("component").replace_strict({c: i for i, c in enumerate(COMPONENT_ORDER)}).alias("_o"))
        .sort("_o")
        .drop("_o")
    )
    idle = comps.filter(pl.col("component") == "idle")["share"]
    gaps = slack_report(pred).filter((pl.col("rank") == rank) & (pl.col("component") == "iteration"))
    gap_pct = gaps["unexplained_pct"][0] if gaps.height else None
    layout = plan.layout
    samples = layout.dp * int(layout.micro_batches or 1) * int(layout.micro_batch_size or 1)
    return LayoutPrediction(
        run_id=run_id,
        layout=layout,
        iteration_ns=span,
        samples=samples,
        components=comps,
        idle_share=float(idle[0]) if idle.len() else 0.0,
        gap_share=None if gap_pct is None else float(gap_pct) / 100.0,
        uncovered=uncovered_operators(pred),
        prediction=pred,
        relayout=plan,
        notes=notes,
    )


def uncovered_operators(pred: Prediction) -> pl.DataFrame:
    """Operators whose replayed duration came from no model, largest first: name, family, and their
    share of all operator time of the replay (``own`` activity and collective nodes)."""
    nodes = pred.graph.nodes
    own = (nodes["duration_role"] == "own") & nodes["node_kind"].is_in(["activity", "collective"])
    frame = pl.DataFrame(
        {
            "name": nodes["name"],
            "family": nodes["family"].fill_null("other"),
            "dur_ns": pl.Series(pred.durations.dur_ns, dtype=pl.Int64),
            "source": pl.Series(pred.durations.source.astype(str), dtype=pl.String),
        }
    ).filter(own)
    total = float(frame["dur_ns"].sum() or 0)
    if total <= 0:
        return pl.DataFrame(schema={"name": pl.String, "family": pl.String, "share": pl.Float64})
    return (
        frame.filter(pl.col("source") != "model")
        .group_by("name", "family")
        .agg((pl.col("dur_ns").sum() / total).alias("share"))
        .sort("share", descending=True)
    )
