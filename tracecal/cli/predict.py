"""`tracecal predict RUN` and `tracecal validate`: replay iterations, print and store component errors."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tracecal.cli.common import DbOption, progress_bar, render_rows, stdout, user_errors, warn
from tracecal.errors import PredictionError

if TYPE_CHECKING:  # imported where used: `tracecal --help` starts without it
    import polars as pl

    from tracecal.api.session import ModelFallback, ValidateReport
    from tracecal.predict.run import Prediction

FORMATS = ("table", "csv", "json")


def predict(
    run: Annotated[str, typer.Argument(help="Run id (see `tracecal runs`).")],
    cluster: Annotated[
        str | None, typer.Option("--cluster", help="Cluster whose calibrated models predict durations.")
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(
            "--mode",
            help="measured (fidelity check), predicted (calibrated models), scaled (what-if). "
            "Default: predicted with --cluster, scaled with --scale, else measured.",
        ),
    ] = None,
    scale: Annotated[
        list[str] | None, typer.Option("--scale", help="What-if: FAMILY=FACTOR, e.g. gemm=0.5 (repeatable).")
    ] = None,
    iteration: Annotated[
        int | None, typer.Option("--iteration", help="Replay this iteration instead of the best one.")
    ] = None,
    replay: Annotated[
        str,
        typer.Option(
            "--replay",
            help="fitted (slack the dependencies cannot explain kept as fixed lags) or dependency (left out). "
            "Both are computed and stored; this one is shown.",
        ),
    ] = "fitted",
    gpus_per_node: Annotated[
        int | None,
        typer.Option(
            "--gpus-per-node",
            min=1,
            help="What-if: place the ranks on nodes of this many GPUs (default with another cluster's models: "
            "that cluster's largest sampled node size).",
        ),
    ] = None,
    attribute: Annotated[
        bool,
        typer.Option(
            "--attribute",
            help="Split each component's error into the schedule's share (the measured replay's error), each op "
            "family's share (that family predicted, the rest measured) and their interaction.",
        ),
    ] = False,
    figures: Annotated[
        Path | None,
        typer.Option(
            "--figures",
            help="Directory for PNG figures: the slowest rank's timeline, with --attribute the attribution.",
        ),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json.")] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write csv/json to this file.")] = None,
    layout: Annotated[
        str | None,
        typer.Option(
            "--layout",
            help="What-if: rebuild the iteration of the same model at PPxTPxDP (e.g. 8x4x4) and predict it "
            "(decoded GPT-NeoX runs and runs of the reference workload; see docs/what-if.md). Stores nothing.",
        ),
    ] = None,
    micro_batches: Annotated[
        int | None, typer.Option("--micro-batches", min=1, help="With --layout: micro-batches per data-parallel rank.")
    ] = None,
    micro_batch_size: Annotated[
        int | None, typer.Option("--micro-batch-size", min=1, help="With --layout: samples per micro-batch.")
    ] = None,
    db: DbOption = None,
) -> None:
    """Replay the best iteration of RUN across all ranks and report measured vs predicted time per rank
    and component (compute fwd/bwd, optimizer, exposed TP/DP/PP/EP communication, memcpy, idle, and the
    whole iteration), with the dependency replay's error and the unexplained share (slack the
    dependencies cannot explain, on each rank's critical path). Results are stored in the predictions
    and components tables."""
    from tracecal.api import Session
    from tracecal.api.session import resolve_mode

    with user_errors():
        if fmt not in FORMATS:
            raise PredictionError(f"unknown --format {fmt!r}; use one of {', '.join(FORMATS)}")
        resolved = resolve_mode(mode, cluster, scale or [])
        if layout is not None or micro_batches is not None or micro_batch_size is not None:
            if scale:
                raise PredictionError("--scale does not apply with --layout: the rebuilt layout is predicted as it is")
            from tracecal.cli.search import render_layout

            result = Session(db).predict_layout(
                run, layout, cluster=cluster, mode=resolved, micro_batches=micro_batches,
                micro_batch_size=micro_batch_size, gpus_per_node=gpus_per_node, replay=replay,
            )  # fmt: skip
            render_layout(result, cluster if resolved == "predicted" else None)
            return
        report = Session(db).predict_report(
            run, cluster=cluster, mode=resolved, scale=scale or [], iteration=iteration, replay=replay,
            gpus_per_node=gpus_per_node, attribute=attribute,
        )  # fmt: skip
        pred, table, attribution, what_if = report.prediction, report.table, report.attribution, report.what_if
        if figures is not None:
            _predict_figures(figures, run, pred, attribution)
        if report.fallback is not None:
            _report_fallback(cluster, report.source_cluster, report.fallback, report.ratios)
        if report.gpus_per_node is not None:
            warn(
                f"ranks placed on nodes of {report.gpus_per_node} GPUs (from {report.gpus_per_node_source}); "
                "collective topologies follow"
            )
        if report.stored.paired_p2p:
            warn(f"{report.stored.paired_p2p} send/recv rows had no peer; paired by order between the run's two ranks")
        if fmt == "csv" or fmt == "json":
            if what_if:  # against the traced run: a change, not an error
                table = table.rename({"error_pct": "change_pct", "dependency_error_pct": "dependency_change_pct"})
            text = _csv(table) if fmt == "csv" else _json(table)
            if output is not None:
                output.write_text(text)
                stdout.print(f"wrote {table.height} rows to {output}")
            else:
                typer.echo(text, nl=False)
            return
        _render(run, report.stored.iteration, resolved, cluster, pred, table, what_if)
        if attribution is not None:
            _render_attribution(run, attribution, what_if)
        if report.decoded:
            stdout.print(
                "decoded run: the iteration is measured by the published best iteration's train_batch; the "
                "other components compare the replay with the rebuilt trace (gaps between kernels kept as measured)"
            )


def _report_fallback(cluster: str | None, source: str | None, fallback: ModelFallback, ratios: dict) -> None:
    """Name every family and collective that kept its measured durations, with its share of the
    iteration; a bold warning when the prediction is mostly measured time. On another cluster: the
    ratios used, the share carried over unscaled and the idle share."""
    import polars as pl

    from tracecal.cli.common import stderr

    if fallback.scaled:
        warn(
            f"no {cluster} model for {', '.join(fallback.scaled)}: measured durations scaled from {source} by "
            + "; ".join(f"{f} ×{ratios[f].factor:.3f} ({ratios[f].basis})" for f in fallback.scaled)
        )
    parts = fallback.kept.filter(pl.col("what") != "total")
    if parts.height:
        listed = ", ".join(
            f"{r['what']} {r['share_pct']:.1f} % (rank {r['rank']})" for r in parts.iter_rows(named=True)
        )
        warn(f"kept their measured durations (no model on cluster {cluster}), share of the iteration: {listed}")
    if fallback.mostly_measured:
        total = fallback.kept.filter(pl.col("what") == "total")
        stderr.print(
            f"[bold yellow]warning: {total['share_pct'][0]:.1f} % of rank {total['rank'][0]}'s iteration is operator "
            f"time kept as traced: this prediction is mostly measured time, not cluster {cluster}'s models[/]",
            highlight=False,
            soft_wrap=True,
        )
    if fallback.carried_pct is not None and fallback.idle_pct is not None:
        warn(
            f"carried over from {source} unscaled: {fallback.carried_pct:.1f} % of the operator time, and every "
            f"CPU-side gap (the GPUs sit idle up to {fallback.idle_pct:.1f} % of a rank's predicted iteration)"
        )


def _predict_figures(directory: Path, run: str, pred: Prediction, attribution: pl.DataFrame | None) -> None:
    """The slowest rank's measured vs replayed timeline and, with an attribution, its figure."""
    import polars as pl

    from tracecal.predict.figures import rank_timeline

    slow = int(pred.iteration_error().sort("measured_ns", descending=True)["rank"][0])
    made = [rank_timeline(pred, slow, directory / f"timeline_{run}_rank{slow}.png", f"{run} rank {slow}")]
    if attribution is not None:
        made.append(_attribution_figure(attribution.with_columns(pl.lit(run).alias("run_id")), directory))
    stdout.print(f"figures: {', '.join(map(str, made))}")


