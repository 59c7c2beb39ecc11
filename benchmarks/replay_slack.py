"""What the absorbed slack hides: each rank's fitted and dependency-replay error and unexplained share.

Usage: python benchmarks/replay_slack.py [--work DIR] [--decoded RUN_DIR ...] [--published] [--skip-workload]

Every shared trace (``../shared/data/traces/{kineto,nsys}``, the H200 GPU traces in
``../shared/data/gpu/h200``) and the reference workload's PP2, TP2, DP2 and PP2×TP2 runs (the tiny
configuration ``tests/test_predict_real.py`` trains; made once in ``--work`` and reused) are ingested
into one database in ``--work``. Each run's best iteration is replayed with measured durations both
ways:

- *fitted*: the delay the dependencies cannot explain is absorbed into one in-edge per point (exact);
- *dependency*: only dependencies and nominal lags; its error is what the graph alone misses.

Printed per rank: the fitted replay's iteration error (0 on traced runs by construction; a decoded run's
stage ranks are measured by their position's published ``train_batch``), the dependency replay's
iteration error, the *unexplained* share (absorbed slack on
the rank's critical path in the fitted replay, % of the iteration) and where most of it lands. A
prediction changes durations while the absorbed slack stays a fixed lag, so the same share is also
printed for two what-if replays that scale every compute family (every family but ``comm``) by 0.5 and
by 2: the fixed slack's share of a changed iteration. ``--decoded`` adds decoded GPT-NeoX run folders,
``--published`` all of ``../shared/data/gpumodeling25/runs/perlmutter`` (targets per stage rank: fitted
within 1 %, dependency within 2 %, unexplained at most 1 %).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import polars as pl

from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.predict.graph import build_graph
from tracecal.predict.run import predict_iteration, slack_report
from tracecal.predict.slack import landing
from tracecal.predict.store import load_iteration
from tracecal.sources.gpumodeling25.validate.published_runs import with_published_iteration
from tracecal.sql.connection import open_database

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TRACES = DATA / "traces"
PUBLISHED = DATA / "gpumodeling25" / "runs" / "perlmutter"
WHAT_IF = (0.5, 2.0)


def shared_traces() -> list[Path]:
    kineto, nsys, h200 = TRACES / "kineto", TRACES / "nsys", DATA / "gpu" / "h200"
    return [kineto / "dlrm_8rank", kineto / "sampled_2_of_128", *sorted((kineto / "single").iterdir()),
            *sorted(nsys.glob("*.sqlite.gz")), h200 / "gpt_h2048_l8_bf16", h200 / "demo_tiny"]  # fmt: skip


def workload_runs(work: Path) -> list[Path]:
    """The test suite's four tiny layouts, trained into ``work`` unless already there."""
    from tracecal.workload import TINY_LAYOUTS, run_local

    layouts = TINY_LAYOUTS
    out = []
    for name, cfg in layouts.items():
        run_dir = work / f"gpt_tiny_{name}"
        if not (run_dir / "run.json").exists():
            run_local(cfg, run_dir)
        out.append(run_dir)
    return out


