"""Run the workload's ranks as local processes (CPU laptops and CI), or parse the rank command line.

``run_local`` does what ``torchrun --nproc-per-node WORLD`` would: it picks a free port, starts one
``python -m tracecal.workload`` process per rank with the env:// variables set, and waits.
The ranks write into a staging directory beside ``out`` that becomes ``out`` only when every rank
succeeded, so a failed run leaves nothing half-written. If a rank fails, the others (which would
wait for it in their next collective) are stopped and a ``WorkloadError`` names the rank and its error.

Standard library only: importing this module (and the package) never imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tracecal.errors import WorkloadError
from tracecal.workload.config import WorkloadConfig

ERROR_FILE_ENV = "TRACECAL_WORKLOAD_ERROR_FILE"
"""Where a failing rank writes its error as JSON (``time``, ``type``, ``message``) for ``run_local``."""

PORT_ATTEMPTS = 3
"""Launches tried when the rendezvous port turns out to be taken."""

GRACE_SECONDS = 5.0
"""How long the other ranks get to finish after one failed, before they are terminated."""


@dataclass(frozen=True)
class LocalRun:
    """A finished local run: where it is, its run.json, and the launcher's wall time in seconds."""

    out_dir: Path
    run: dict[str, Any]
    wall_seconds: float


def config_args(cfg: WorkloadConfig) -> list[str]:
    """The command-line arguments that reproduce ``cfg`` for ``python -m tracecal.workload``."""
    args: list[str] = []
    for f in fields(cfg):
        args += [f"--{f.name.replace('_', '-')}", str(getattr(cfg, f.name))]
    return args


def _parse_bool(text: str) -> bool:
    """``True``/``False`` as ``config_args`` writes them (also 1/0, yes/no)."""
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def argument_parser() -> argparse.ArgumentParser:
    """Parser of the rank command line: one option per ``WorkloadConfig`` field, plus ``--out``."""
    parser = argparse.ArgumentParser(
        prog="python -m tracecal.workload",
        description="Reference GPT training workload (PP/TP/DP) profiled with torch.profiler. Under torchrun "
        "each process is one rank; without torchrun the ranks are spawned locally on this machine.",
    )
    parser.add_argument("--out", type=Path, required=True, help="run directory for rank traces and run.json")
    parser.add_argument("--force", action="store_true", help="(local launch) replace traces already in --out")
    for f in fields(WorkloadConfig):
        kind: Any = _parse_bool if isinstance(f.default, bool) else type(f.default)
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default, help=f"default {f.default}")
    return parser


def config_from_args(ns: argparse.Namespace) -> WorkloadConfig:
    return WorkloadConfig(**{f.name: getattr(ns, f.name) for f in fields(WorkloadConfig)})


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_taken(message: str) -> bool:
    return "EADDRINUSE" in message or "address already in use" in message.lower()


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise WorkloadError(f"--out {out} is a file; give a directory for the run")
    if not out.exists() or force:
        return
    ours = [p.name for p in out.iterdir() if p.name == "run.json" or p.name.endswith(".pt.trace.json.gz")]
    if ours:
        raise WorkloadError(
            f"{out} already holds a run ({ours[0]}); pass --force to replace it or choose another --out"
        )


def _rank_error(error_file: Path, log: Path) -> tuple[float, str]:
    """When a failed rank reported its error (unix time; infinity if it did not) and the one-line
    error from its error file; a rank that died before writing one gives the last line of its stderr."""
    try:
        report = json.loads(error_file.read_text())
        return float(report["time"]), f"{report['type']}: {report['message']}"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    tail = [line for line in lines if line.strip()]
    return float("inf"), tail[-1].strip() if tail else "no output"


def _report_error(exc: BaseException) -> None:
    """Write a failing rank's error where ``run_local`` reads it, or to stderr under torchrun."""
    message = str(exc).splitlines()[0] if str(exc) else ""
    error_file = os.environ.get(ERROR_FILE_ENV)
    if error_file:
        report = {"time": time.time(), "type": type(exc).__name__, "message": message}
        Path(error_file).write_text(json.dumps(report))
    elif isinstance(exc, WorkloadError):
        print(f"error: {type(exc).__name__}: {message}", file=sys.stderr, flush=True)