def _attribution_figure(per_rank: pl.DataFrame, directory: Path) -> Path:
    """``attribution.png`` of per-rank attribution rows (with run_id), scored per run."""
    from tracecal.predict.attribution import as_percent, long_form, run_attribution
    from tracecal.predict.figures import error_attribution

    summary = as_percent(run_attribution(per_rank))
    return error_attribution(long_form(summary, ["run_id", "component"]), directory / "attribution.png")


def _render_attribution(title: str, attribution: pl.DataFrame, what_if: bool = False) -> None:
    """The attribution across ranks (busy components summed, the iteration of the slowest rank); a
    what-if's difference to the traced run is labelled a change."""
    import polars as pl

    from tracecal.predict.attribution import as_percent, percent_columns, run_attribution

    summary = as_percent(run_attribution(attribution)).filter(pl.col("error_pct").is_not_null())
    parts = percent_columns(summary)
    word = "change" if what_if else "error"
    header = ["component", f"{word} %", *[p.removesuffix("_pct").removeprefix("family_") + " %" for p in parts]]
    rows = [[r["component"], *[_fmt(r[c], 2) for c in ["error_pct", *parts]]] for r in summary.iter_rows(named=True)]
    render_rows(f"{title}: where the {word} comes from (% of the measured time, ranks summed)", header, rows)
    stdout.print(
        "schedule: the measured-duration replay's error; a family: its durations predicted, every other measured; "
        f"interaction: what the families change together beyond their separate effects. The parts add up to the {word}."
    )


