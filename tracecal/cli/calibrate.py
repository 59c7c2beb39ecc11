"""`calibrate --cluster NAME` (= `tracecal calibrate`): fit, validate and store a cluster's regressors.

Prints two tables: hold-out validation on samples per model group (with the published error next to
ours when the samples are GPUModeling25's and ``--published DIR`` names their tuned-config file), and
in-trace validation on the operators of the cluster's ingested runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tracecal.cli.common import DbOption, one_command_app, progress_bar, render_rows, stdout, user_errors, warn

if TYPE_CHECKING:  # imported where used: `tracecal --help` starts without it
    import polars as pl

COMM = "comm"


def _num(value: Any, digits: int = 2) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return round(float(value), digits)


def calibrate(
    cluster: Annotated[str, typer.Option("--cluster", help="Cluster whose samples to calibrate (samples.cluster).")],
    family: Annotated[str | None, typer.Option("--family", help="Only this op family (e.g. gemm, comm).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON instead of tables.")] = False,
    report: Annotated[
        Path | None, typer.Option("--report", help="Write the hold-out table as CSV (one row per op × direction).")
    ] = None,
    published: Annotated[
        list[Path] | None,
        typer.Option(
            "--published",
            help="Directory of a GPUModeling25 tuned-config file (<GPU>.csv) whose Best_error% to show next to "
            "ours; repeat for compute and NCCL.",
        ),
    ] = None,
    folds: Annotated[int, typer.Option("--folds", min=2, help="k of the k-fold model selection.")] = 3,
    db: DbOption = None,
) -> None:
    """Fit XGBoost / random-forest / physical regressors per family × direction (and collective ×
    topology) on the cluster's samples, choose by cross-validation, validate on the hold-out split
    (the published 80/20 one for imported samples) and on the traced operators of the cluster's runs,
    and store the models next to the database."""
    from tracecal.api import Session

    with user_errors():
        session = Session(db)
        with progress_bar() as bar:
            task = bar.add_task("calibrating", total=None)

            def progress(key: Any, index: int, total: int) -> None:
                bar.update(task, completed=index, total=total, description=f"{key.label} {key.direction}")

            result, trace_table = session.calibrate_report(
                cluster, family=family, published=published or [], folds=folds, progress=progress
            )
            bar.update(task, completed=len(result.results), description="calibrated")
        table = result.report
        if report is not None:
            table.select(
                "op", "direction", "model", "n_train", "n_test", "excluded", "mape", "p90_ape", "published_mape",
                "p50_ape", "max_ape", "cv_mape", "noise_ape", "family", "topology", "protocol", "status",
                "timing", "superseded",
            ).write_csv(report)  # fmt: skip
        if as_json:
            stdout.print_json(
                json.dumps(
                    {
                        "cluster": cluster,
                        "models_stored": result.stored,
                        "holdout": table.to_dicts(),
                        "summary": result.comparison,
                        "in_trace": None if trace_table is None else trace_table.to_dicts(),
                    },
                    default=str,
                )
            )
            return
        _print_holdout(cluster, table, result.comparison)
        timing = _timing_line(table)
        if timing:
            stdout.print(timing)
        if trace_table is None:
            stdout.print(
                f"in-trace validation: no ingested run has cluster {cluster!r} "
                f"(ingest one with `tracecal ingest RUN --cluster {cluster}`)"
            )
        else:
            _print_in_trace(cluster, trace_table)
        if published is None and table.get_column("protocol").to_list().count("published"):
            warn(_published_hint(table))
        stdout.print(
            f"stored {result.stored} models in {session.model_dir} "
            f"(`tracecal sql \"select * from models where cluster='{cluster}'\"`)"
        )
        if report is not None:
            stdout.print(f"wrote {report}")


def _timing_line(table: pl.DataFrame) -> str | None:
    """How the fitted models' samples were timed, and how many were superseded (docs/calibration.md#timing);
    None when no sample of the cluster records its method (imported published samples)."""
    fitted = table.filter(table["model"].is_not_null() & table["timing"].is_not_null())
    if fitted.height == 0:
        return None
    counts = fitted.group_by("timing").len().sort("len", descending=True)
    models = ", ".join(f"{n} on {timing}" for timing, n in counts.iter_rows())
    superseded = int(table["superseded"].sum())
    left_out = f"; {superseded} call-timed samples superseded by kernel-timed ones of the same op" if superseded else ""
    return f"timing: models fitted {models}{left_out}"


def _published_hint(table: pl.DataFrame) -> str:
    """Which directories --published wants: the compute and / or the NCCL samples' (each with its <GPU>.csv)."""
    families = set(table.filter(table["protocol"] == "published").get_column("family").to_list())
    kinds = [k for k, present in (("compute", families - {COMM}), ("NCCL", families & {COMM})) if present]
    where = " and ".join(f"the directory of the {k} samples" for k in kinds)
    return (
        "these are published GPUModeling25 samples: to show the published errors next to ours, pass "
        f"--published DIR for {where} (the directories you imported, each holding its tuned-config file "
        "<GPU>.csv)"
    )


