"""The `tracecal` command and its console-script aliases (`trace-ingest`, `calibrate`).

Each command group lives in its own module; this file only assembles them. Heavy libraries (torch,
xgboost) are imported inside the commands that need them so `tracecal --help` starts fast.
"""

from __future__ import annotations

import typer

from tracecal.cli import calibrate as calibrate_cmd
from tracecal.cli import demo as demo_cmd
from tracecal.cli import diff as diff_cmd
from tracecal.cli import export as export_cmd
from tracecal.cli import ingest as ingest_cmd
from tracecal.cli import iterations as iterations_cmd
from tracecal.cli import predict as predict_cmd
from tracecal.cli import query
from tracecal.cli import sample as sample_cmd
from tracecal.cli import samples as samples_cmd
from tracecal.cli import search as search_cmd
from tracecal.cli import workload as workload_cmd
from tracecal.cli.common import APP_SETTINGS

app = typer.Typer(
    name="tracecal",
    help="Profiler-trace ingestion, calibration and replay prediction for distributed LLM training.",
    **APP_SETTINGS,
)

app.command("sql")(query.sql)
app.command("runs")(query.runs)
app.command("ingest")(ingest_cmd.ingest)
app.command("iterations")(iterations_cmd.iterations)
app.command("predict")(predict_cmd.predict)
app.command("validate")(predict_cmd.validate)
app.command("demo")(demo_cmd.demo)
app.command("calibrate")(calibrate_cmd.calibrate)
app.command("export")(export_cmd.export)
app.command("diff")(diff_cmd.diff)
app.command("search")(search_cmd.search)
app.add_typer(workload_cmd.app, name="workload")
app.add_typer(samples_cmd.app, name="samples")
app.add_typer(sample_cmd.legacy_app, name="sample", hidden=True)  # the old spelling, for one release


if __name__ == "__main__":
    app()
