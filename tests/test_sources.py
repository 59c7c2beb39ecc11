"""The source registry: the built-in sources are found through it, and a source an outside package
registers (entry-point group ``tracecal.sources``) is discovered and ingested like a built-in one."""

from __future__ import annotations

import shutil
from dataclasses import replace
from importlib.metadata import EntryPoint
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from tests.conftest import GPUMODELING25, KINETO, NSYS
from tracecal.errors import InputNotFoundError, PredictionError, TracecalError, TraceFormatError
from tracecal.ingest.discover import discover_run, trace_format
from tracecal.ingest.trace import ParsedRank
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.predict.layouts import Layout, parse_layout
from tracecal.predict.relayout_run import run_layout
from tracecal.schema import EVENTS, arrow_schema
from tracecal.sources import registry
from tracecal.sources.registry import Source
from tracecal.sql.connection import open_database

EVENT_CSV = Source(
    name="eventcsv",
    description="one rank's events as CSV",
    suffixes=(".events.csv",),
    parse="tests.test_sources:parse_event_csv",
)
"""An outside source, as a package would declare it (here registered by a patched entry point)."""


def parse_event_csv(path: Path, spill_dir: Path | None = None) -> list[ParsedRank]:
    """A CSV of ``kind,name,ts_ns,dur_ns,pid,tid,correlation`` rows -> one rank of ``EVENTS`` rows."""
    try:
        table = pacsv.read_csv(path)
    except pa.ArrowInvalid as exc:
        raise TraceFormatError(f"{path}: not an event CSV ({exc})") from exc
    schema = arrow_schema(EVENTS)
    n = table.num_rows
    columns = {"event_id": pa.array(range(n), pa.int64())}
    columns.update({name: table[name] for name in table.column_names})
    events = pa.table(
        [columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema], schema=schema
    )
    return [
        ParsedRank(
            rank=None, rank_source="", events=events, file=path, file_bytes=path.stat().st_size, format="eventcsv"
        )
    ]


@pytest.fixture
def outside_source(monkeypatch: pytest.MonkeyPatch):
    """``EVENT_CSV`` registered through the entry-point group, for this test only."""
    point = EntryPoint(name="eventcsv", value="tests.test_sources:EVENT_CSV", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [point] if group == registry.ENTRY_POINT_GROUP else [])
    registry.registered.cache_clear()
    yield EVENT_CSV
    registry.registered.cache_clear()


def test_built_in_sources_are_registered_once_and_recognise_their_inputs() -> None:
    names = [s.name for s in registry.registered()]
    assert names == ["kineto", "nsys", "gpumodeling25"]
    assert trace_format(Path("a.pt.trace.json.gz")) == "kineto"
    assert trace_format(Path("rank3.nsys-rep")) == "nsys"
    assert trace_format(Path("run.json")) is None
    decoded = sorted(p for p in (GPUMODELING25 / "runs" / "perlmutter").iterdir() if p.is_dir())[0]
    run = discover_run(decoded)
    assert run.format == "gpumodeling25" and run.folder is not None and run.files == ()
    assert {f.format for f in discover_run(KINETO / "dlrm_8rank").files} == {"kineto"}


def test_an_outside_source_is_discovered_and_ingested(
    outside_source: Source, tmp_path: Path, template_cache: Path
) -> None:
    run_dir = tmp_path / "csv_run"
    run_dir.mkdir()
    (run_dir / "rank0.events.csv").write_text(
        "kind,name,ts_ns,dur_ns,pid,tid,correlation\n"
        "cpu_op,aten::mm,1000,500,1,1,\n"
        "cuda_runtime,cudaLaunchKernel,1100,50,1,1,7\n"
        "kernel,gemm_kernel,1300,400,0,7,7\n"
    )
    (run_dir / "notes.txt").write_text("not a rank file")
    found = discover_run(run_dir)
    assert [(f.path.name, f.format, f.path_rank) for f in found.files] == [("rank0.events.csv", "eventcsv", 0)]
    with open_database(tmp_path / "x.duckdb", cache_dir=template_cache) as con:
        report = ingest_runs(con, [run_dir], IngestOptions(workers=1))
        assert report.runs[0].format == "eventcsv" and report.runs[0].events == 3 and report.runs[0].kernels == 1
        assert con.execute("SELECT format, ranks_found FROM runs").fetchall() == [("eventcsv", 1)]
        rows = con.execute("SELECT kind, name FROM events ORDER BY event_id").fetchall()
    assert rows == [("cpu_op", "aten::mm"), ("cuda_runtime", "cudaLaunchKernel"), ("kernel", "gemm_kernel")]


