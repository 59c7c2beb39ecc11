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