def _csv(table: pl.DataFrame) -> str:
    return table.write_csv(float_precision=4)


def _json(table: pl.DataFrame) -> str:
    return table.write_json() + "\n"


def _fmt(v: float | None, digits: int = 3) -> str | None:
    return None if v is None else f"{v:.{digits}f}"


def _render(
    run: str, iteration: int, mode: str, cluster: str | None, pred: Prediction, table: pl.DataFrame, what_if: bool
) -> None:
    """The component table; a what-if (``what_if.is_what_if``) says "change" against the traced run
    where a prediction of the traced machine says "error"."""
    import polars as pl

    word = "change" if what_if else "error"
    rows = [
        [
            r["rank"],
            r["component"],
            _fmt(r["measured_ms"]),
            _fmt(r["predicted_ms"]),
            _fmt(r["error_pct"], 2),
            None if r["covered_share"] is None else f"{100 * r['covered_share']:.0f} %",
            _fmt(r["dependency_error_pct"], 2),
            _fmt(r["unexplained_pct"], 2),
        ]
        for r in table.filter((pl.col("measured_ms") > 0) | (pl.col("predicted_ms") > 0)).iter_rows(named=True)
    ]
    title = f"{run} iteration {iteration}: {mode}"
    if cluster and mode == "predicted":
        title += f" with cluster {cluster}"
    title += f", {pred.replay} replay"
    header = ["rank", "component", "measured ms", "predicted ms", f"{word} %", "model-covered"]
    render_rows(title, [*header, f"dependency {word} %", "unexplained %"], rows)
    _render_slack(pred, table, word)
    it = pred.iteration_error()
    slow = it.sort("measured_ns", descending=True).row(0, named=True)
    worst = it.select(pl.col("error_pct").abs().max()).item()
    stdout.print(
        f"iteration (slowest rank {slow['rank']}): measured {slow['measured_ns'] / 1e6:.3f} ms, "
        f"predicted {slow['predicted_ns'] / 1e6:.3f} ms, {word} {slow['error_pct']:+.2f} %; "
        f"largest rank {word} {worst:.2f} %"
    )
    stdout.print(
        f"operator time predicted by a model: {100 * pred.coverage['all']:.1f} % (the rest kept its measured "
        f"duration); graph {pred.graph.nodes.height} nodes, {pred.graph.src.size} edges, replay "
        f"{pred.seconds['replay'] * 1e3:.0f} ms"
    )


