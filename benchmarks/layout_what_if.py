"""Layout what-if, checked against real runs: every run of a model predicted at the layout of every
other run of the same model, against that run's measured ``train_batch``.

In a fresh database (or ``--db``, reused when it already holds the runs and the cluster's models):
import the cluster's compute and NCCL samples, ``trace-ingest`` the decoded runs, ``calibrate``. Runs
are grouped by model (layers, hidden size, heads, sequence length from their logs: nothing is named).
For each ordered pair (source, target) of layouts of one model it prints:

* ``predicted`` — the target's iteration rebuilt from the source's trace at the target's layout
  (``tracecal predict SOURCE --layout PPxTPxDP``, the target's micro-batches), replayed with the
  cluster's models;
* ``floor`` — the target predicted from its own trace (``tracecal predict TARGET --cluster C``);
* the errors of both against the target's measured ``train_batch`` (the published best iteration's,
  its slowest traced stage), and the throughputs the search ranks layouts by.

Then ``tracecal search`` on each run at its own GPU count, and whether it ranks the measured layouts of
that count in their measured order of throughput.

With ``--workload DIR`` it does the same for the reference workload on this machine's CPU instead:
it trains the workload at 1·1·1, 2·1·1, 1·2·1 and 1·1·2 (back to back, one thread per rank, so load
from other jobs hits them alike), ingests them, samples their operator shapes and the gloo
collectives on this machine, calibrates a ``local`` cluster, and predicts PP2, TP2 and DP2 from PP1
and PP1 from each, every prediction beside its floor (the target predicted from its own trace) and
the re-layout alone (``traced``: the source's traced durations at the new shapes, no model).

Usage::

    python benchmarks/layout_what_if.py [--runs DIR] [--samples DIR ...] [--cluster NAME] [--db PATH]
    python benchmarks/layout_what_if.py --workload /tmp/layout-workload/bench [--db PATH]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "gpumodeling25"
BIN = Path(sys.executable).parent


def cli(*args: str, db: Path) -> str:
    done = subprocess.run([*args, "--db", str(db)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def prepare(db: Path, runs: list[Path], samples: list[Path], cluster: str) -> None:
    """Samples, runs and models in ``db`` (steps already done are skipped)."""
    import duckdb

    have_runs: set[str] = set()
    have_models = False
    if db.exists():
        with duckdb.connect(str(db), read_only=True) as con:
            have_runs = {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()}
            have_models = bool(con.execute("SELECT count(*) FROM models WHERE cluster = ?", [cluster]).fetchone()[0])
    if not have_models:
        for folder in samples:
            cli(str(BIN / "tracecal"), "samples", "import", str(folder), "--cluster", cluster,
                "--format", "gpumodeling25", db=db)  # fmt: skip
    missing = [r for r in runs if r.name not in have_runs]
    if missing:
        cli(str(BIN / "trace-ingest"), *map(str, missing), "--cluster", cluster, db=db)
    if not have_models:
        cli(str(BIN / "calibrate"), "--cluster", cluster, db=db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=DATA / "runs" / "perlmutter", help="folder of decoded runs")
    parser.add_argument(
        "--samples",
        type=Path,
        nargs="+",
        default=[DATA / "samples" / "perlmutter_a100_compute", DATA / "samples" / "perlmutter_a100_nccl"],
    )
    parser.add_argument("--cluster", help="cluster name for the samples (default: the runs folder's name)")
    parser.add_argument("--db", type=Path, help="database to use and keep (default: a temporary one)")
    parser.add_argument("--no-search", action="store_true", help="skip tracecal search")
    parser.add_argument(
        "--workload", type=Path, help="train, sample and predict the reference workload's CPU runs here"
    )
    args = parser.parse_args()
    if args.workload is not None:
        workload_main(args.workload, args.db)
        return
    cluster = args.cluster or args.runs.name
    work = Path(tempfile.mkdtemp(prefix="tracecal-layout-"))
    db = args.db or work / "layout.duckdb"
    try:
        started = time.perf_counter()
        runs = sorted(p for p in args.runs.iterdir() if p.is_dir())
        prepare(db, runs, args.samples, cluster)
        prepared_s = time.perf_counter() - started
        rows, searches = evaluate(db, cluster, [r.name for r in runs], search=not args.no_search)
        show(rows, searches)
        print(f"\ntimes: prepare {prepared_s:.0f} s, all {time.perf_counter() - started:.0f} s")
    finally:
        if args.db is None:
            shutil.rmtree(work, ignore_errors=True)


def _samples(layout) -> int:
    return layout.dp * int(layout.micro_batches or 1) * int(layout.micro_batch_size or 1)


def _model_key(run) -> tuple:
    """The model of a run its source re-lays out (``relayout_source.SourceRelayout``)."""
    return (run.facts.layers, run.dims.hidden, run.dims.heads, run.dims.seq)


def evaluate(db: Path, cluster: str, run_ids: list[str], *, search: bool) -> tuple[pl.DataFrame, list]:
    from tracecal.api import Session
    from tracecal.calibrate import load
    from tracecal.config import model_store_dir
    from tracecal.predict.relayout_run import predict_layout, run_layout, source_relayout
    from tracecal.predict.search import device_memory_bytes, search_run
    from tracecal.predict.store import predict_stored_run
    from tracecal.sources.gpumodeling25.validate.published_runs import with_published_iteration
    from tracecal.sql.connection import open_database

    rows, searches = [], []
    scratch = Session(db).scratch_database
    with open_database(db) as con:
        model = load(cluster, con, store_dir=model_store_dir(db))
        groups: dict[tuple, list[str]] = {}
        for run_id in run_ids:
            groups.setdefault(_model_key(source_relayout(con, run_id)), []).append(run_id)
        measured, floor, layouts = {}, {}, {}
        for run_id in run_ids:
            _, own = predict_stored_run(con, run_id, mode="predicted", model=model)
            it = with_published_iteration(con, run_id, own).iteration_error()
            measured[run_id] = int(it["measured_ns"].max())
            floor[run_id] = int(it["predicted_ns"].max())
            layouts[run_id] = run_layout(con, run_id)
        for members in groups.values():
            for src, tgt in itertools.permutations(members, 2):
                lay = layouts[tgt]
                t0 = time.perf_counter()
                pred = predict_layout(con, src, lay, scratch=scratch, mode="predicted", model=model)
                seconds = time.perf_counter() - t0
                m = measured[tgt]
                rows.append(
                    {
                        "source": src,
                        "target": tgt,
                        "layout": lay.text,
                        "measured_s": m / 1e9,
                        "predicted_s": pred.iteration_ns / 1e9,
                        "error_pct": 100 * (pred.iteration_ns - m) / m,
                        "floor_error_pct": 100 * (floor[tgt] - m) / m,
                        "measured_per_s": pred.samples / (m / 1e9),
                        "predicted_per_s": pred.throughput,
                        "uncovered_pct": 100 * float(pred.uncovered["share"].sum()),
                        "gap_pct": None if pred.gap_share is None else 100 * pred.gap_share,
                        "seconds": seconds,
                    }
                )
                print(f"{src} -> {lay.text}: {rows[-1]['error_pct']:+.2f} % ({seconds:.0f} s)", file=sys.stderr)
        if search:
            by_gpus: dict[tuple, list[str]] = {}
            for key, members in groups.items():
                for r in members:
                    by_gpus.setdefault((key, layouts[r].world_size), []).append(r)
            for (_, gpus), members in by_gpus.items():
                if len(members) < 2:
                    continue
                per_s = {r: _samples(layouts[r]) / (measured[r] / 1e9) for r in members}
                order = [layouts[r].text for r in sorted(members, key=lambda r: -per_s[r])]
                src = members[0]
                t0 = time.perf_counter()
                memory, _ = device_memory_bytes(con, cluster)
                res = search_run(con, src, gpus, scratch=scratch, model=model, memory_bytes=memory)
                searches.append((src, gpus, res, order, time.perf_counter() - t0))
    return pl.DataFrame(rows), searches


def show(rows: pl.DataFrame, searches: list) -> None:
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=220, float_precision=2, tbl_hide_dataframe_shape=True):
        print("\n## cross-layout predictions (predicted mode) against the target's measured train_batch\n")
        print(rows)
        if rows.height:
            err = rows["error_pct"].abs()
            print(
                f"\n|error| mean {err.mean():.2f} %, max {err.max():.2f} %; within 6 %: "
                f"{int((err <= 6).sum())} of {rows.height}; "
                f"floor |error| mean {rows['floor_error_pct'].abs().mean():.2f} %"
            )
        for src, gpus, res, order, seconds in searches:
            print(f"\n## tracecal search {src} --gpus {gpus} ({seconds:.0f} s)\n")
            print(res.table.select("rank", "layout", "global_batch", "iteration_ms", "samples_per_s", "idle_share"))
            for r in res.rejected:
                print(f"left out: {r.reason}")
            ranked = [x for x in res.table["layout"].to_list() if x in order]
            verdict = "the same order" if ranked == order else "another order"
            print(f"measured throughput order {', '.join(order)}; search ranks them {', '.join(ranked)}: {verdict}")


WORKLOAD_LAYOUTS = {"pp1": (1, 1, 1), "pp2": (2, 1, 1), "tp2": (1, 2, 1), "dp2": (1, 1, 2)}
"""The runs the workload part trains; PP2, TP2 and DP2 are predicted from PP1 and PP1 from each."""
WORKLOAD_MODEL = dict(layers=2, hidden=384, heads=6, seq=128, vocab=1000, micro_batches=4, micro_batch_size=2)
"""Big enough that operators, not Python between them, take most of a step; no size of it is both a
tensor-parallel split and an unsplit size (so every shape re-derives unambiguously); minutes on 2 cores."""
LOCAL = "local"


def workload_main(folder: Path, db: Path | None) -> None:
    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    db = db or folder / "layout.duckdb"
    runs = train_workload(folder)
    trained_s = time.perf_counter() - started
    prepare_workload(db, runs)
    prepared_s = time.perf_counter() - started - trained_s
    rows = evaluate_workload(db, [r.name for r in runs])
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=220, float_precision=2, tbl_hide_dataframe_shape=True):
        print(
            "\n## workload cross-layout predictions (predicted mode, cluster local) against the target's measured "
            "best iteration (its slowest rank)\n"
        )
        print(rows)
    err = rows["error_pct"].abs()
    print(
        f"\n|error| mean {err.mean():.2f} %, max {err.max():.2f} %; within 10 %: {int((err <= 10).sum())} of "
        f"{rows.height}; floor |error| mean {rows['floor_error_pct'].abs().mean():.2f} %"
    )
    load = " ".join(f"{x:.1f}" for x in __import__("os").getloadavg())
    print(f"\ntimes: train {trained_s:.0f} s, prepare {prepared_s:.0f} s, all {time.perf_counter() - started:.0f} s; "
          f"load average now {load}")  # fmt: skip


def train_workload(folder: Path) -> list[Path]:
    """The four runs, trained back to back (kept when already there)."""
    from dataclasses import replace

    from tracecal.workload import WorkloadConfig, run_local

    base = WorkloadConfig(**WORKLOAD_MODEL, steps=6, threads=1, timeout_s=600)
    out = []
    for name, (pp, tp, dp) in WORKLOAD_LAYOUTS.items():
        run_dir = folder / f"gpt_{name}"
        if not (run_dir / "run.json").exists():
            t0 = time.perf_counter()
            run_local(replace(base, pp=pp, tp=tp, dp=dp), run_dir, force=True)
            print(f"trained {run_dir.name} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        out.append(run_dir)
    return out


def prepare_workload(db: Path, runs: list[Path]) -> None:
    """Ingest, sample every run's operator shapes (and their neighbours) and the gloo collectives on
    this machine, calibrate the ``local`` cluster (steps already done are skipped)."""
    import duckdb

    from tracecal.api import Session
    from tracecal.pipeline.ingest import IngestOptions, ingest_runs
    from tracecal.samplers.compute import sample_compute
    from tracecal.samplers.from_run import run_points
    from tracecal.samplers.plan import neighbourhood, run_settings
    from tracecal.sql.connection import open_database

    have: set[str] = set()
    sampled = False
    if db.exists():
        with duckdb.connect(str(db), read_only=True) as con:
            have = {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()}
            sampled = bool(con.execute("SELECT count(*) FROM models WHERE cluster = ?", [LOCAL]).fetchone()[0])
    with open_database(db) as con:
        missing = [r for r in runs if r.name not in have]
        if missing:
            ingest_runs(con, missing, IngestOptions(cluster=LOCAL, workers=2))
        if sampled:
            return
        points: dict = {}
        params: dict = {}
        for run in runs:
            plan = run_points(con, run.name, None)
            for p in neighbourhood(plan.points):
                points.setdefault(p, None)
                params.setdefault(p, plan.params_for(p))
        t0 = time.perf_counter()
        # two samplers at once: the two ranks of the 2-rank runs competed for the 2 cores the same way
        settings = run_settings(LOCAL, "cpu", runs[0].name, 2, 2, 2)
        report = sample_compute(con, list(points), settings, extra_params=lambda p: params.get(p) or {})
        print(f"sampled {report.written} compute points in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    t0 = time.perf_counter()
    cli(str(BIN / "tracecal"), "samples", "measure", "comm", "--cluster", LOCAL, "--world-size", "2",
        "--sizes", "4K,16K,64K,256K,1M,4M,16M", "--collectives", "all_reduce,send", "--repeats", "10",
        db=db)  # fmt: skip
    print(f"sampled gloo collectives in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    Session(db).calibrate(LOCAL, folds=2)


def evaluate_workload(db: Path, run_ids: list[str]) -> pl.DataFrame:
    from tracecal.api import Session
    from tracecal.calibrate import load
    from tracecal.config import model_store_dir
    from tracecal.predict.relayout_run import predict_layout, run_layout
    from tracecal.predict.store import predict_stored_run
    from tracecal.sql.connection import open_database

    rows = []
    scratch = Session(db).scratch_database
    with open_database(db) as con:
        model = load(LOCAL, con, store_dir=model_store_dir(db))
        measured, floor, layouts = {}, {}, {}
        for run_id in run_ids:
            _, own = predict_stored_run(con, run_id, mode="predicted", model=model)
            it = own.iteration_error()
            slow = it.sort("measured_ns", descending=True).row(0, named=True)
            measured[run_id], floor[run_id] = int(slow["measured_ns"]), int(slow["predicted_ns"])
            layouts[run_id] = run_layout(con, run_id)
        base = run_ids[0]
        for src, tgt in [(base, r) for r in run_ids[1:]] + [(r, base) for r in run_ids[1:]]:
            lay = layouts[tgt]
            t0 = time.perf_counter()
            pred = predict_layout(con, src, lay, scratch=scratch, mode="predicted", model=model)
            seconds = time.perf_counter() - t0
            # the re-layout alone: the source's traced durations on the new shapes (work ratio), no model
            traced = predict_layout(con, src, lay, scratch=scratch, mode="measured")
            m = measured[tgt]
            rows.append(
                {
                    "source": src,
                    "target": tgt,
                    "layout": lay.text,
                    "measured_ms": m / 1e6,
                    "predicted_ms": pred.iteration_ns / 1e6,
                    "error_pct": 100 * (pred.iteration_ns - m) / m,
                    "floor_error_pct": 100 * (floor[tgt] - m) / m,
                    "traced_error_pct": 100 * (traced.iteration_ns - m) / m,
                    "uncovered_pct": 100 * float(pred.uncovered["share"].sum()),
                    "gap_pct": None if pred.gap_share is None else 100 * pred.gap_share,
                    "seconds": seconds,
                }
            )
            print(f"{src} -> {lay.text}: {rows[-1]['error_pct']:+.2f} % ({seconds:.0f} s)", file=sys.stderr)
    return pl.DataFrame(rows)


if __name__ == "__main__":
    main()
