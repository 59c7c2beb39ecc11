"""The whole tracecal loop on CUDA GPUs: `tracecal demo --device cuda`, its tables written out.

Usage: python benchmarks/gpu_demo.py [--out DIR] [--device cuda|cpu] [--steps 10] [--repeats 5] [--passes 3]
       [--timing METHOD] [--pp 1] [--tp 1] [--dp 1]

Runs ``tracecal demo --device cuda`` (the reference workload sized to the GPU's memory, one rank per
GPU, under torch.profiler; ingest; compute samples of the run's own shapes timed by their kernels;
calibrate; predict) in ``DIR/demo`` and writes, beside its database:

- ``components.csv``: per rank and component, measured and predicted ms and the error, for both
  replays of the predicted mode and the measured-mode replays (column ``mode``, ``replay``);
- ``components.md``: the predicted mode's table (dependency replay, the demo's score) as markdown;
- ``summary.txt``: device, torch and CUDA versions, the model trained, the GPU-busy share of each
  rank's best iteration and which score is the headline (the iteration when the GPU was busy, else
  the compute components), the overall error of each replay and the compute components, wall time.

``DIR`` defaults to ``$OUT`` when set, else a new temporary directory. Without a CUDA device it stops
with "no CUDA device". ``--device cpu`` runs the same code on the CPU (what CI tests).
``benchmarks/gpu_check.sh`` is the one prepared command around it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from tracecal.api.demo import COMPUTE_COMPONENTS, headline_score
from tracecal.errors import TracecalError
from tracecal.sql.connection import open_database, query_arrow
from tracecal.sql.gpu_busy import GPU_BOUND_SHARE, gpu_busy


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--timing", default=None, help="sample timing method (default: the device's)")
    for name in ("pp", "tp", "dp"):
        parser.add_argument(f"--{name}", type=int, default=1, help="layout: one rank per GPU on CUDA")
    return parser.parse_args(argv)


def environment(device: str) -> list[str]:
    """Torch, CUDA and device names (the GPU's, or 'cpu')."""
    import torch

    name = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else "cpu"
    return [f"device: {name}", f"torch: {torch.__version__}", f"cuda: {torch.version.cuda}"]


def write_tables(db: Path, out: Path) -> list[str]:
    """``components.csv`` and ``components.md`` from the demo's database; returns the summary lines
    (the overall iteration error of each stored replay: the slowest rank's)."""
    with open_database(db, read_only=True) as con:
        comps = pl.from_arrow(
            query_arrow(
                con,
                "SELECT mode, replay, rank, component, measured_ns / 1e6 AS measured_ms, "
                "predicted_ns / 1e6 AS predicted_ms, error_pct, unexplained_ns / 1e6 AS unexplained_ms "
                "FROM components ORDER BY mode, replay, rank, component",
            )
        )
    assert isinstance(comps, pl.DataFrame)
    if comps.height == 0:
        raise TracecalError(f"{db} holds no components: the demo did not reach its predict stage")
    comps.write_csv(out / "components.csv", float_precision=4)
    shown = comps.filter((pl.col("mode") == "predicted") & (pl.col("replay") == "dependency"))
    if shown.height == 0:
        shown = comps.filter(pl.col("mode") == "measured")
    lines = ["| rank | component | measured ms | predicted ms | error % |", "|---|---|---:|---:|---:|"]
    for r in shown.filter((pl.col("measured_ms") > 0) | (pl.col("predicted_ms") > 0)).iter_rows(named=True):
        err = "" if r["error_pct"] is None else f"{r['error_pct']:+.2f}"
        lines.append(f"| {r['rank']} | {r['component']} | {r['measured_ms']:.3f} | {r['predicted_ms']:.3f} | {err} |")
    (out / "components.md").write_text("\n".join(lines) + "\n")
    it = comps.filter(pl.col("component") == "iteration")
    slowest = it.sort("measured_ms", descending=True).group_by("mode", "replay", maintain_order=True).first()
    lines = [
        f"{r['mode']} mode, {r['replay']} replay: overall error {r['error_pct']:+.2f} % "
        f"(rank {r['rank']}: measured {r['measured_ms']:.3f} ms, predicted {r['predicted_ms']:.3f} ms)"
        for r in slowest.sort("mode", "replay").iter_rows(named=True)
    ]
    compute = shown.filter(pl.col("component").is_in(COMPUTE_COMPONENTS) & pl.col("error_pct").is_not_null())
    lines += [
        f"rank {r['rank']} {r['component']}: error {r['error_pct']:+.2f} % "
        f"(measured {r['measured_ms']:.3f} ms, predicted {r['predicted_ms']:.3f} ms)"
        for r in compute.sort("rank", "component").iter_rows(named=True)
    ]
    return lines


def busy_lines(db: Path) -> list[str]:
    """The model trained, each rank's GPU-busy share of the best iteration, and the headline it gives."""
    with open_database(db, read_only=True) as con:
        run_id, model = con.execute("SELECT run_id, model FROM runs ORDER BY run_id LIMIT 1").fetchall()[0]
        slowest = con.execute("SELECT slowest_rank FROM best_iteration WHERE run_id = ?", [run_id]).fetchall()[0][0]
        busy = gpu_busy(con, run_id)
    lines = [f"run: {run_id} (model {model})"]
    if not busy:
        return [*lines, "GPU busy: no GPU activity (a CPU run): the headline is the iteration error"]
    lines += [f"GPU busy rank {b.rank}: {100 * b.busy_share:.1f} % of iteration {b.iteration}" for b in busy]
    score = headline_score({b.rank: b.busy_share for b in busy}.get(slowest, 0.0))
    headline = "the iteration error" if score == "iteration" else "the compute components"
    rule = f"slowest rank {slowest}, GPU-bound at >= {100 * GPU_BOUND_SHARE:.0f} % busy"
    return [*lines, f"headline ({rule}): {headline}"]


def main(argv: list[str] | None = None) -> int:
    from typer.testing import CliRunner

    from tracecal.cli.main import app

    args = parse(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="tracecal-gpu-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    work = out / "demo"
    started = time.perf_counter()
    # one rank per GPU (one by default), whichever the device
    cmd = ["demo", "--device", args.device, "--dir", str(work), "--steps", str(args.steps)]
    cmd += ["--pp", str(args.pp), "--tp", str(args.tp), "--dp", str(args.dp)]
    cmd += ["--repeats", str(args.repeats), "--passes", str(args.passes)]
    if args.timing:
        cmd += ["--timing", args.timing]
    print("tracecal " + " ".join(cmd), flush=True)
    result = CliRunner().invoke(app, cmd)
    print(result.output, flush=True)
    if result.exit_code != 0:
        print(f"tracecal demo failed (exit {result.exit_code})", file=sys.stderr)
        return result.exit_code or 1
    db = work / "demo.duckdb"
    summary = [*environment(args.device), *busy_lines(db), *write_tables(db, out)]
    summary.append(f"wall time: {time.perf_counter() - started:.0f} s")
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary))
    print(f"tables and logs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