SLACK_RANKS_SHOWN = 16
"""Ranks whose unexplained time is itemised after the table (the rest are summarised)."""


def _float(value: object) -> float | None:
    return value if isinstance(value, float) else None


def _render_slack(pred: Prediction, table: pl.DataFrame, word: str = "error") -> None:
    """Per rank: the dependency replay's error and where the unexplained time lands."""
    import polars as pl

    from tracecal.predict.slack import landing

    fitted = pred.by_replay("fitted")
    it = table.filter(pl.col("component") == "iteration").sort("rank")
    where = landing(fitted.unexplained) if fitted is not None else None
    if pred.replay == "fitted":
        stdout.print(
            "fitted replay: a delay the dependencies cannot explain is kept as a fixed lag; dependency replay: "
            "only dependencies and nominal lags; unexplained: the fixed lags on the rank's critical path, % of "
            "its iteration"
        )
    else:
        stdout.print("dependency replay: only dependencies and nominal lags (the fitted replay's fixed slack left out)")
    for r in it.head(SLACK_RANKS_SHOWN).iter_rows(named=True):
        line = f"rank {r['rank']}: dependency replay {word} {_fmt(r['dependency_error_pct'], 2)} %"
        if r["unexplained_pct"] is not None:
            line += f", unexplained {r['unexplained_pct']:.2f} % of the iteration"
            span = r["predicted_ms"] * 1e6 if pred.replay == "fitted" else None
            if where is not None and span:
                parts = [
                    f"{w['what']} {100 * w['unexplained_ns'] / span:.2f} %"
                    for w in where.filter(pl.col("rank") == r["rank"]).iter_rows(named=True)
                ]
                line += f" (before: {', '.join(parts)})" if parts else ""
        stdout.print(line, highlight=False)
    if it.height > SLACK_RANKS_SHOWN:
        rest = it.slice(SLACK_RANKS_SHOWN)
        stdout.print(
            f"{rest.height} more ranks: dependency replay {word} up to "
            f"{_fmt(_float(rest['dependency_error_pct'].abs().max()), 2)} %, unexplained up to "
            f"{_fmt(_float(rest['unexplained_pct'].max()), 2)} %",
            highlight=False,
        )


VALIDATE_FORMATS = ("markdown", "csv")


def validate(
    runs: Annotated[list[str] | None, typer.Argument(help="Run ids (default: the cluster's runs, else all).")] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", help="Cluster whose calibrated models predict durations.")
    ] = None,
    mode: Annotated[
        str | None, typer.Option("--mode", help="predicted (default with --cluster), measured, or scaled.")
    ] = None,
    scale: Annotated[list[str] | None, typer.Option("--scale", help="What-if FAMILY=FACTOR (repeatable).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="markdown or csv.")] = "markdown",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the table to this file.")] = None,
    figures: Annotated[
        Path | None,
        typer.Option(
            "--figures", help="Directory for PNG figures (proportions, stages or a timeline; the attribution)."
        ),
    ] = None,
    attribute: Annotated[
        bool,
        typer.Option(
            "--attribute",
            help="Split each component's error into the schedule's share, each op family's share and their "
            "interaction (columns schedule_pct, family_<name>_pct, interaction_pct).",
        ),
    ] = False,
    db: DbOption = None,
) -> None:
    """Predict every run and print its error table. Decoded GPT-NeoX runs are scored like the published
    Table 9 (run_id, component, measured_ms, predicted_ms, error_pct, published_error_pct); traced runs
    get the component table across runs (error % of the rank-summed component time; overall: the
    slowest rank's iteration)."""
    from tracecal.api import Session

    with user_errors():
        if fmt not in VALIDATE_FORMATS:
            raise PredictionError(f"unknown --format {fmt!r}; use one of {', '.join(VALIDATE_FORMATS)}")
        with progress_bar() as bar:
            tasks: list[Any] = []

            def progress(run_id: str, index: int, total: int) -> None:
                """One progress step per run (a bar on a terminal, one line per run elsewhere)."""
                if not tasks:
                    tasks.append(bar.add_task(f"validate {run_id}", total=total))
                else:
                    bar.update(tasks[0], advance=1)
                bar.update(tasks[0], description=f"validate {run_id}")

            report = Session(db).validate_report(
                runs or [], cluster=cluster, mode=mode, scale=scale or [], attribute=attribute,
                mixed=not (fmt == "csv" or output is not None), progress=progress,
            )  # fmt: skip
            if tasks:
                bar.update(tasks[0], advance=1)
        if report.decoded:
            _validate_published(report, fmt, output, figures)
        if report.traced:
            _validate_traced(report, fmt, output, figures, attribute)