def _print_holdout(cluster: str, table: pl.DataFrame, comparison: list[dict[str, Any]]) -> None:
    columns = ["family", "op", "dir", "model", "train", "test", "excl", "MAPE %", "p50 %", "p90 %", "max %",
               "published %", "noise %", "status"]  # fmt: skip
    rows = [
        [
            r["family"],
            r["op"],
            r["direction"],
            r["model"],
            r["n_train"],
            r["n_test"],
            r["excluded"],
            _num(r["mape"]),
            _num(r["p50_ape"]),
            _num(r["p90_ape"]),
            _num(r["max_ape"]),
            _num(r["published_mape"]),
            _num(r["noise_ape"]),
            _short(r["status"]),
        ]
        for r in table.iter_rows(named=True)
    ]
    render_rows(f"hold-out validation on samples of {cluster} (errors in %)", columns, rows)
    for s in comparison:
        stdout.print(
            f"{s['scope']}: ours lower than published on {s['lower_than_published']}/{s['groups']} groups "
            f"({100 * s['share_lower']:.0f} %); median MAPE {s['median_mape']:.2f} % vs published "
            f"{s['median_published']:.2f} %"
            + (
                f"; {s['consistent_groups']} self-consistent groups, worst {s['consistent_max_mape']:.2f} %"
                if s["scope"] == COMM and s["consistent_max_mape"] is not None
                else ""
            )
        )


def _short(status: str) -> str:
    """``ok``, ``inconsistent`` (the noise column says how much) or ``too few (n=K)``."""
    if status.startswith("too few samples"):
        return f"too few (n={status.split(': ', 1)[1].split(' ', 1)[0]})"
    return status.split(":", 1)[0]


def _print_in_trace(cluster: str, table: pl.DataFrame) -> None:
    columns = ["run", "family", "ops", "predicted", "measured ms", "predicted ms", "covered %", "MAPE %",
               "p50 %", "p90 %", "max %"]  # fmt: skip
    rows = [
        [
            r["run_id"],
            r["family"],
            r["operators"],
            r["predicted"],
            _num(r["measured_ms"], 3),
            _num(r["predicted_ms"], 3),
            _num(None if r["covered_share"] is None else 100 * r["covered_share"], 1),
            _num(r["mape"]),
            _num(r["p50_ape"]),
            _num(r["p90_ape"]),
            _num(r["max_ape"]),
        ]
        for r in table.iter_rows(named=True)
    ]
    render_rows(f"in-trace validation: traced operators of {cluster}'s runs vs the models", columns, rows)


def main() -> None:
    """Console script ``calibrate``: the same command as ``tracecal calibrate``."""
    one_command_app(calibrate)()
