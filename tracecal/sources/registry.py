"""The one registry of sources: what each recognises and where its reader is (see docs/sources.md).

A source is one input format. It is declared as a ``Source``: the rank files it recognises by name,
or the run folder it recognises by its parts, and the dotted references (``"package.module:function"``)
of the functions that read them. Discovery asks the registry which files and folders are a run; the
ingest calls the reader the registry names. Neither knows any format: the built-in sources (Kineto,
Nsight Systems, GPUModeling25 decoded runs) are registered exactly as an outside package registers
its own, and the registry imports no source package until one is used.

An outside package adds a source with an entry point in the group ``tracecal.sources`` naming its
``Source`` object, e.g. in its ``pyproject.toml``::

    [project.entry-points."tracecal.sources"]
    mytrace = "mytrace_tracecal:SOURCE"

This module imports nothing else of tracecal, so every layer may use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from tracecal.errors import TracecalError

ENTRY_POINT_GROUP = "tracecal.sources"
"""The entry-point group outside packages register their ``Source`` objects in."""

BUILT_IN = (
    "tracecal.sources.kineto:SOURCE",
    "tracecal.sources.nsys:SOURCE",
    "tracecal.sources.gpumodeling25:SOURCE",
)
"""The sources tracecal ships, as entry-point values; asked in this order, before outside ones."""


@dataclass(frozen=True)
class Source:
    """One input format.

    A *file source* reads rank files (one or several ranks per file, parsed in worker processes): it
    sets ``suffixes`` and ``parse``. A *folder source* reads a whole run folder that holds no rank files
    (tables and logs, rebuilt into ranks in the loading process): it sets ``folder`` and ``read_folder``.

    Attributes:
        name: the format's name, stored in ``runs.format`` and ``TraceFile.format``.
        description: what the source reads, in a few words (for messages and docs).
        suffixes: endings of the file names of its rank files (compared in lower case).
        patterns: how messages show those files to a user (default: ``*`` + each suffix).
        run_name_endings: what a rank file's name also loses, after its suffix, when the file is a run by
            itself and its name the run's default id (``run_name``): Kineto's ``.pt.trace``.
        not_rank_files: file names that end like a rank file but are not one (``run.json``).
        shadowed_by: ``{ending: other endings}``: a file ending in ``ending`` is skipped when a file of the
            same stem ending in one of the others sits beside it (a report and its export are one rank).
        parse: ``"module:function"``, ``function(path, spill_dir) -> list[ParsedRank]``: one rank file's
            ranks (``tracecal.ingest.trace``); with ``spill_dir`` a rank too large to hold may go to an
            ``EventsFile`` there. Raises ``TracecalError`` subclasses naming the file.
        folder: ``"module:function"``, ``function(path) -> Path | None``: the folder a run at ``path`` is
            read from (``path`` itself or one below it) when ``path`` is one of this source's runs.
        read_folder: ``"module:function"``, ``function(folder, layout) -> FolderRun``
            (``tracecal.ingest.trace``): the run's ranks, the layout it states, notes and the files read;
            ``layout`` is what discovery found (flags, run name), for values the folder does not state.
        relayout: ``"module:callable"``, ``callable(folder) -> SourceRelayout``
            (``tracecal.predict.relayout_source``), optional: one of this source's stored runs (its
            ``run_folder``, or for a file source its stored path) as ``predict --layout`` and ``search``
            rebuild it at other parallel layouts. None: its runs are not re-laid out.
    """

    name: str
    description: str
    suffixes: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    run_name_endings: tuple[str, ...] = ()
    not_rank_files: frozenset[str] = frozenset()
    shadowed_by: tuple[tuple[str, tuple[str, ...]], ...] = ()
    parse: str | None = None
    folder: str | None = None
    read_folder: str | None = None
    relayout: str | None = None

    def __post_init__(self) -> None:
        if bool(self.suffixes) != bool(self.parse) or bool(self.folder) != bool(self.read_folder):
            raise TracecalError(
                f"source {self.name!r}: a file source needs both suffixes and parse, a folder source both "
                "folder and read_folder"
            )
        if not self.parse and not self.folder:
            raise TracecalError(
                f"source {self.name!r} reads nothing: give suffixes and parse, or folder and read_folder"
            )

    def reads_file(self, path: Path) -> bool:
        """Whether ``path`` is one of this source's rank files, by its name."""
        name = path.name.lower()
        return bool(self.suffixes) and name.endswith(self.suffixes) and name not in self.not_rank_files

    def run_name(self, path: Path) -> str:
        """The default id of a run that is the one rank file ``path``: its name without the longest of
        ``suffixes`` it ends in, then without a ``run_name_endings`` ending (compared in lower case)."""
        name = path.name
        for endings in (self.suffixes, self.run_name_endings):
            ending = max((e for e in endings if name.lower().endswith(e)), key=len, default="")
            name = name[: len(name) - len(ending)]
        return name or path.name

    def is_shadowed(self, path: Path, names_beside: set[str]) -> bool:
        """Whether ``path`` is left out because another file beside it holds the same rank
        (``names_beside``: lower-case names of the files in its directory)."""
        name = path.name.lower()
        for ending, others in self.shadowed_by:
            if name.endswith(ending) and any(name[: -len(ending)] + o in names_beside for o in others):
                return True
        return False

    def run_folder(self, path: Path) -> Path | None:
        """The folder this source reads a run at ``path`` from, or None (not one of its runs)."""
        return load(self.folder)(path) if self.folder else None

    def stored_run_folder(self, stored_path: Path) -> Path | None:
        """Where a stored run of this source is read again (``runs.source_path``): the run folder for a
        folder source, else the stored path itself; None when it is no longer there."""
        folder = self.run_folder(stored_path) if self.folder else stored_path
        return folder if folder is not None and folder.exists() else None

    @property
    def file_patterns(self) -> tuple[str, ...]:
        return self.patterns or tuple(f"*{s}" for s in self.suffixes)


