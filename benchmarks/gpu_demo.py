"""The whole tracecal loop on one CUDA GPU: `tracecal demo --device cuda`, its tables written out.

Usage: python benchmarks/gpu_demo.py [--out DIR] [--device cuda|cpu] [--steps 10] [--repeats 5] [--passes 3]

Runs ``tracecal demo --device cuda`` (the reference workload as one rank on the GPU under
torch.profiler, ingest, compute samples of the run's own shapes timed with CUDA events, calibrate,
predict) in ``DIR/demo`` and writes, beside its database:

- ``components.csv``: per rank and component, measured and predicted ms and the error, for both
  replays of the predicted mode and the measured-mode replays (column ``mode``, ``replay``);
- ``components.md``: the predicted mode's table (dependency replay, the demo's score) as markdown;
- ``summary.txt``: device, torch and CUDA versions, the overall error of each replay, stage times.

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

from tracecal.errors import TracecalError
from tracecal.sql.connection import open_database, query_arrow


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--passes", type=int, default=3)
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
    return [
        f"{r['mode']} mode, {r['replay']} replay: overall error {r['error_pct']:+.2f} % "
        f"(rank {r['rank']}: measured {r['measured_ms']:.3f} ms, predicted {r['predicted_ms']:.3f} ms)"
        for r in slowest.sort("mode", "replay").iter_rows(named=True)
    ]


def main(argv: list[str] | None = None) -> int:
    from typer.testing import CliRunner

    from tracecal.cli.main import app

    args = parse(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="tracecal-gpu-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    work = out / "demo"
    started = time.perf_counter()
    # one rank, as on a single GPU, whichever the device
    cmd = ["demo", "--device", args.device, "--pp", "1", "--dir", str(work), "--steps", str(args.steps)]
    cmd += ["--repeats", str(args.repeats), "--passes", str(args.passes)]
    print("tracecal " + " ".join(cmd), flush=True)
    result = CliRunner().invoke(app, cmd)
    print(result.output, flush=True)
    if result.exit_code != 0:
        print(f"tracecal demo failed (exit {result.exit_code})", file=sys.stderr)
        return result.exit_code or 1
    summary = [*environment(args.device), *write_tables(work / "demo.duckdb", out)]
    summary.append(f"wall time: {time.perf_counter() - started:.0f} s")
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary))
    print(f"tables and logs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
