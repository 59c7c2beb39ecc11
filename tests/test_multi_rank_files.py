"""Trace files that hold several ranks (docs/parsing.md#several-ranks-in-one-file): a ``tracecal export`` of
all eight DLRM ranks ingests back as those eight ranks, and a merge whose ranks cannot be told apart is
refused in one line that says how to split it, writing nothing."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tests.conftest import KINETO
from tests.test_export import OPERATOR_COLUMNS, _differences, _ingest
from tracecal.cli.main import app
from tracecal.errors import TraceFormatError
from tracecal.ingest.trace import EventsFile
from tracecal.sources.kineto import parser
from tracecal.sources.kineto.parser import parse_kineto_ranks
from tracecal.sql.connection import open_database

DLRM = KINETO / "dlrm_8rank"
runner = CliRunner()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, ingested_copy: Callable[..., Path]) -> tuple[Path, Path]:
    """A database holding dlrm_8rank, and its ``tracecal export`` as one file (every rank a process)."""
    db = ingested_copy(DLRM)
    out = tmp_path_factory.mktemp("multi") / "dlrm_export.json.gz"
    result = runner.invoke(app, ["export", "dlrm_8rank", "--db", str(db), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return db, out


def test_an_export_of_every_rank_ingests_back_as_those_ranks(exported: tuple[Path, Path]) -> None:
    db, out = exported
    _ingest(db, out)
    with open_database(Path(db), read_only=True) as con:
        ranks = con.execute("SELECT rank, rank_source FROM ranks WHERE run_id = 'dlrm_export' ORDER BY 1").fetchall()
        world = con.execute("SELECT world_size, ranks_found FROM runs WHERE run_id = 'dlrm_export'").fetchone()
    assert ranks == [(r, "process_name") for r in range(8)] and world == (8, 8)
    diffs = _differences(db, "dlrm_8rank", "dlrm_export", ops=OPERATOR_COLUMNS + ", cpu_tid, scope_name")
    assert diffs == {
        "operators": (2244, 0, 0),
        "collectives": (64, 0, 0),
        "iterations": (8, 0, 0),
        "matches": (8, 0, 0),
    }


def test_a_spilled_multi_rank_file_is_split_like_one_held_whole(
    exported: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file too large to hold is streamed to Parquet; its ranks are split from it in one pass."""
    held = {r.rank: r.events for r in parse_kineto_ranks(exported[1])}
    monkeypatch.setattr(parser, "DIRECT_DECODE_BYTES", 1 << 16)
    spilled = parse_kineto_ranks(exported[1], tmp_path)
    assert [r.rank for r in spilled] == sorted(held)
    for rank in spilled:
        assert isinstance(rank.events, EventsFile)
        table = pq.read_table(rank.events.path)
        assert isinstance(held[rank.rank], pa.Table)
        assert table.num_rows == rank.events.rows == held[rank.rank].num_rows  # type: ignore[union-attr]
        assert table.column("event_id").to_pylist() == held[rank.rank].column("event_id").to_pylist()  # type: ignore[union-attr]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(r.events.path.name for r in spilled)  # type: ignore[union-attr]


def _merged_without_names(tmp_path: Path) -> Path:
    """Ranks 0 and 1 of DLRM in one file, as a naive merge leaves them: their own pids, no rank names."""
    docs = [json.loads(gzip.decompress(next(DLRM.glob(f"worker{r}_*")).read_bytes())) for r in (0, 1)]
    merged = {**docs[0], "traceEvents": docs[0]["traceEvents"] + docs[1]["traceEvents"]}
    merged.pop("distributedInfo")
    run = tmp_path / "merged"
    run.mkdir()
    (run / "merged.json").write_text(json.dumps(merged))
    return run


def test_ranks_that_cannot_be_told_apart_are_refused_in_one_line(tmp_path: Path) -> None:
    run = _merged_without_names(tmp_path)
    db = tmp_path / "db.duckdb"
    result = runner.invoke(app, ["ingest", str(run), "--db", str(db), "--workers", "1"])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "cannot be told apart" in message and "split it into one trace per rank" in message
    assert len(message.splitlines()) == 1
    with open_database(Path(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM events").fetchone() == (0,)


def test_two_processes_naming_one_rank_are_refused(exported: tuple[Path, Path], tmp_path: Path) -> None:
    doc = json.loads(gzip.decompress(exported[1].read_bytes()))
    for event in doc["traceEvents"]:
        if event.get("name") == "process_name":
            event["args"]["name"] = "rank 0"
    path = tmp_path / "same.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match="name the same rank"):
        parse_kineto_ranks(path)