def load(reference: str) -> Callable[..., Any]:
    """The object a ``"module:attribute"`` reference names.

    Raises:
        TracecalError: the module or the attribute does not exist.
    """
    module_name, _, attribute = reference.partition(":")
    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise TracecalError(
            f"source reader {reference!r} cannot be loaded ({exc}); reinstall the package that provides it"
        ) from exc
    return value


@cache
def registered() -> tuple[Source, ...]:
    """Every source: the built-in ones, then those outside packages register (entry-point group
    ``tracecal.sources``), each name once (a built-in name cannot be taken over).

    Raises:
        TracecalError: an entry point does not name a ``Source``.
    """
    sources: dict[str, Source] = {}
    references = [*BUILT_IN, *(ep.value for ep in entry_points(group=ENTRY_POINT_GROUP))]
    for reference in references:
        source = load(reference)
        if not isinstance(source, Source):
            raise TracecalError(f"entry point {reference!r} of {ENTRY_POINT_GROUP} is not a tracecal Source")
        sources.setdefault(source.name, source)
    return tuple(sources.values())


def source_named(name: str) -> Source:
    """The source of format ``name``.

    Raises:
        TracecalError: no source has that name.
    """
    found = next((s for s in registered() if s.name == name), None)
    if found is None:
        known = ", ".join(s.name for s in registered())
        raise TracecalError(f"no source reads format {name!r} (registered: {known})")
    return found


def source_of_file(path: Path) -> Source | None:
    """The first file source that reads ``path`` (by its name), or None."""
    return next((s for s in registered() if s.reads_file(path)), None)


def rank_file_patterns() -> tuple[str, ...]:
    """Every file source's patterns, for a message that says what was looked for."""
    return tuple(p for s in registered() for p in s.file_patterns)


def relayout_formats() -> list[str]:
    """The formats whose runs can be rebuilt at another parallel layout (``Source.relayout``)."""
    return [s.name for s in registered() if s.relayout]


def parser_modules() -> list[str]:
    """The modules of the file sources' parsers (a worker process imports them once, ahead of the files)."""
    return [s.parse.partition(":")[0] for s in registered() if s.parse]
