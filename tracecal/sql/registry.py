"""Every ``.sql`` file tracecal ships, read in one place: the table DDL (``tables/``, generated from
``tracecal.schema``), the table macros the views share (``macros/``), the views (``views/``) and the
named queries (``queries/``). No other module knows where these files live (a test checks it).

A view is one file, ``views/<name>.sql``: a header of ``--`` comment lines, then its query (a
``SELECT`` or ``WITH``; the file runs as it is with ``tracecal sql --file``). The header declares
everything else about the view, once::

    -- <summary: what the view answers; stored as the view's comment, may wrap over lines>
    --
    -- <optional paragraphs: how it is computed; shown in docs/views.md>
    --
    -- depends on: <tables, macros and other views the query reads, comma-separated>
    --
    -- columns:
    --   <column>: <its comment, stored as the column's comment>
    --     <a comment continues on lines indented further>

``view_definitions()`` parses them all and returns them in dependency order (a view after every view
it depends on; ``graphlib`` sorts them), or raises ``SqlRegistryError`` naming the file and the fault:
a header line out of place, a dependency that is no table, macro or view, a cycle of views.
``View.create_statement`` and ``View.comment_statements`` give the DDL that creates a view and stores
its comments; ``tracecal.sql.connection.create_views`` runs them and refuses a view whose columns
differ from its header's (a column without a comment). ``docs/views.md`` is generated from the same definitions
(``python -m tracecal.sql.view_docs``).
"""

from __future__ import annotations

import graphlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tracecal.errors import SchemaError
from tracecal.schema import TABLES, TABLES_DIR

SQL_DIR = Path(__file__).parent
VIEWS_DIR = SQL_DIR / "views"
MACROS_DIR = SQL_DIR / "macros"
QUERIES_DIR = SQL_DIR / "queries"

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")
_COLUMN_ENTRY = re.compile(r"^  ([a-z_][a-z0-9_]*): (\S.*)$")
_CONTINUATION = re.compile(r"^ {4,}(\S.*)$")


class SqlRegistryError(SchemaError):
    """A shipped ``.sql`` file is malformed: a view header that does not parse, a dependency that
    does not exist, views that depend on each other in a cycle, or a view whose columns differ from
    the ones its header comments."""


@dataclass(frozen=True)
class ViewColumn:
    """One output column of a view and its comment."""

    name: str
    comment: str


@dataclass(frozen=True)
class View:
    """One view: its name (the file's), what it answers, how it works, what it reads, its columns
    with their comments, and its query."""

    name: str
    summary: str
    """What the view answers, in one sentence: the view's stored comment."""
    description: tuple[str, ...]
    """Paragraphs on how it is computed (docs/views.md only)."""
    depends_on: tuple[str, ...]
    """The tables, macros and views its query reads, as declared."""
    columns: tuple[ViewColumn, ...]
    query: str
    path: Path

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def create_statement(self, *, temporary: bool = False) -> str:
        """``CREATE OR REPLACE [TEMP] VIEW`` with the query (a TEMP view is allowed on a read-only
        connection)."""
        return f"CREATE OR REPLACE {'TEMP VIEW' if temporary else 'VIEW'} {self.name} AS\n{self.query}"

    def comment_statements(self) -> str:
        """``COMMENT ON`` the view (its summary) and on each column."""
        lines = [f"COMMENT ON VIEW {self.name} IS {sql_string(self.summary)};"]
        lines.extend(f"COMMENT ON COLUMN {self.name}.{c.name} IS {sql_string(c.comment)};" for c in self.columns)
        return "\n".join(lines)


@dataclass(frozen=True)
class Macro:
    """One table macro the views share: ``macros/<name>.sql`` holds ``CREATE OR REPLACE MACRO <name>``
    after a comment header saying what it computes."""

    name: str
    summary: str
    """The header's first line, less the name (docs/views.md)."""
    text: str
    path: Path

    def statements(self, *, temporary: bool = False) -> str:
        if not temporary:
            return self.text
        return self.text.replace("CREATE OR REPLACE MACRO", "CREATE OR REPLACE TEMP MACRO", 1)