def _emit(text: str, output: Path | None, what: str) -> None:
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        stdout.print(f"wrote {what} to {output}")
    else:
        typer.echo(text, nl=False)


def _validate_published(report: ValidateReport, fmt: str, output: Path | None, figures: Path | None) -> None:
    """Decoded runs: the published Table 9 components, ours beside the published."""
    import polars as pl

    from tracecal.sources.gpumodeling25.validate import published

    results = report.decoded
    if report.published_attribution is not None:
        _published_attribution(report.published_attribution, fmt, output, figures)
        return
    frames = [v.components for v in results]
    table = published.summary(frames)
    text = published.to_csv(frames) if fmt == "csv" else published.to_markdown(frames, table)
    _emit(text, output, f"the published comparison of {len(results)} runs")
    if figures is not None:
        from tracecal.predict.figures import component_proportions, published_stage_times

        comps = pl.concat([v.prediction.components.with_columns(pl.lit(v.run_id).alias("run_id")) for v in results])
        shares = component_proportions(comps, figures / "component_proportions.png")
        stages = published_stage_times(pl.concat([v.stages for v in results]), figures / "stage_times.png")
        stdout.print(f"figures: {shares}, {stages}")
    if fmt == "markdown" and output is None:
        overall = pl.concat(frames).filter(pl.col("component") == "Overall")
        render_rows(
            "Overall (train_batch of the best iteration)",
            ["run", "measured ms", "predicted ms", "error %", "published %"],
            [
                [r["run_id"], _fmt(r["measured_ms"]), _fmt(r["predicted_ms"]), _fmt(r["error_pct"], 2),
                 _fmt(r["published_error_pct"], 2)]
                for r in overall.iter_rows(named=True)
            ],
        )  # fmt: skip


def _published_attribution(frames: list[pl.DataFrame], fmt: str, output: Path | None, figures: Path | None) -> None:
    """Decoded runs with --attribute: every Table 9 cell's error split by the schedule and families."""
    import polars as pl

    from tracecal.predict.attribution import long_form, percent_columns
    from tracecal.sources.gpumodeling25.validate.published import EDITED_NOTE

    table = _ordered_parts(pl.concat(frames, how="diagonal_relaxed"))
    labelled = table.with_columns(
        pl.when(pl.col("hand_edited")).then(pl.col("component") + "*").otherwise(pl.col("component")).alias("component")
    )
    parts = percent_columns(table)
    if fmt == "csv":
        text = labelled.select(
            "run_id",
            "component",
            (pl.col("measured_ns", "predicted_ns") / 1e6).round(3).name.map(lambda c: c.replace("_ns", "_ms")),
            pl.col("error_pct", "published_error_pct", *parts).round(2),
        ).write_csv()
    else:
        text = _attribution_markdown(labelled, parts) + f"\n{EDITED_NOTE}\n"
    _emit(text, output, f"the error attribution of {len(frames)} runs")
    if figures is not None:
        path = figures / "attribution.png"
        from tracecal.predict.figures import error_attribution

        stdout.print(f"figures: {error_attribution(long_form(table, ['run_id', 'component']), path)}")


