"""Shared fixtures: paths to the real traces in ../shared and a fresh database per test."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SHARED_DATA = SHARED / "data"
KINETO = SHARED_DATA / "traces" / "kineto"
NSYS = SHARED_DATA / "traces" / "nsys"
INVALID = SHARED_DATA / "traces" / "invalid"
GPUMODELING25 = SHARED_DATA / "gpumodeling25"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A database path in a fresh temporary directory (the file does not exist yet)."""
    return tmp_path / "test.duckdb"


@pytest.fixture(scope="session")
def template_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache directory for the whole session (the empty-database template is built once)."""
    return tmp_path_factory.mktemp("tracecal-cache")


@pytest.fixture(autouse=True)
def _cache_outside_home(template_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands under test keep their cache in the session's temporary directory, not in ~/.cache."""
    monkeypatch.setenv("TRACECAL_CACHE_DIR", str(template_cache))


@pytest.fixture(scope="session")
def tiny_pp2_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Two runs of the reference workload (PP2, two local gloo ranks, 4 steps) that differ only in the
    hidden size (64 and 256), trained once per session (≈ 5 s each): hidden -> run directory."""
    from dataclasses import replace

    from tracecal.samplers.workload import WorkloadConfig, run_local

    tiny = WorkloadConfig(
        layers=2, hidden=64, heads=4, seq=32, vocab=256, micro_batches=4, micro_batch_size=2, steps=4, timeout_s=120
    )
    root = tmp_path_factory.mktemp("tiny_pp2")
    return {h: run_local(replace(tiny, pp=2, hidden=h), root / f"gpt_tiny_pp2_h{h}").out_dir for h in (64, 256)}
