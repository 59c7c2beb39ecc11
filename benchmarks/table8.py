"""Table 8 of GPUModeling25 (iteration time over the profiled iterations) recomputed against the published one.

For every decoded run ``<runs>/<cluster>/<RUN>/<JOB>/`` with a GPT-NeoX ``*.log``: our Table 8 row
(`iteration_statistics`: the log's rank-0 per-iteration times for the profiled iterations, else the
``train_batch`` rows of ``module_times_{average,min}.csv``), the published row, and the differences;
then min and mean from the module-time tables alone (the traces the published figures come from).
The published label of a run is its folder name plus ``_`` and the cluster folder's initial, upper-cased.
Target: every figure we have within 0.05 s. Usage::

    python benchmarks/table8.py [--runs ../shared/data/gpumodeling25/runs/perlmutter]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from tracecal.sources.gpumodeling25.read.neox_log import iteration_statistics, parse_neox_log
from tracecal.sources.gpumodeling25.read.tables import read_module_times, train_batch_us

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "gpumodeling25"
TOLERANCE_S = 0.05
FIGURES = (("min_s", "min"), ("max_s", "max"), ("mean_s", "average"), ("std_s", "std"))


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=DATA / "runs" / "perlmutter", help="a cluster folder of runs")
    parser.add_argument("--published", type=Path, default=DATA / "published" / "iteration_statistics.csv")
    opts = parser.parse_args()
    with opts.published.open() as handle:
        published = {row["model"]: row for row in csv.DictReader(handle)}
    suffix = "_" + opts.runs.resolve().name[:1].upper()

    print(
        "| run | iterations | source | min ours / pub (Δ) | max ours / pub (Δ) | mean ours / pub (Δ) | "
        "std ours / pub (Δ) | (mean−min)/min % ours / pub | module times: min, mean (Δ) | missing |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    compared = 0
    for job in sorted(p for p in opts.runs.glob("*/*/") if any(p.glob("*.log"))):
        label = job.parent.name + suffix
        pub = published.get(label)
        log = parse_neox_log(next(job.glob("*.log")))
        tables = {t: read_module_times(job / f"module_times_{t}.csv") for t in ("average", "min")}
        t8 = iteration_statistics(log, train_batch_us(tables))
        trace = iteration_statistics(None, train_batch_us(tables))
        cells = []
        for ours, theirs in FIGURES:
            theirs_v = None if pub is None else float(pub[theirs])
            if t8[ours] is None or theirs_v is None:
                cells.append(f"{_fmt(t8[ours])} / {_fmt(theirs_v)}")
                continue
            delta = t8[ours] - theirs_v
            worst = max(worst, abs(delta))
            compared += 1
            cells.append(f"{_fmt(t8[ours])} / {_fmt(theirs_v)} ({delta:+.3f})")
        pct_pub = None if pub is None else float(pub["error of average to min"])
        trace_delta = (
            ""
            if pub is None or trace["min_s"] is None
            else f" ({trace['min_s'] - float(pub['min']):+.3f}, {trace['mean_s'] - float(pub['average']):+.3f})"
        )
        sources = sorted({s.split(":")[0] for s in t8["source"].values() if ":" in s})
        its = t8["iterations"]
        print(
            f"| {label} | {'' if not its else f'{its[0]}–{its[-1]}'} | {', '.join(sources)} | {' | '.join(cells)} | "
            f"{_fmt(t8['mean_vs_min_pct'], 4)} / {_fmt(pct_pub, 4)} | "
            f"{_fmt(trace['min_s'])}, {_fmt(trace['mean_s'])}{trace_delta} | {', '.join(t8['missing']) or '—'} |"
        )
    verdict = "met" if worst <= TOLERANCE_S else "NOT met"
    print(
        f"\n{compared} figures compared; largest |ours − published| = {worst:.3f} s "
        f"(target ≤ {TOLERANCE_S} s: {verdict})"
    )
    return 0 if worst <= TOLERANCE_S else 1


if __name__ == "__main__":
    sys.exit(main())
