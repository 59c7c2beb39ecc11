"""Cost of the error attribution on the published Perlmutter runs, side by side in one run.

For every decoded run of a database that has them and a calibrated cluster (``python
benchmarks/published_runs.py --keep DIR`` makes one), prints: the graph size, the predicted replay
(``predict_iteration`` with the cluster's models, both replays), the family replays the attribution
needs run in one pass (``attribution.replay_many``) and one after another (``replay.replay``, what a
plain loop would cost), and the Table 9 cells of every replay (``published_attribution``).

Usage::

    python benchmarks/attribution.py --db DIR/published.duckdb [--cluster perlmutter]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import polars as pl

from tracecal.calibrate import load
from tracecal.config import model_store_dir
from tracecal.predict import attribution as at
from tracecal.predict.replay import replay
from tracecal.sources.gpumodeling25.validate.attribution import published_attribution
from tracecal.sources.gpumodeling25.validate.module_times import module_members
from tracecal.sources.gpumodeling25.validate.published_runs import traced_ranks, validate_decoded_run
from tracecal.sql.connection import open_database


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--cluster", default="perlmutter")
    args = parser.parse_args()
    rows = []
    with open_database(args.db) as con:
        model = load(args.cluster, con, store_dir=model_store_dir(args.db))
        runs = [
            r[0] for r in con.execute("SELECT run_id FROM runs WHERE format = 'gpumodeling25' ORDER BY 1").fetchall()
        ]
        for run in runs:
            t0 = time.perf_counter()
            v = validate_decoded_run(con, run, mode="predicted", model=model)
            t1 = time.perf_counter()
            replays = at.family_replays(v.prediction)
            t2 = time.perf_counter()
            graph = v.prediction.graph
            columns = at.family_durations(v.prediction, replays.families)
            t3 = time.perf_counter()
            for j in range(columns.shape[1]):  # the same replays, one at a time
                replay(graph, columns[:, j], v.prediction.replay)
            t4 = time.perf_counter()
            members = module_members(con, run, v.stored.iteration)
            published_attribution(v.prediction, members, traced_ranks(con, run), v.components, replays)
            t5 = time.perf_counter()
            rows.append(
                {
                    "run": run,
                    "ranks": graph.nodes["rank"].n_unique(),
                    "nodes": graph.nodes.height,
                    "edges": graph.src.size,
                    "families": len(replays.families),
                    "validate_s": t1 - t0,
                    "replays_one_pass_s": t2 - t1,
                    "replays_one_by_one_s": t4 - t3,
                    "one_by_one_over_one_pass": (t4 - t3) / (t2 - t1),
                    "cells_s": t5 - t4,
                    "attribution_over_validate": (t2 - t1 + t5 - t4) / (t1 - t0),
                }
            )
    with pl.Config(tbl_rows=20, tbl_cols=20, tbl_width_chars=250, float_precision=2, tbl_hide_dataframe_shape=True):
        print(pl.DataFrame(rows))


if __name__ == "__main__":
    main()
