"""Finding a run's rank traces and what the run says about itself (see docs/discovery.md).

A run is a directory. Rank files are found anywhere below it (flat, or nested per rank as
``tensorboard_trace_handler`` writes them under GPT-NeoX/DeepSpeed); which files those are, and which
folders are a run without rank files, the registered sources say (``tracecal.sources.registry``).
The rank of a file comes from the trace (``distributedInfo.rank``, known only after parsing) or from
its path; the parallel layout from flags, the run name, a ``PP4_MP4_DP8_ZERO1`` sub-directory, a
GPT-NeoX/Megatron log, a ``run.json``, or the process groups recorded in the traces — the first that
answers wins.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracecal.errors import InputNotFoundError, RankConflictError, TraceFormatError
from tracecal.sources.registry import Source, rank_file_patterns, registered, source_of_file
from tracecal.vocabulary import ParallelLayout

if TYPE_CHECKING:
    from tracecal.ingest.trace import ParsedRank

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank[-_]?|worker)(\d+)(?![0-9])", re.IGNORECASE)
_RUN_NAME_LAYOUT = re.compile(r"^(?P<model>.+?)_(?P<pp>\d+)_(?P<tp>\d+)_(?P<dp>\d+)(?:_(?P<nodes>\d+)_(?P<gpn>\d+))?$")
_LAYOUT_DIR = re.compile(r"^PP(?P<pp>\d+)_(?:MP|TP)(?P<tp>\d+)_DP(?P<dp>\d+)(?:_|$)", re.IGNORECASE)
_LOG_ARG = re.compile(r"^\s*(pipe_parallel_size|model_parallel_size|global_num_gpus)\s+\.+\s+(\d+)", re.MULTILINE)


@dataclass(frozen=True)
class TraceFile:
    """One trace file of a run: its format and the rank its path implies (None when it doesn't)."""

    path: Path
    format: str
    path_rank: int | None
    size_bytes: int

    @property
    def content_bytes(self) -> int:
        """Uncompressed size: a gzip file's ISIZE trailer (exact below 4 GiB, where it wraps; a file that
        large is worth a worker anyway), else the size on disk."""
        if not self.path.name.endswith(".gz") or self.size_bytes < 18:
            return self.size_bytes
        with self.path.open("rb") as handle:
            handle.seek(-4, 2)
            return max(int.from_bytes(handle.read(4), "little"), self.size_bytes)


@dataclass(frozen=True)
class DiscoveredRun:
    """A run directory's trace files and the layout the directory itself reveals."""

    run_dir: Path
    files: tuple[TraceFile, ...]
    layout: ParallelLayout = field(default_factory=ParallelLayout)
    folder: Path | None = None
    """The folder a folder source reads the run from, when the run has no rank files."""
    folder_format: str | None = None
    """The name of that folder source."""

    @property
    def format(self) -> str:
        if self.folder_format is not None:
            return self.folder_format
        formats = {f.format for f in self.files}
        return formats.pop() if len(formats) == 1 else "mixed"

    @property
    def name(self) -> str:
        """The run's default id: the directory name, or a single trace file's name as its source shortens
        it (``Source.run_name``: without the format's suffix)."""
        source = source_of_file(self.run_dir) if self.run_dir.is_file() else None
        return source.run_name(self.run_dir) if source is not None else self.run_dir.name

    @property
    def input_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


def trace_format(path: Path) -> str | None:
    """The name of the source whose rank files ``path`` is named like, or None (not a rank file)."""
    source = source_of_file(path)
    return source.name if source is not None else None


def run_folder(path: Path) -> tuple[Source, Path] | None:
    """The first folder source that reads a run at ``path``, and the folder it reads, or None."""
    for source in registered():
        folder = source.run_folder(path)
        if folder is not None:
            return source, folder
    return None


def rank_from_path(path: Path, run_dir: Path) -> int | None:
    """Rank implied by a file's path below the run: ``rank-N``/``rankN``/``workerN`` in the file name
    or a directory name, else a purely numeric directory (``RUN/<x>/<rank>/host_pid.ts.pt.trace.json``)."""
    relative = path.relative_to(run_dir) if path.is_relative_to(run_dir) else Path(path.name)
    for part in reversed(relative.parts):
        match = _RANK_IN_NAME.search(part)
        if match:
            return int(match.group(1))
    for part in reversed(relative.parts[:-1]):
        if part.isdigit():
            return int(part)
    return None


def discover_run(run_dir: Path, layout_flags: ParallelLayout | None = None) -> DiscoveredRun:
    """Find the rank files of one run (or the folder a folder source reads it from) and the layout its
    flags, name, log or run.json give.

    Raises:
        InputNotFoundError: the path does not exist, is empty, or holds no rank files and is no source's
            run folder.
    """
    if not run_dir.exists():
        raise InputNotFoundError(f"{run_dir} does not exist; give a run directory of rank traces")
    if run_dir.is_file():
        files = [run_dir] if trace_format(run_dir) else []
        root = run_dir.parent
    else:
        root = run_dir
        files = _without_shadowed(sorted(p for p in run_dir.rglob("*") if p.is_file() and trace_format(p)), run_dir)
        if not files and not any(run_dir.iterdir()):
            raise InputNotFoundError(f"{run_dir} is empty; give a directory holding one trace per rank")
        found = run_folder(run_dir) if not files else None
        if found is not None:
            source, folder = found
            return DiscoveredRun(
                run_dir=run_dir.resolve(),
                files=(),
                layout=run_layout(run_dir),
                folder=folder,
                folder_format=source.name,
            )
    if not files:
        patterns = ", ".join(rank_file_patterns())
        folders = "; ".join(s.description for s in registered() if s.folder)
        raise InputNotFoundError(f"no trace files in {run_dir} (looked for {patterns}; or a run folder: {folders})")
    traces = tuple(
        TraceFile(
            path=p.resolve(),
            format=_source(p).name,
            path_rank=rank_from_path(p, root),
            size_bytes=p.stat().st_size,
        )
        for p in files
    )
    return DiscoveredRun(run_dir=run_dir.resolve(), files=traces, layout=run_layout(run_dir, layout_flags))


def _without_shadowed(files: list[Path], run_dir: Path) -> list[Path]:
    """Drop files under hidden directories (a reader's cache, such as the Nsight reader's
    ``.tracecal-nsys`` exports) and files their source says another file beside them stands for
    (``Source.shadowed_by``: an ``X.nsys-rep`` whose export ``X.sqlite`` sits beside it)."""
    kept = [p for p in files if not any(part.startswith(".") for part in p.relative_to(run_dir).parts[:-1])]
    beside: dict[Path, set[str]] = {}
    for p in kept:
        beside.setdefault(p.parent, set()).add(p.name.lower())
    return [p for p in kept if not _source(p).is_shadowed(p, beside[p.parent])]


def _source(path: Path) -> Source:
    source = source_of_file(path)
    assert source is not None  # the files were chosen by their source
    return source


def run_layout(run_dir: Path, flags: ParallelLayout | None = None) -> ParallelLayout:
    """The parallel layout from the strongest source that answers: flags > run name > layout
    sub-directory > training log > run.json. Flags given alone (``--nodes 4``) override single
    fields of the layout found; ``run.json`` is always kept as metadata."""
    is_dir = run_dir.is_dir()
    metadata = _read_run_json(run_dir) if is_dir else None
    named = layout_from_run_name(run_dir.name)
    candidates: list[Callable[[], ParallelLayout | None]] = [  # tried in order, lazily: logs can be large
        lambda: named,
        lambda: _layout_from_subdirectory(run_dir) if is_dir else None,
        lambda: _layout_from_log(run_dir) if is_dir else None,
        lambda: _layout_from_run_json(metadata) if metadata is not None else None,
    ]
    found = next((c for c in (source() for source in candidates) if c is not None and c.known), ParallelLayout())
    layout = flags.merged(found) if flags is not None else found
    if flags is not None and flags.known:
        layout = replace(layout, source="flags")
    if layout.model is None and named is not None:
        layout = replace(layout, model=named.model)
    return replace(layout, metadata=metadata)


def layout_from_run_name(name: str) -> ParallelLayout | None:
    """``MODEL_PP_TP_DP[_NODES_GPUSPERNODE]``, e.g. ``GPT_20B_4_4_8_32_4`` -> PP 4, TP 4, DP 8, 32×4."""
    match = _RUN_NAME_LAYOUT.match(name)
    if match is None:
        return None
    nodes, gpn = match.group("nodes"), match.group("gpn")
    return ParallelLayout(
        pp=int(match.group("pp")),
        tp=int(match.group("tp")),
        dp=int(match.group("dp")),
        nodes=int(nodes) if nodes else None,
        gpus_per_node=int(gpn) if gpn else None,
        model=match.group("model"),
        source="run_name",
    )


def _layout_from_subdirectory(run_dir: Path) -> ParallelLayout | None:
    for path in sorted(run_dir.rglob("*")):
        match = _LAYOUT_DIR.match(path.name) if path.is_dir() else None
        if match:
            return ParallelLayout(
                pp=int(match.group("pp")), tp=int(match.group("tp")), dp=int(match.group("dp")), source="run_name"
            )
    return None


def _layout_from_log(run_dir: Path) -> ParallelLayout | None:
    """GPT-NeoX/Megatron argument dumps: ``pipe_parallel_size ...... 4``; DP = GPUs / (PP × TP)."""
    for log in sorted(run_dir.rglob("*.log")):
        with log.open(errors="replace") as handle:
            head = handle.read(2_000_000)  # argument dumps are at the top of the log
        values = {key: int(value) for key, value in _LOG_ARG.findall(head)}
        if "pipe_parallel_size" in values and "model_parallel_size" in values:
            pp, tp = values["pipe_parallel_size"], values["model_parallel_size"]
            gpus = values.get("global_num_gpus")
            return ParallelLayout(pp=pp, tp=tp, dp=gpus // (pp * tp) if gpus else None, source="log")
    return None


def _read_run_json(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "run.json"
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: invalid JSON ({exc}); fix or remove run.json") from exc
    if not isinstance(value, dict):
        raise TraceFormatError(f"{path}: expected a JSON object of run settings (pp, tp, dp, model, ...)")
    return value


def _layout_from_run_json(metadata: dict[str, Any]) -> ParallelLayout | None:
    def number(key: str) -> int | None:
        value = metadata.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    layout = ParallelLayout(
        pp=number("pp"),
        tp=number("tp"),
        dp=number("dp"),
        nodes=number("nodes"),
        gpus_per_node=number("gpus_per_node"),
        model=metadata.get("model") if isinstance(metadata.get("model"), str) else None,
        source="run_json",
    )
    return layout if layout.known else None


_PG_ROLE_WORDS = {"pp": ("pipe", "pp"), "tp": ("tensor", "tp", "model_parallel", "mp"), "dp": ("data", "dp")}


def layout_from_process_groups(process_groups: list[dict[str, Any]]) -> ParallelLayout | None:
    """PP/TP/DP from ``distributedInfo.pg_config`` when the groups are named for their role
    (``pg_desc`` such as ``mesh_tp``, ``tensor_parallel``, ``dp``); unnamed groups say nothing."""
    sizes: dict[str, int] = {}
    for group in process_groups:
        desc = str(group.get("pg_desc") or "").lower()
        tokens = set(re.split(r"[^a-z]+", desc)) | {desc}
        size = group.get("pg_size") or len(group.get("ranks") or [])
        for role, words in _PG_ROLE_WORDS.items():
            if any(w in tokens or desc.startswith(w + "_") for w in words) and isinstance(size, int):
                sizes.setdefault(role, size)
    if "tp" not in sizes and "pp" not in sizes:
        return None
    return ParallelLayout(pp=sizes.get("pp", 1), tp=sizes.get("tp", 1), dp=sizes.get("dp"), source="pg_config")


def world_size_of(trace_world_sizes: list[int | None], ranks_found: int) -> int:
    """``distributedInfo.world_size`` when the traces agree on one, else the rank files found."""
    sizes = {w for w in trace_world_sizes if w}
    return sizes.pop() if len(sizes) == 1 else ranks_found


def missing_ranks(ranks: list[int], world_size: int) -> list[int]:
    """Ranks below ``world_size`` with no trace (a warning, not an error: runs often keep a subset)."""
    present = set(ranks)
    return [r for r in range(world_size) if r not in present]


def resolve_rank(trace_file: TraceFile, parsed: ParsedRank, ranks_in_file: int, files: int) -> tuple[int, str]:
    """The global rank of one parsed rank of ``trace_file`` and where it came from: distributedInfo (or
    the Nsight reader's answer) > the path > rank 0 for a lone single-rank trace of a one-file run.

    Raises:
        RankConflictError: none of them tells.
    """
    if parsed.rank is not None:
        return parsed.rank, parsed.rank_source or "trace"
    if trace_file.path_rank is not None and ranks_in_file == 1:
        return trace_file.path_rank, "path"
    if files == 1 and ranks_in_file == 1:  # a single-process capture (no torch.distributed)
        return 0, "single_file"
    raise RankConflictError(
        f"{trace_file.path}: cannot tell which rank this is (no distributedInfo.rank in the trace and no "
        "rank-N, rankN, workerN or numeric rank directory in its path); rename it, e.g. rank-0.json.gz"
    )
