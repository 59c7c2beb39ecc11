"""Replay at scale: a real decoded iteration replicated to 128 ranks × ≥ 20 000 operators per rank.

Usage: python benchmarks/replay_scale.py [--ranks 128] [--ops-per-rank 20000] [--run DIR]

The source is a real multi-rank run (default ``../shared/data/traces/kineto/dlrm_8rank``: 8 V100 ranks,
NCCL all-to-all and all-reduce, 4 streams, 2 CPU threads). Its best iteration is ingested and decoded,
then replicated: in time (the iteration repeated back to back on every rank, each copy with its own
event ids and collective instances) until a rank has ``--ops-per-rank`` operators, and across ranks
(the 8-rank group copied until ``--ranks``). The replicated frames go through the same
``build_graph`` → ``replay`` path as ``tracecal predict``. Printed side by side: graph build, topological
schedule and replay seconds for the original run and the replicated one, and the replay's ratio to the
30 s target (issue 7).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from tracecal.predict.graph import ReplayInputs, build_graph
from tracecal.predict.replay import replay
from tracecal.predict.store import load_iteration
from tracecal.sql.connection import open_database
from tracecal.sql.load import IngestOptions, ingest_runs

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
TARGET_S = 30.0


def replicate(inputs: ReplayInputs, ranks: int, ops_per_rank: int) -> ReplayInputs:
    """Copies of the iteration back to back on each rank, and copies of the rank group."""
    acts, colls, rt, rk = inputs.activities, inputs.collectives, inputs.runtime, inputs.ranks
    n_src = rk.height
    per_rank = acts.group_by("rank").len()["len"].min()
    copies = int(np.ceil(ops_per_rank / per_rank))
    ends = pl.concat(
        [
            acts.select("rank", (pl.col("ts_ns") + pl.col("dur_ns")).alias("t")),
            rt.select("rank", "ts_ns", "dur_ns").select("rank", (pl.col("ts_ns") + pl.col("dur_ns")).alias("t")),
        ]
    )
    starts = pl.concat([acts.select("rank", pl.col("ts_ns").alias("t")), rt.select("rank", pl.col("ts_ns").alias("t"))])
    period = int(ends["t"].max() - starts["t"].min()) + 1_000  # type: ignore[operator]
    id_step = int(max(acts["event_id"].max(), rt["event_id"].max() if rt.height else 0)) + 1  # type: ignore[arg-type]
    match_step = int(colls["match_id"].max() or 0) + 1  # type: ignore[operator]
    groups = int(np.ceil(ranks / n_src))

    def time_copies(frame: pl.DataFrame, shift_cols: list[str], id_cols: list[str]) -> pl.DataFrame:
        k = pl.DataFrame({"_k": np.arange(copies, dtype=np.int64)})
        out = frame.join(k, how="cross")
        return out.with_columns(
            *[pl.col(c) + pl.col("_k") * period for c in shift_cols],
            *[pl.col(c) + pl.col("_k") * id_step for c in id_cols],
            *([pl.col("match_id") + pl.col("_k") * match_step] if "match_id" in frame.columns else []),
        )

    def group_copies(frame: pl.DataFrame, with_match: bool) -> pl.DataFrame:
        g = pl.DataFrame({"_g": np.arange(groups, dtype=np.int64)})
        out = frame.join(g, how="cross").with_columns(
            (pl.col("rank").cast(pl.Int64) + pl.col("_g") * n_src).alias("rank")
        )
        if with_match:
            out = out.with_columns(pl.col("match_id") + pl.col("_g") * match_step * copies)
        return out.filter(pl.col("rank") < ranks).drop("_g")

    acts_r = group_copies(
        time_copies(acts, ["ts_ns", "runtime_ts_ns"], ["event_id", "runtime_event_id"]).drop("_k"), False
    )
    colls_r = group_copies(time_copies(colls, ["ts_ns"], ["event_id"]).drop("_k"), True)
    rt_r = group_copies(time_copies(rt, ["ts_ns"], ["event_id"]).drop("_k"), False)
    rk_r = group_copies(rk.with_columns(pl.col("window_end_ns") + (copies - 1) * period), False)
    return ReplayInputs(acts_r, colls_r, rt_r, rk_r)


def timed(inputs: ReplayInputs) -> dict[str, float]:
    """Wall and CPU (process) seconds of each stage: on a shared machine the CPU time is what the
    stage costs, the wall time what it took while other processes competed for the cores."""
    marks = [(time.perf_counter(), time.process_time())]
    graph = build_graph(inputs)
    marks.append((time.perf_counter(), time.process_time()))
    _ = graph.schedule
    marks.append((time.perf_counter(), time.process_time()))
    times = replay(graph)
    marks.append((time.perf_counter(), time.process_time()))
    durations = graph.nodes["dur_ns"].to_numpy() // 2  # a what-if replay: every duration halved
    replay(graph, durations)
    marks.append((time.perf_counter(), time.process_time()))
    if not np.array_equal(times, graph.measured_times):
        raise SystemExit("measured replay did not reproduce the trace")
    out = {
        "ranks": float(inputs.ranks.height),
        "operators": float(inputs.activities.height),
        "ops_per_rank": inputs.activities.height / inputs.ranks.height,
        "nodes": float(graph.nodes.height),
        "edges": float(graph.src.size),
        "levels": float(graph.schedule.level_bounds.size - 1),
    }
    for i, stage in enumerate(("build", "schedule", "replay", "replay_halved")):
        out[f"{stage}_s"] = marks[i + 1][0] - marks[i][0]
        out[f"{stage}_cpu_s"] = marks[i + 1][1] - marks[i][1]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=SHARED / "kineto" / "dlrm_8rank")
    parser.add_argument("--ranks", type=int, default=128)
    parser.add_argument("--ops-per-rank", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, open_database(Path(tmp) / "b.duckdb") as con:
        ingest_runs(con, [args.run], IngestOptions(workers=1))
        stored = load_iteration(con, args.run.name)
    small = timed(stored.inputs)
    big_inputs = replicate(stored.inputs, args.ranks, args.ops_per_rank)
    big = timed(big_inputs)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}")
    print(f"source: {args.run.name} iteration {stored.iteration}")
    print(f"{'':22}{'original':>14}{'replicated':>14}{'ratio':>10}")
    for key in ("ranks", "operators", "ops_per_rank", "nodes", "edges", "levels"):
        print(f"{key:22}{small[key]:>14,.0f}{big[key]:>14,.0f}{big[key] / small[key]:>10.1f}")
    for stage in ("build", "schedule", "replay", "replay_halved"):
        for key in (f"{stage}_s", f"{stage}_cpu_s"):
            print(f"{key:22}{small[key]:>14.3f}{big[key]:>14.3f}{big[key] / max(small[key], 1e-9):>10.1f}")
    for kind in ("s", "cpu_s"):
        total = big[f"schedule_{kind}"] + big[f"replay_{kind}"]
        label = "wall" if kind == "s" else "CPU"
        print(
            f"{label}: replay of {big['ranks']:.0f} ranks x {big['ops_per_rank']:,.0f} operators (schedule + replay) "
            f"{total:.1f} s = {total / TARGET_S:.2f} x the {TARGET_S:.0f} s target; graph build "
            f"{big[f'build_{kind}']:.1f} s; each further what-if replay {big[f'replay_halved_{kind}']:.1f} s"
        )


if __name__ == "__main__":
    main()