def sql_string(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


@cache
def query_text(name: str) -> str:
    """The text of ``queries/<name>.sql`` (``name`` without the suffix), read once per process.

    Raises:
        KeyError: there is no such query file (a programming error: the names are fixed in code).
    """
    path = QUERIES_DIR / f"{name}.sql"
    if not path.is_file():
        raise KeyError(f"no query {name!r} in {QUERIES_DIR} (known: {', '.join(query_names())})")
    return path.read_text()


def query_names() -> list[str]:
    """The names of every named query (``queries/*.sql``)."""
    return sorted(p.stem for p in QUERIES_DIR.glob("*.sql"))


def table_ddl_files() -> list[Path]:
    """The generated table DDL files, in creation order (``tracecal.schema.TABLES``'s)."""
    return [TABLES_DIR / f"{t.name}.sql" for t in TABLES]


@cache
def table_ddl() -> tuple[str, ...]:
    """The ``CREATE TABLE`` and ``COMMENT ON`` statements of every table, in creation order."""
    return tuple(path.read_text() for path in table_ddl_files())


def macro_files() -> list[Path]:
    return sorted(MACROS_DIR.glob("*.sql"))


def view_files() -> list[Path]:
    return sorted(VIEWS_DIR.glob("*.sql"))


def view_names() -> list[str]:
    """Every view's name, without parsing the files (what a check of a database's catalog needs)."""
    return [p.stem for p in view_files()]


def sql_files() -> list[Path]:
    """Every file that makes a database's schema: table DDL, macros, views (the fingerprint's input)."""
    return [*table_ddl_files(), *macro_files(), *view_files()]


@cache
def macro_definitions() -> tuple[Macro, ...]:
    """Every table macro, by name."""
    return tuple(parse_macro(path.stem, path.read_text(), path) for path in macro_files())


@cache
def view_definitions() -> tuple[View, ...]:
    """Every view, in dependency order (see ``dependency_order``).

    Raises:
        SqlRegistryError: a view file does not parse, names a dependency that does not exist, or
            views depend on each other in a cycle.
    """
    views = [parse_view(path.stem, path.read_text(), path) for path in view_files()]
    known = {t.name for t in TABLES} | {m.name for m in macro_definitions()}
    return dependency_order(views, known)


def parse_macro(name: str, text: str, path: Path) -> Macro:
    """A macro file: comment lines (the first sentence is its summary), then its ``CREATE``."""
    if f"CREATE OR REPLACE MACRO {name}(" not in text:
        raise SqlRegistryError(f"{path}: expected `CREATE OR REPLACE MACRO {name}(...)`, named as the file")
    first = next((line[2:].strip() for line in text.splitlines() if line.startswith("--")), "")
    summary = first.removeprefix(f"{name}:").strip()
    return Macro(name=name, summary=summary, text=text, path=path)


def parse_view(name: str, text: str, path: Path) -> View:
    """One view file (the format is in this module's docstring).

    Raises:
        SqlRegistryError: the header is out of shape (the message names the file and line).
    """
    if not _IDENTIFIER.fullmatch(name):
        raise SqlRegistryError(f"{path}: a view's file name must be a lower-case SQL identifier")
    lines = text.splitlines()
    header: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        if not line.startswith("--"):
            break
        if line != "--" and not line.startswith("-- "):
            raise SqlRegistryError(f"{path}:{number}: header lines start with '-- ' (or are '--' alone)")
        header.append((number, line[3:]))
    query = "\n".join(lines[len(header) :]).strip().rstrip(";").rstrip()
    if not re.match(r"(SELECT|WITH)\b", query, flags=re.IGNORECASE):
        raise SqlRegistryError(f"{path}: after the header comes the view's query (SELECT or WITH ...)")
    if ";" in _without_strings_and_comments(query):
        raise SqlRegistryError(f"{path}: a view file holds one query; the statements are made from the header")

    def fail(number: int, what: str) -> SqlRegistryError:
        return SqlRegistryError(f"{path}:{number}: {what} (the header's format: tracecal/sql/registry.py)")

    paragraphs = _paragraphs(header)
    if not paragraphs or paragraphs[0][1][0].startswith(("depends on:", "columns:")):
        raise fail(header[0][0] if header else 1, "the header starts with a summary of what the view answers")
    summary = " ".join(line.strip() for line in paragraphs[0][1])
    description: list[str] = []
    depends_on: tuple[str, ...] | None = None
    columns: list[ViewColumn] | None = None
    for number, paragraph in paragraphs[1:]:
        first = paragraph[0]
        if first.startswith("depends on:"):
            if depends_on is not None or columns is not None:
                raise fail(number, "one `depends on:` line, before `columns:`")
            if len(paragraph) > 1:
                raise fail(number + 1, "`depends on:` takes one line; a blank line must follow it")
            names = [n.strip() for n in first.removeprefix("depends on:").split(",")]
            bad = [n for n in names if not _IDENTIFIER.fullmatch(n)]
            if bad:
                raise fail(number, f"`depends on:` lists names of tables, macros and views, comma-separated: {bad}")
            depends_on = tuple(names)
        elif first == "columns:":
            if columns is not None:
                raise fail(number, "one `columns:` block")
            columns = _columns(paragraph[1:], number, fail)
        elif depends_on is not None or columns is not None:
            raise fail(number, "description paragraphs come before `depends on:` and `columns:`")
        else:
            description.append(" ".join(line.strip() for line in paragraph))
    if depends_on is None:
        raise fail(header[-1][0], "no `depends on:` line: name the tables, macros and views the query reads")
    if columns is None:
        raise fail(header[-1][0], "no `columns:` block: every column of the view needs its comment")
    return View(
        name=name,
        summary=summary,
        description=tuple(description),
        depends_on=depends_on,
        columns=tuple(columns),
        query=query,
        path=path,
    )


def _paragraphs(header: list[tuple[int, str]]) -> list[tuple[int, list[str]]]:
    """The header's blank-line separated paragraphs, each with the line number it starts at. Lines
    of a paragraph keep their indentation except the first's (the column entries need it)."""
    found: list[tuple[int, list[str]]] = []
    current: list[str] = []
    for number, line in header:
        if not line.strip():
            current = []
            continue
        if not current:
            found.append((number, current))
        current.append(line)
    return found


def _columns(lines: Sequence[str], number: int, fail: Callable[[int, str], SqlRegistryError]) -> list[ViewColumn]:
    """The ``columns:`` block's entries (``number``: the block's first line)."""
    names: list[str] = []
    comments: list[list[str]] = []
    for offset, line in enumerate(lines, start=1):
        entry = _COLUMN_ENTRY.match(line)
        more = _CONTINUATION.match(line)
        if entry:
            if entry.group(1) in names:
                raise fail(number + offset, f"column {entry.group(1)} is listed twice")
            names.append(entry.group(1))
            comments.append([entry.group(2).strip()])
        elif more and names:
            comments[-1].append(more.group(1).strip())
        else:
            raise fail(number + offset, "a column entry is '--   name: comment', continued on lines indented 4+")
    if not names:
        raise fail(number, "`columns:` lists no column")
    return [ViewColumn(name, " ".join(parts)) for name, parts in zip(names, comments, strict=True)]


def _without_strings_and_comments(query: str) -> str:
    """The query with its string literals and ``--`` comments blanked (to look for a statement end)."""
    return re.sub(r"'(?:[^']|'')*'|--[^\n]*", "''", query)


def dependency_order(views: Iterable[View], known: Iterable[str]) -> tuple[View, ...]:
    """``views`` ordered so that each comes after every view it depends on; among views free to go,
    by name (one order for one set of files).

    ``known``: the other names a view may depend on (tables and macros, created before any view).

    Raises:
        SqlRegistryError: a view depends on a name that is no known table, macro or view, or views
            depend on each other in a cycle (the message names it: ``a -> b -> a``).
    """
    by_name = {v.name: v for v in views}
    others = set(known)
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for view in by_name.values():
        missing = [d for d in view.depends_on if d not in by_name and d not in others]
        if missing:
            raise SqlRegistryError(
                f"{view.path}: view {view.name} depends on {', '.join(missing)}, which is no table, macro or view "
                "of tracecal; fix its `depends on:` line or add the missing view"
            )
        sorter.add(view.name, *(d for d in view.depends_on if d in by_name))
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        cycle = list(reversed(exc.args[1]))  # graphlib lists each node before the ones that depend on it
        raise SqlRegistryError(
            f"views depend on each other in a cycle ({' -> '.join(cycle)}, each depending on the next); "
            "a view cannot read itself, directly or through other views: fix their `depends on:` lines"
        ) from exc
    ordered: list[View] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        ordered.extend(by_name[name] for name in ready)
        sorter.done(*ready)
    return tuple(ordered)