def rank_rows(con, run_id: str, decoded: bool) -> pl.DataFrame:
    """Per rank: fitted and dependency error, unexplained share and where it lands (measured
    durations), and the fixed slack's share of the what-if iterations."""
    stored = load_iteration(con, run_id)
    graph = build_graph(stored.inputs)
    measured = predict_iteration(graph)
    if decoded:  # scored against the published train_batch of each stage's position
        measured = with_published_iteration(con, run_id, measured)
    it = slack_report(measured).filter(pl.col("component") == "iteration")
    span = measured.iteration_error().select("rank", "predicted_ns")
    where = (
        landing(measured.unexplained, top=2)
        .join(span, on="rank")
        .group_by("rank", maintain_order=True)
        .agg(
            pl.format("{} {}%", "what", (100 * pl.col("unexplained_ns") / pl.col("predicted_ns")).round(2))
            .str.join(", ")
            .alias("lands_before")
        )
    )
    fitted = measured.iteration_error().select("rank", pl.col("error_pct").alias("fitted_error_pct"))
    rows = (
        it.join(fitted, on="rank", how="left")
        .join(where, on="rank", how="left")
        .select(
            pl.lit(run_id).alias("run"),
            "rank",
            "fitted_error_pct",
            "dependency_error_pct",
            "unexplained_pct",
            "lands_before",
        )
    )
    families = graph.nodes.filter(pl.col("duration_role") == "own")["family"].fill_null("other").unique().to_list()
    compute = [f for f in families if f != "comm"]
    for factor in WHAT_IF:
        if not compute:
            rows = rows.with_columns(pl.lit(None, pl.Float64).alias(f"fixed_pct_x{factor:g}"))
            continue
        what_if = predict_iteration(graph, mode="scaled", scale=dict.fromkeys(compute, factor))
        share = slack_report(what_if).filter(pl.col("component") == "iteration")
        rows = rows.join(
            share.select("rank", pl.col("unexplained_pct").alias(f"fixed_pct_x{factor:g}")), on="rank", how="left"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="directory for the workload runs and the database")
    parser.add_argument("--decoded", type=Path, nargs="*", default=[], help="decoded GPT-NeoX run folders")
    parser.add_argument("--published", action="store_true", help="add every published Perlmutter decoded run")
    parser.add_argument("--skip-workload", action="store_true", help="only the shared traces (and --decoded)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="replay-slack-"))
    work.mkdir(parents=True, exist_ok=True)
    db = work / "slack.duckdb"
    sources = shared_traces() + ([] if args.skip_workload else workload_runs(work))
    with open_database(db) as con:
        known = {r[0] for r in con.execute("SELECT source_path FROM runs").fetchall()}
        todo = [p for p in sources if str(p) not in known]
        if todo:
            ingest_runs(con, todo, IngestOptions(workers=1))
        for decoded in [
            *args.decoded,
            *(sorted(p for p in PUBLISHED.iterdir() if p.is_dir()) if args.published else []),
        ]:
            if str(decoded) not in known:
                ingest_runs(con, [decoded], IngestOptions(workers=1, cluster="perlmutter"))
        runs = con.execute("SELECT run_id, format = 'gpumodeling25' FROM runs ORDER BY run_id").fetchall()
        table = pl.concat([rank_rows(con, run, is_decoded) for run, is_decoded in runs])
    with pl.Config(tbl_rows=-1, tbl_width_chars=220, fmt_str_lengths=70, tbl_hide_dataframe_shape=True):
        print(table.with_columns(pl.col(pl.Float64).round(3)))
    decoded = [run for run, is_decoded in runs if is_decoded]
    traced = table.filter(~pl.col("run").is_in(decoded))
    print(f"largest |dependency replay error|, traced runs: {traced['dependency_error_pct'].abs().max():.3f} % "
          "(target within 1 %)")  # fmt: skip
    print(f"largest unexplained share, traced runs: {traced['unexplained_pct'].max():.3f} % (target at most 1 %)")
    if decoded:
        stages = table.filter(pl.col("run").is_in(decoded))
        for column, limit in (("fitted_error_pct", 1.0), ("dependency_error_pct", 2.0), ("unexplained_pct", 1.0)):
            values = stages[column].abs() if column != "unexplained_pct" else stages[column]
            print(f"decoded stage ranks, {column}: largest {values.max():.3f} %, {int((values <= limit).sum())} of "
                  f"{stages.height} within {limit:g} %")  # fmt: skip
    over = traced.filter(pl.max_horizontal(pl.col("^fixed_pct_.*$"), "unexplained_pct") > 1.0)
    print(f"traced ranks whose fixed slack exceeds 1 % of an iteration (measured or what-if): {over.height}")
    for r in over.iter_rows(named=True):
        print(f"  {r['run']} rank {r['rank']}")
    print(f"database: {db}")


if __name__ == "__main__":
    main()