def _ordered_parts(table: pl.DataFrame) -> pl.DataFrame:
    """Attribution columns of several runs in one order: schedule, the families by name, interaction."""
    from tracecal.predict.attribution import percent_columns

    parts = percent_columns(table)
    families = sorted(p for p in parts if p not in ("schedule_pct", "interaction_pct"))
    ordered = [p for p in ("schedule_pct", *families, "interaction_pct") if p in parts]
    return table.select([c for c in table.columns if c not in parts] + ordered)


def _attribution_markdown(table: pl.DataFrame, parts: list[str]) -> str:
    """Per run: component, error % and its parts, one Markdown table each."""
    import polars as pl

    lines = []
    for run_id in dict.fromkeys(table["run_id"].to_list()):
        rows = table.filter(pl.col("run_id") == run_id)
        present = [p for p in parts if rows[p].is_not_null().any()]
        header = ["component", "error %", *[p.removesuffix("_pct").removeprefix("family_") + " %" for p in present]]
        lines += [f"### {run_id}: where the error comes from", "", "| " + " | ".join(header) + " |"]
        lines.append("|---|" + "|".join("---:" for _ in header[1:]) + "|")
        for r in rows.iter_rows(named=True):
            cells = ["" if r[c] is None else f"{r[c]:+.2f}" for c in ["error_pct", *present]]
            lines.append("| " + " | ".join([r["component"], *cells]) + " |")
        lines.append("")
    return "\n".join(lines)


def _validate_traced(
    report: ValidateReport, fmt: str, output: Path | None, figures: Path | None, attribute: bool
) -> None:
    """Traced runs: component error % across runs."""
    import polars as pl

    from tracecal.predict.validate import error_table, times_table, to_markdown

    results, mode, cluster = report.traced, report.mode, report.cluster
    if attribute and report.traced_attribution is not None:
        from tracecal.predict.attribution import as_percent, percent_columns, run_attribution

        per_rank = report.traced_attribution
        table = _ordered_parts(as_percent(run_attribution(per_rank)))
        parts = percent_columns(table)
        if fmt == "csv":
            text = table.select(
                "run_id",
                pl.col("component").replace("iteration", "overall"),
                (pl.col("measured_ns", "predicted_ns") / 1e6).name.map(lambda c: c.replace("_ns", "_ms")),
                pl.col("error_pct", *parts),
            ).write_csv(float_precision=4)
        else:
            text = _attribution_markdown(table.filter(pl.col("error_pct").is_not_null()), parts)
        _emit(text, output, f"the error attribution of {len(results)} runs")
        if figures is not None:
            stdout.print(f"figures: {_attribution_figure(per_rank, figures)}")
        return
    comps = pl.concat([p.components.with_columns(pl.lit(r).alias("run_id")) for r, p in results])
    table = error_table(comps)
    title = f"component error % ({mode}" + (f", cluster {cluster})" if cluster else ")")
    text = to_markdown(table, title) if fmt == "markdown" else table.write_csv(float_precision=2)
    _emit(text, output, f"the error table of {len(results)} runs")
    if figures is not None:
        _validation_figures(figures, comps, results)
    if output is None and fmt == "markdown":
        long = times_table(comps).filter(pl.col("component") == "overall")
        render_rows(
            "overall iteration (slowest rank)",
            ["run", "measured ms", "predicted ms", "error %"],
            [[r[0], _fmt(r[2]), _fmt(r[3]), _fmt(r[4], 2)] for r in long.iter_rows()],
        )


def _validation_figures(directory: Path, comps: pl.DataFrame, results: list) -> None:
    from tracecal.predict.figures import component_proportions, rank_timeline

    bars = component_proportions(comps, directory / "component_proportions.png")
    run_id, pred = results[0]
    it = pred.iteration_error().sort("measured_ns", descending=True)
    rank = int(it["rank"][0])
    line = rank_timeline(pred, rank, directory / f"timeline_{run_id}_rank{rank}.png", f"{run_id} rank {rank}")
    stdout.print(f"figures: {bars}, {line}")