def run_local(cfg: WorkloadConfig, out: Path, *, force: bool = False, timeout_s: float | None = None) -> LocalRun:
    """Train ``cfg`` with ``cfg.world_size`` local processes and leave the run in ``out``.

    Args:
        cfg: the workload; validated before anything starts.
        out: run directory to create; it receives ``rank{R}.pt.trace.json.gz`` and ``run.json``.
        force: replace a run already in ``out`` (only its trace files and run.json are removed).
        timeout_s: give up (and stop every rank) after this many seconds; default ``cfg.timeout_s``.

    Returns:
        The finished run.

    Raises:
        WorkloadError: inconsistent configuration, ``out`` already holds a run, a rank failed (the
            message names the first rank that failed and its error), or the run timed out.
    """
    cfg.validate()
    out = Path(out)
    _check_out(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; the run directory should not be
    limit = cfg.timeout_s if timeout_s is None else timeout_s
    started = time.perf_counter()
    try:
        for attempt in range(PORT_ATTEMPTS):
            try:
                with tempfile.TemporaryDirectory(prefix="tracecal-workload-logs-") as logs:
                    _spawn_and_wait(cfg, staging, Path(logs), limit)
                break
            except WorkloadError as exc:
                # free_port() can lose a race with another process binding the same port before rank 0's
                # store does; that is worth another port, anything else is not.
                if attempt + 1 == PORT_ATTEMPTS or not _port_taken(str(exc)):
                    raise
                for p in staging.iterdir():
                    if p.is_dir():
                        shutil.rmtree(p)
                    else:
                        p.unlink()
        _publish(staging, out, force)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    run = json.loads((out / "run.json").read_text())
    return LocalRun(out_dir=out, run=run, wall_seconds=time.perf_counter() - started)


def _spawn_and_wait(cfg: WorkloadConfig, staging: Path, logs: Path, limit: float) -> None:
    world = cfg.world_size
    env = dict(os.environ)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        # One rank's share of the cores, for OpenMP/MKL before torch.set_num_threads takes over.
        OMP_NUM_THREADS=str(cfg.threads or max(1, (os.cpu_count() or 1) // world)),
    )
    cmd = [sys.executable, "-m", "tracecal.workload", *config_args(cfg), "--out", str(staging)]
    procs: list[subprocess.Popen[bytes]] = []
    log_paths = [logs / f"rank{r}.log" for r in range(world)]
    error_paths = [logs / f"rank{r}.error.json" for r in range(world)]
    try:
        for rank in range(world):
            with open(log_paths[rank], "wb") as log:
                procs.append(
                    subprocess.Popen(
                        cmd,
                        env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank), ERROR_FILE_ENV: str(error_paths[rank])},
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                    )
                )
        deadline = time.monotonic() + limit
        failing = False
        while any(p.poll() is None for p in procs):
            if not failing and any(p.returncode not in (None, 0) for p in procs):
                # The others will fail in their next collective; give them a moment to say so.
                failing = True
                deadline = min(deadline, time.monotonic() + GRACE_SECONDS)
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
        if failed:
            # The cause is the rank that reported first; the rest lost their connection to it.
            errors = {r: _rank_error(error_paths[r], log_paths[r]) for r in failed}
            rank = min(failed, key=lambda r: (errors[r][0], r))
            raise WorkloadError(f"workload rank {rank} failed (exit {procs[rank].returncode}): {errors[rank][1]}")
        if any(p.poll() is None for p in procs):
            raise WorkloadError(
                f"workload did not finish within {limit:.0f} s; use smaller sizes or a larger --timeout-s"
            )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _publish(staging: Path, out: Path, force: bool) -> None:
    """Move the finished run from the staging directory to ``out``."""
    if not (staging / "run.json").exists():
        raise WorkloadError(f"the ranks finished but wrote no run.json to {staging}")
    if not out.exists():
        staging.rename(out)
        return
    if force:
        for p in out.iterdir():
            if p.name == "run.json" or p.name.endswith(".pt.trace.json.gz"):
                p.unlink()
    for p in staging.iterdir():
        shutil.move(str(p), out / p.name)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tracecal.workload``: one rank under torchrun, else a local launch."""
    ns = argument_parser().parse_args(argv)
    cfg = config_from_args(ns)
    if "RANK" in os.environ:
        try:
            from tracecal.workload.train import train_rank

            train_rank(cfg, ns.out)
        except Exception as exc:
            # The error for run_local, then the traceback for a human reading torchrun's log.
            _report_error(exc)
            if not isinstance(exc, WorkloadError):
                raise
            return 2
        return 0
    try:
        result = run_local(cfg, ns.out, force=ns.force)
    except WorkloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{result.out_dir}: {cfg.world_size} ranks, losses {result.run['losses']}, {result.wall_seconds:.1f} s")
    return 0
