"""Shared fixtures: paths to the real traces in ../shared and a fresh database per test.

The ingested runs and trained workload runs are made once per ``pytest`` run, also when pytest-xdist runs the tests in
several worker processes: the first worker to ask for one trains it under a file lock in the run's
common temporary directory, and the others wait for it and read it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tracecal.workload import WorkloadConfig

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


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory every process of this ``pytest`` run sees: under pytest-xdist the parent
    of the workers' own directories, else the session's."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def built_once(path: Path) -> Iterator[bool]:
    """Hold ``path``'s lock (other test processes wait) and say whether ``path`` is still to be built.
    A builder makes ``path`` last (a rename), so that a failed build leaves nothing that looks done."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield not path.exists()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A database path in a fresh temporary directory (the file does not exist yet)."""
    return tmp_path / "test.duckdb"


@pytest.fixture(scope="session")
def template_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache directory for the whole session (the empty-database template is built once)."""
    return tmp_path_factory.mktemp("tracecal-cache")


@pytest.fixture(scope="session")
def ingested_copy(tmp_path_factory: pytest.TempPathFactory, template_cache: Path) -> Callable[..., Path]:
    """``ingested_copy(*runs, cluster=None)`` -> a new database holding ``runs``, ingested (one worker)
    once per ``pytest`` run and copied for each caller: a module that writes predictions or more runs
    into its copy cannot change another's, and no run is ingested twice."""
    from tracecal.pipeline.ingest import IngestOptions, ingest_runs
    from tracecal.sql.connection import open_database
    from tracecal.sql.event_store import copy_database

    def copy(*runs: Path, cluster: str | None = None) -> Path:
        key = hashlib.sha1(repr(([str(run) for run in runs], cluster)).encode()).hexdigest()[:12]
        folder = session_root(tmp_path_factory) / "ingested" / f"{runs[0].name}-{key}"
        with built_once(folder) as to_build:
            if to_build:  # ingested beside the folder, which then takes its name
                staging = folder.with_name(f".{folder.name}.partial")
                shutil.rmtree(staging, ignore_errors=True)
                with open_database(staging / "ingested.duckdb", cache_dir=template_cache) as con:
                    ingest_runs(con, list(runs), IngestOptions(cluster=cluster, workers=1))
                staging.rename(folder)
        target = tmp_path_factory.mktemp("ingested_copy") / f"{runs[0].name}.duckdb"
        return copy_database(folder / "ingested.duckdb", target)

    return copy


@pytest.fixture(autouse=True)
def _cache_outside_home(template_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands under test keep their cache in the session's temporary directory, not in ~/.cache."""
    monkeypatch.setenv("TRACECAL_CACHE_DIR", str(template_cache))


def workload_run_args(cfg: WorkloadConfig, out: Path) -> list[str]:
    """``tracecal workload run`` arguments that train ``cfg`` into ``out``."""
    return ["workload", "run", "--pp", str(cfg.pp), "--tp", str(cfg.tp), "--dp", str(cfg.dp),
            "--layers", str(cfg.layers), "--hidden", str(cfg.hidden), "--heads", str(cfg.heads),
            "--seq", str(cfg.seq), "--vocab", str(cfg.vocab), "--micro-batches", str(cfg.micro_batches),
            "--micro-batch-size", str(cfg.micro_batch_size), "--steps", str(cfg.steps),
            "--bucket-bytes", str(cfg.bucket_bytes), "--timeout-s", str(cfg.timeout_s),
            "--threads", str(cfg.threads), *(["--vocab-parallel"] if cfg.vocab_parallel else []),
            "--out", str(out)]  # fmt: skip


@dataclass
class TinyLayoutRuns:
    """The runs of ``TINY_LAYOUTS`` (pp2, tp2, dp2, pp2tp2 at ``TINY`` size), each trained once per
    ``pytest`` run when first asked for: ``tiny_layouts("tp2")`` -> its run directory. PP2 is trained
    through ``tracecal workload run`` (``cli_output`` keeps what it printed), the others through
    ``run_local``. Tests only read the runs."""

    root: Path

    @property
    def cli_output(self) -> dict[str, str]:
        """What ``tracecal workload run`` printed, per layout it trained."""
        return {file.stem: file.read_text() for file in (self.root / "cli_output").glob("*.txt")}

    def __call__(self, layout: str) -> Path:
        from typer.testing import CliRunner

        from tracecal.cli.main import app
        from tracecal.workload import TINY_LAYOUTS, run_local

        cfg, out = TINY_LAYOUTS[layout], self.root / f"gpt_tiny_{layout}"
        with built_once(out) as to_build:
            if to_build and layout == "pp2":
                result = CliRunner().invoke(app, workload_run_args(cfg, out))
                assert result.exit_code == 0, result.output
                (self.root / "cli_output").mkdir(exist_ok=True)
                (self.root / "cli_output" / f"{layout}.txt").write_text(result.output)
            elif to_build:
                run_local(cfg, out)
        return out


@pytest.fixture(scope="session")
def tiny_layouts(tmp_path_factory: pytest.TempPathFactory) -> TinyLayoutRuns:
    """The reference workload's CI layouts, trained once per ``pytest`` run (≈ 5–10 s each on two cores)."""
    return TinyLayoutRuns(session_root(tmp_path_factory) / "tiny_layouts")


@pytest.fixture(scope="session")
def tiny_workload(tmp_path_factory: pytest.TempPathFactory, tiny_layouts: TinyLayoutRuns) -> Callable[[int, int], Path]:
    """Runs of the reference workload (local gloo ranks, ``TINY``: 2 layers, 4 steps), each trained once
    per session: ``tiny_workload(pp, hidden)`` -> its run directory (≈ 5 s for PP2 or one rank at hidden
    64, ≈ 11 s for one rank at 512 on two cores). A configuration that is one of ``TINY_LAYOUTS`` is
    that layout's run."""
    from tracecal.workload import TINY, TINY_LAYOUTS, run_local

    root = session_root(tmp_path_factory) / "tiny_workload"

    def run(pp: int, hidden: int) -> Path:
        cfg = replace(TINY, pp=pp, hidden=hidden)
        layout = next((name for name, c in TINY_LAYOUTS.items() if c == cfg), None)
        if layout is not None:
            return tiny_layouts(layout)
        out = root / f"gpt_tiny_pp{pp}_h{hidden}"
        with built_once(out) as to_build:
            if to_build:
                run_local(cfg, out)
        return out

    return run
