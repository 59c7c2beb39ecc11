"""What the absorbed slack hides: each rank's dependency-replay error and unexplained share.

Usage: python benchmarks/replay_slack.py [--work DIR] [--decoded RUN_DIR ...] [--skip-workload]

Every shared trace (``../shared/data/traces/{kineto,nsys}``) and the reference workload's PP2, TP2, DP2
and PP2×TP2 runs (the tiny configuration ``tests/test_predict_real.py`` trains; made once in ``--work``
and reused) are ingested into one database in ``--work``. Each run's best iteration is replayed with
measured durations both ways:

- *fitted*: the delay the dependencies cannot explain is absorbed into one in-edge per point (exact);
- *dependency*: only dependencies and nominal lags; its error is what the graph alone misses.

Printed per rank: the dependency replay's iteration error, the *unexplained* share (absorbed slack on
the rank's critical path in the fitted replay, % of the iteration) and where most of it lands. A
prediction changes durations while the absorbed slack stays a fixed lag, so the same share is also
printed for two what-if replays that scale every compute family (every family but ``comm``) by 0.5 and
by 2: the fixed slack's share of a changed iteration. ``--decoded`` adds decoded GPT-NeoX run folders
(their stream gaps are slack by construction).
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
from tracecal.sql.connection import open_database

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
WHAT_IF = (0.5, 2.0)


def shared_traces() -> list[Path]:
    kineto, nsys = TRACES / "kineto", TRACES / "nsys"
    return [kineto / "dlrm_8rank", kineto / "sampled_2_of_128", *sorted((kineto / "single").iterdir()),
            *sorted(nsys.glob("*.sqlite.gz"))]  # fmt: skip


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


def rank_rows(con, run_id: str) -> pl.DataFrame:
    """Per rank: dependency error, unexplained share and where it lands (measured durations), and
    the fixed slack's share of the what-if iterations."""
    stored = load_iteration(con, run_id)
    graph = build_graph(stored.inputs)
    measured = predict_iteration(graph)
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
    rows = it.join(where, on="rank", how="left").select(
        pl.lit(run_id).alias("run"), "rank", "dependency_error_pct", "unexplained_pct", "lands_before"
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
        for decoded in args.decoded:
            if str(decoded) not in known:
                ingest_runs(con, [decoded], IngestOptions(workers=1, cluster="perlmutter"))
        runs = con.execute("SELECT run_id, format = 'gpumodeling25' FROM runs ORDER BY run_id").fetchall()
        table = pl.concat([rank_rows(con, run) for run, _ in runs])
    with pl.Config(tbl_rows=-1, tbl_width_chars=220, fmt_str_lengths=70, tbl_hide_dataframe_shape=True):
        print(table.with_columns(pl.col(pl.Float64).round(3)))
    decoded = [run for run, is_decoded in runs if is_decoded]
    traced = table.filter(~pl.col("run").is_in(decoded))
    print(f"largest |dependency replay error|, traced runs: {traced['dependency_error_pct'].abs().max():.3f} % "
          "(target within 1 %)")  # fmt: skip
    if decoded:
        worst = table.filter(pl.col("run").is_in(decoded))["dependency_error_pct"].abs().max()
        print(f"largest |dependency replay error|, decoded runs (stream gaps are slack by construction): {worst:.3f} %")
    over = traced.filter(pl.max_horizontal(pl.col("^fixed_pct_.*$"), "unexplained_pct") > 1.0)
    print(f"traced ranks whose fixed slack exceeds 1 % of an iteration (measured or what-if): {over.height}")
    for r in over.iter_rows(named=True):
        print(f"  {r['run']} rank {r['rank']}")
    print(f"database: {db}")


if __name__ == "__main__":
    main()
