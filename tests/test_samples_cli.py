"""`tracecal samples import|export|list|flag` through typer's CliRunner."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import GPUMODELING25
from tracecal.cli.common import stdout
from tracecal.cli.main import app
from tracecal.sql.connection import open_database

runner = CliRunner()
DEVICE = "NVIDIAA100-SXM4-80GB"


@pytest.fixture
def published(tmp_path: Path) -> Path:
    """Two small published files (layernorm: 351 rows x fwd/bwd; all_gather 8x1: 88 rows) in one dir."""
    out = tmp_path / "published"
    out.mkdir()
    shutil.copy(GPUMODELING25 / "samples" / "perlmutter_a100_compute" / f"{DEVICE}_layernorm_fp16.csv", out)
    shutil.copy(GPUMODELING25 / "samples" / "perlmutter_a100_nccl" / f"{DEVICE}_allgather_large_fp16_8_1.csv", out)
    return out


def test_import_list_export_and_import_elsewhere(
    published: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stdout, "width", 160)  # tables unfolded, so names can be asserted whole
    db, other = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    imported = runner.invoke(app, ["samples", "import", str(published), "--cluster", "perlmutter", "--db", str(db)])
    assert imported.exit_code == 0, imported.output
    assert "imported 790 samples from 2 files" in imported.output.replace("\n", " ")

    listed = runner.invoke(app, ["samples", "list", "--db", str(db)])
    assert listed.exit_code == 0, listed.output
    assert "layernorm" in listed.output and "allgather_large" in listed.output
    assert "8x1" in listed.output  # the topologies a comm op covers
    assert "790" in listed.output

    out = tmp_path / "perlmutter.parquet"
    exported = runner.invoke(app, ["samples", "export", "--cluster", "perlmutter", "-o", str(out), "--db", str(db)])
    assert exported.exit_code == 0 and "wrote 790 samples" in exported.output
    moved = runner.invoke(app, ["samples", "import", str(out), "--format", "parquet", "--db", str(other)])
    assert moved.exit_code == 0, moved.output
    with open_database(other, read_only=True) as con:
        assert con.execute("select count(*), count(distinct family) from samples").fetchall() == [(790, 2)]

    reflagged = runner.invoke(app, ["samples", "flag", "--cluster", "perlmutter", "--db", str(other)])
    assert reflagged.exit_code == 0 and "cluster perlmutter: flagged" in reflagged.output


def test_list_of_an_empty_database_says_what_to_do(db_path: Path, template_cache: Path) -> None:
    with open_database(db_path, cache_dir=template_cache):
        pass
    result = runner.invoke(app, ["samples", "list", "--db", str(db_path)])
    assert result.exit_code == 0
    assert "no samples in" in result.output and "tracecal samples import" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["samples", "import", "{missing}", "--cluster", "p"], "does not exist"),
        (["samples", "import", "{published}"], "--cluster NAME is required"),
        (["samples", "import", "{published}", "--cluster", "p", "--format", "csv"], "unknown --format 'csv'"),
        (["samples", "export", "-o", "{tmp}/x.parquet", "--cluster", "nope"], "no samples of cluster 'nope'"),
        (["samples", "flag", "--cluster", "nope"], "no samples for cluster 'nope'"),
    ],
)
def test_bad_input_is_one_line_with_exit_2(
    args: list[str], message: str, published: Path, tmp_path: Path, db_path: Path, template_cache: Path
) -> None:
    with open_database(db_path, cache_dir=template_cache):
        pass
    values = {"missing": str(tmp_path / "missing"), "published": str(published), "tmp": str(tmp_path)}
    result = runner.invoke(app, [a.format(**values) for a in args] + ["--db", str(db_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output.replace("\n", " ")
    assert "Traceback" not in result.output


def test_every_samples_command_has_help() -> None:
    for command in ("import", "export", "list", "flag"):
        result = runner.invoke(app, ["samples", command, "--help"])
        assert result.exit_code == 0
        assert len(result.output.strip()) > 50
