"""Shared fixtures: paths to the real traces in ../shared and a fresh database per test."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SHARED_DATA = SHARED / "data"
KINETO = SHARED_DATA / "traces" / "kineto"
NSYS = SHARED_DATA / "traces" / "nsys"
INVALID = SHARED_DATA / "traces" / "invalid"
GPUMODELING25 = SHARED_DATA / "gpumodeling25"


_PROGRESS_LINE = re.compile(r"^.+ \d+/\d+ \(\d+ s\)$")
"""A progress line as commands print them off a terminal (``cli.common.LineProgress``): ``run 0/4 (0 s)``."""


def without_progress(output: str) -> list[str]:
    """The lines of a command's output that are not progress lines: what it says about its result."""
    return [line for line in output.strip().splitlines() if not _PROGRESS_LINE.match(line)]


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
def tiny_workload(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, int], Path]:
    """Runs of the reference workload (local gloo ranks, 2 layers, 4 steps), each trained once per
    session: ``tiny_workload(pp, hidden)`` -> its run directory (≈ 5 s for PP2 or one rank at hidden
    64, ≈ 11 s for one rank at 512 on two cores)."""
    from dataclasses import replace

    from tracecal.workload import WorkloadConfig, run_local

    tiny = WorkloadConfig(
        layers=2, hidden=64, heads=4, seq=32, vocab=256, micro_batches=4, micro_batch_size=2, steps=4, timeout_s=120
    )
    root = tmp_path_factory.mktemp("tiny_workload")
    made: dict[tuple[int, int], Path] = {}

    def run(pp: int, hidden: int) -> Path:
        if (pp, hidden) not in made:
            name = f"gpt_tiny_pp{pp}_h{hidden}"
            made[pp, hidden] = run_local(replace(tiny, pp=pp, hidden=hidden), root / name).out_dir
        return made[pp, hidden]

    return run