def test_a_bad_file_of_an_outside_source_is_one_line(
    outside_source: Source, tmp_path: Path, template_cache: Path
) -> None:
    run_dir = tmp_path / "bad"
    run_dir.mkdir()
    (run_dir / "rank0.events.csv").write_text('kind,name\n"unterminated\n')
    with (
        open_database(tmp_path / "x.duckdb", cache_dir=template_cache) as con,
        pytest.raises(TracecalError, match=r"rank0\.events\.csv"),
    ):
        ingest_runs(con, [run_dir], IngestOptions(workers=1))


def test_a_run_of_one_rank_file_is_named_as_its_source_says(outside_source: Source, tmp_path: Path) -> None:
    """A run that is one rank file takes the file's name without the suffix its source declares, an outside
    source's as a built-in one's (``Source.run_name``), whatever the case of the suffix."""
    (tmp_path / "step3.events.csv").write_text("kind,name,ts_ns,dur_ns,pid,tid,correlation\ncpu_op,x,0,5,1,1,\n")
    assert discover_run(tmp_path / "step3.events.csv").name == "step3"
    assert (
        discover_run(KINETO / "single" / "cpu_gloo_rank-34_of_300.pt.trace.json.gz").name == "cpu_gloo_rank-34_of_300"
    )
    assert discover_run(NSYS / "mfu_2gpu_after.sqlite.gz").name == "mfu_2gpu_after"
    assert registry.source_named("kineto").run_name(Path("W7.1694128201553.PT.TRACE.JSON")) == "W7.1694128201553"


class StatedLayout:
    """An outside source's ``relayout`` as far as ``run_layout`` reads it: the layout the run folder's
    ``layout.txt`` states."""

    def __init__(self, folder: Path) -> None:
        self.layout = Layout(*parse_layout((folder / "layout.txt").read_text()))


LAID_OUT_CSV = replace(EVENT_CSV, relayout="tests.test_sources:StatedLayout")
"""``EVENT_CSV`` with a ``relayout``."""


def test_the_layout_what_if_asks_the_runs_source(
    outside_source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, template_cache: Path
) -> None:
    """``predict --layout`` reaches a run's source through the registry (``Source.relayout``): without one
    the run is refused naming the formats that have one; with one, the source reads the run's folder;
    a folder gone is one line."""
    run_dir = tmp_path / "csv_run"
    run_dir.mkdir()
    (run_dir / "rank0.events.csv").write_text("kind,name,ts_ns,dur_ns,pid,tid,correlation\ncpu_op,x,0,5,1,1,\n")
    (run_dir / "layout.txt").write_text("2x1x4")
    with open_database(tmp_path / "x.duckdb", cache_dir=template_cache) as con:
        ingest_runs(con, [run_dir], IngestOptions(workers=1))
        with pytest.raises(PredictionError, match=r"^run csv_run is a eventcsv trace: .* runs of gpumodeling25,"):
            run_layout(con, "csv_run")
        point = EntryPoint(name="eventcsv", value="tests.test_sources:LAID_OUT_CSV", group=registry.ENTRY_POINT_GROUP)
        monkeypatch.setattr(registry, "entry_points", lambda group: [point])
        registry.registered.cache_clear()
        assert registry.relayout_formats() == ["gpumodeling25", "eventcsv"]
        assert run_layout(con, "csv_run") == Layout(2, 1, 4)
        shutil.rmtree(run_dir)
        with pytest.raises(PredictionError, match=r"eventcsv run folder .*csv_run is no longer there"):
            run_layout(con, "csv_run")


def test_registry_errors_name_what_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TracecalError, match="needs both suffixes and parse"):
        Source(name="half", description="", suffixes=(".x",))
    with pytest.raises(TracecalError, match="reads nothing"):
        Source(name="none", description="")
    with pytest.raises(TracecalError, match="no source reads format 'nope'"):
        registry.source_named("nope")
    with pytest.raises(TracecalError, match="cannot be loaded"):
        registry.load("tracecal.sources.no_such_module:SOURCE")
    point = EntryPoint(name="x", value="tracecal.errors:TracecalError", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [point])
    registry.registered.cache_clear()
    try:
        with pytest.raises(TracecalError, match="is not a tracecal Source"):
            registry.registered()
    finally:
        registry.registered.cache_clear()


def test_an_empty_run_names_every_source(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InputNotFoundError, match=r"\*\.pt\.trace\.json\[\.gz\].*\*\.nsys-rep.*GPUModeling25"):
        discover_run(tmp_path)
